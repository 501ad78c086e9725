package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/idemledger/idemledger/lab/bench"
	"github.com/idemledger/idemledger/lab/growth"
)

// goal is one of the performance targets (issue 34, docs/performance.md)
// that a run's results can be held against: at a point, a value read from
// a target's result and its base's, and the bound it must keep.
type goal struct {
	what         string                                     // the goal, as the table says it
	target       func(name string) bool                     // the targets it holds for
	base         func(name string) bool                     // what they are measured against; nil: themselves
	workloads    []string                                   // the targets' workloads it holds for
	baseWorkload string                                     // the base's workload; "": the target's
	clients      map[int]float64                            // the bound at each number of clients it holds at; at 0, at every number
	value        func(r, base bench.Result) (float64, bool) // false: not measurable
	atMost       bool                                       // the value must stay under the bound, not over it
	format       string                                     // of the value and of the bound
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

// bound is g's bound at c clients, if g holds there.
func (g goal) bound(c int) (float64, bool) {
	if b, ok := g.clients[0]; ok {
		return b, true
	}
	b, ok := g.clients[c]
	return b, ok
}

// growthSteps are the steps of a growth run held against its empty
// store's.
var growthSteps = []string{growth.FirstHalf, growth.SecondHalf, growth.AfterSweep}

// goals are the targets ledgerbench measures, each in the runs that
// measure its targets.
var goals = []goal{
	{what: "pairs/s over durable Redis's", target: prefixed("ledgerd/embedded"), base: named(durableRedis), workloads: []string{"fresh"},
		clients: map[int]float64{1: 1, 8: 1, 32: 1, 128: 1}, value: throughput, format: "%.2f"},
	{what: "CPU a pair ≤ 2× Redis's client and server", target: prefixed("ledgerd/embedded"), base: named(durableRedis), workloads: []string{"fresh"},
		clients: map[int]float64{32: 2, 128: 2}, atMost: true, format: "%.2f",
		value: func(r, base bench.Result) (float64, bool) {
			c := base.CPUus + base.DBCPUus
			return (r.CPUus + r.DBCPUus) / c, c > 0
		}},
	{what: "pairs/s over direct SQL's", target: prefixed("ledgerd/postgres"), base: prefixed("sql/postgres"), workloads: []string{"fresh"},
		clients: map[int]float64{1: 0.7, 8: 1, 32: 2}, value: throughput, format: "%.2f"},
	{what: "256 KiB outcomes: pairs/s over direct SQL's", target: prefixed("ledgerd/postgres"), base: prefixed("sql/postgres"), workloads: []string{largeOutcome},
		clients: map[int]float64{8: 0.9, 32: 0.9}, value: throughput, format: "%.2f"},
	{what: "a protected write's p50 over an unprotected one's, ms", target: prefixed("rpc/protected"), base: named("rpc/unprotected"), workloads: []string{"write"},
		clients: map[int]float64{1: 1}, atMost: true, format: "%+.2f",
		value: func(r, base bench.Result) (float64, bool) { return r.P50ms - base.P50ms, r.P50ms > 0 && base.P50ms > 0 }},
	{what: "p99 ÷ p50", target: prefixed("ledgerd/embedded"), workloads: []string{"fresh"},
		clients: map[int]float64{32: 3}, atMost: true, format: "%.2f",
		value: func(r, _ bench.Result) (float64, bool) { return r.P99ms / r.P50ms, r.P50ms > 0 }},
	{what: "10,000 Lookup waiters on a Stream: MiB above idle", target: named(bench.WaitersTarget("stream")), workloads: []string{bench.WaitersWorkload},
		clients: map[int]float64{10000: 50}, atMost: true, format: "%.1f",
		value: func(r, _ bench.Result) (float64, bool) { return r.RSSAboveIdleMB, r.Ops > 0 }},
	{what: "growth: pairs/s over the empty store's, at the same load", target: prefixed(growth.Prefix), workloads: growthSteps, baseWorkload: growth.Empty,
		clients: map[int]float64{0: 0.8}, value: throughput, format: "%.2f"},
	{what: "during the sweep: pairs/s over the step before's", target: prefixed(growth.Prefix), workloads: []string{growth.Sweeping}, baseWorkload: growth.SecondHalf,
		clients: map[int]float64{0: 0.8}, value: throughput, format: "%.2f"},
	{what: "during the sweep: p99 over the step before's", target: prefixed(growth.Prefix), workloads: []string{growth.Sweeping}, baseWorkload: growth.SecondHalf,
		clients: map[int]float64{0: 2}, atMost: true, format: "%.2f",
		value: func(r, base bench.Result) (float64, bool) { return r.P99ms / base.P99ms, base.P99ms > 0 }},
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
			bound, ok := g.bound(r.Clients)
			if !ok || !slices.Contains(g.workloads, r.Workload) || !g.target(r.Target) {
				continue
			}
			baseWorkload := cmp.Or(g.baseWorkload, r.Workload)
			for _, base := range rs {
				if base.Workload != baseWorkload || base.Clients != r.Clients ||
					g.base == nil && base.Target != r.Target || g.base != nil && !g.base(base.Target) {
					continue
				}
				v, ok := g.value(r, base)
				if !ok {
					continue
				}
				against, met := base.Target, "yes"
				switch {
				case g.base == nil && g.baseWorkload != "":
					against = "its " + base.Workload + " step"
				case g.base == nil:
					against = "–"
				}
				if g.atMost && v > bound || !g.atMost && v < bound {
					met = "no"
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | "+shown(g.format, v, bound)+" | %s "+g.format+" | %s |\n",
					g.what, r.Target, against, r.Workload, r.Clients, v, op, bound, met)
			}
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n| goal | target | against | workload | clients | value | bound | met |\n|---|---|---|---|---:|---:|---:|---|\n" + b.String()
}

// shown is the format that shows v beside bound: format, or with a digit
// more where format would show a value that missed its bound as the bound.
func shown(format string, v, bound float64) string {
	if v == bound || fmt.Sprintf(format, v) != fmt.Sprintf(format, bound) {
		return format
	}
	i := strings.LastIndex(format, ".")
	if i < 0 || i+2 >= len(format) || format[i+1] < '0' || format[i+1] > '8' {
		return format
	}
	return format[:i+1] + string(format[i+1]+1) + format[i+2:]
}
