package main

import (
	"fmt"
	"strings"

	"github.com/idemledger/idemledger/lab/bench"
)

// goal is one of the performance targets (issue 34, docs/performance.md)
// that a run's results can be held against: at a point, a value read from
// a target's result and its base's, and the bound it must keep.
type goal struct {
	what     string                                     // the goal, as the table says it
	target   func(name string) bool                     // the targets it holds for
	base     func(name string) bool                     // what they are measured against; nil: themselves
	workload string                                     // the workload of both
	clients  map[int]float64                            // the bound at each point it holds at
	value    func(r, base bench.Result) (float64, bool) // false: not measurable
	atMost   bool                                       // the value must stay under the bound, not over it
	format   string                                     // of the value and of the bound
}

// durableRedis is the Redis the embedded store is held against.
const durableRedis = redisPrefix + "always"

// largeOutcome is the workload of the large outcomes' goal.
const largeOutcome = "fresh@262144"

func prefixed(p string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, p) }
}

func named(n string) func(string) bool { return func(s string) bool { return s == n } }

// throughput is r's pairs a second over base's.
func throughput(r, base bench.Result) (float64, bool) {
	return r.PerSecond / base.PerSecond, base.PerSecond > 0
}

// goals are the targets ledgerbench can measure; growth's and the Lookup
// waiters' have benchmarks of their own (growbench, LookupWaitersRSS).
var goals = []goal{
	{what: "pairs/s over durable Redis's", target: prefixed("ledgerd/embedded"), base: named(durableRedis), workload: "fresh",
		clients: map[int]float64{1: 1, 8: 1, 32: 1, 128: 1}, value: throughput, format: "%.2f"},
	{what: "CPU a pair ≤ 2× Redis's client and server", target: prefixed("ledgerd/embedded"), base: named(durableRedis), workload: "fresh",
		clients: map[int]float64{32: 2, 128: 2}, atMost: true, format: "%.2f",
		value: func(r, base bench.Result) (float64, bool) {
			c := base.CPUus + base.DBCPUus
			return (r.CPUus + r.DBCPUus) / c, c > 0
		}},
	{what: "pairs/s over direct SQL's", target: prefixed("ledgerd/postgres"), base: prefixed("sql/postgres"), workload: "fresh",
		clients: map[int]float64{1: 0.7, 8: 1, 32: 2}, value: throughput, format: "%.2f"},
	{what: "256 KiB outcomes: pairs/s over direct SQL's", target: prefixed("ledgerd/postgres"), base: prefixed("sql/postgres"), workload: largeOutcome,
		clients: map[int]float64{8: 0.9, 32: 0.9}, value: throughput, format: "%.2f"},
	{what: "a protected write's p50 over an unprotected one's, ms", target: prefixed("rpc/protected"), base: named("rpc/unprotected"), workload: "write",
		clients: map[int]float64{1: 1}, atMost: true, format: "%+.2f",
		value: func(r, base bench.Result) (float64, bool) { return r.P50ms - base.P50ms, r.P50ms > 0 && base.P50ms > 0 }},
	{what: "p99 ÷ p50", target: prefixed("ledgerd/embedded"), workload: "fresh",
		clients: map[int]float64{32: 3}, atMost: true, format: "%.2f",
		value: func(r, _ bench.Result) (float64, bool) { return r.P99ms / r.P50ms, r.P50ms > 0 }},
}

// goalsTable writes each goal a run's results measured, at each of its
// points: the value, the bound and whether it was kept. Empty when the run
// measured none.
func goalsTable(rs []bench.Result) string {
	var b strings.Builder
	for _, g := range goals {
		op := "≥"
		if g.atMost {
			op = "≤"
		}
		for _, r := range rs {
			bound, ok := g.clients[r.Clients]
			if !ok || r.Workload != g.workload || !g.target(r.Target) {
				continue
			}
			for _, base := range rs {
				if base.Workload != r.Workload || base.Clients != r.Clients ||
					g.base == nil && base.Target != r.Target || g.base != nil && !g.base(base.Target) {
					continue
				}
				v, ok := g.value(r, base)
				if !ok {
					continue
				}
				against, met := base.Target, "yes"
				if g.base == nil {
					against = "–"
				}
				if g.atMost && v > bound || !g.atMost && v < bound {
					met = "no"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | "+g.format+" | %s "+g.format+" | %s |\n",
					g.what, r.Target, against, r.Workload, r.Clients, v, op, bound, met)
			}
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n| goal | target | against | workload | clients | value | bound | met |\n|---|---|---|---|---:|---:|---:|---|\n" + b.String()
}
