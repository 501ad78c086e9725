// Package bench measures the ledger: throughput, latency percentiles and
// CPU per operation of a workload at a number of concurrent clients, for
// ledgerd over gRPC, for the same SQL sent straight through pgx, and for a
// write RPC with and without the idempotency interceptor. lab/cmd/ledgerbench
// drives it.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idemledger/idemledger/ledger/crdb"
)

// Op is one operation of a workload, run by client c; n is unique in the
// process, so keys made from it are fresh.
type Op func(ctx context.Context, c int, n int64) error

// seq makes every n passed to an Op unique.
var seq atomic.Int64

// Result is one measurement.
type Result struct {
	Target     string  `json:"target"`   // what served the work, e.g. "ledgerd/postgres"
	Workload   string  `json:"workload"` // fresh, replay, hot, write
	Clients    int     `json:"clients"`
	Ops        int64   `json:"ops"`
	Errors     int64   `json:"errors"`
	Seconds    float64 `json:"seconds"`
	PerSecond  float64 `json:"per_second"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	P999ms     float64 `json:"p999_ms"`
	CPUus      float64 `json:"cpu_us_per_op"`    // this process, user+system
	DBCPUus    float64 `json:"db_cpu_us_per_op"` // every other process: the database, on a quiet machine
	AllocKB    float64 `json:"alloc_kb_per_op"`  // heap this process allocated, in KiB
	GCs        float64 `json:"gcs_per_kop"`      // garbage collections per 1,000 operations
	FirstError string  `json:"first_error,omitempty"`

	// On a batching SQL store, over the point's run (its warm-up
	// included): the mean calls per batch, and the mean number of batches
	// in flight.
	BatchCalls float64 `json:"batch_calls,omitempty"`
	BatchBusy  float64 `json:"batch_busy,omitempty"`
	// The round trip to the database the store measured last, when it
	// sets its batches in flight from it.
	RoundTripMs float64 `json:"round_trip_ms,omitempty"`

	// On the embedded store, over the measured turns: its write-ahead
	// log's syncs an operation, the mean time of a sync, and the share of
	// the turns' time the log spent syncing. The log syncs once at a time,
	// for every write waiting then: at a share near 1 each write waits for
	// the sync in progress and then its own.
	LogSyncs  float64 `json:"log_syncs_per_op,omitempty"`
	LogSyncMs float64 `json:"log_sync_ms,omitempty"`
	LogBusy   float64 `json:"log_busy,omitempty"`
	// LogError says why the log's syncs are not given, when reading them
	// failed (a ledgerd process's metrics).
	LogError string `json:"log_error,omitempty"`
	// Where the subject counted them, the fdatasync system calls of the
	// process behind the target an operation (a store in this process, a
	// Redis in its own), over the measured turns: nil when not counted,
	// and CountError says why when counting failed.
	Fdatasyncs *float64 `json:"fdatasyncs_per_op,omitempty"`
	CountError string   `json:"count_error,omitempty"`

	// Of Waiters: what the Lookups waiting added to ledgerd's resident
	// memory, in MiB.
	RSSAboveIdleMB float64 `json:"rss_above_idle_mb,omitempty"`
}

// Subject is one thing Interleave measures: a target and its operation.
type Subject struct {
	Target string
	Op     Op
	// Batches, when not nil, reads the batch counters of the store behind
	// the target, for Result.BatchCalls and BatchBusy.
	Batches func() crdb.BatchStats
	// LogSyncs, when not nil, reads the syncs of the write-ahead log of
	// the store behind the target since it opened, and the time they took,
	// for Result.LogSyncs, LogSyncMs and LogBusy.
	LogSyncs func() (syncs uint64, took time.Duration, err error)
	// Fdatasyncs, when not nil, counts the fdatasync system calls of the
	// process behind the target over each measured turn, for
	// Result.Fdatasyncs.
	Fdatasyncs FdatasyncCount
	// Procs, when above 0, is GOMAXPROCS during the target's turns: the
	// cores of a service sized to fewer than the machine has (the clients
	// of an in-process service run under the same limit).
	Procs int
}

// Interleave measures subjects in turns, for d each in all: in each of
// rounds rounds every subject runs for d/rounds, after a warm-up of a fifth
// of that. The machine's speed drifts during a run (here direct SQL at 8
// clients ran anywhere from 4,700 to 8,000 pairs/s within an hour), so two
// targets measured one after the other can differ by the drift alone;
// measured in turns, the drift slows them alike and their ratio holds.
func Interleave(ctx context.Context, workload string, clients int, d time.Duration, rounds int, subjects ...Subject) []Result {
	rounds = max(rounds, 1)
	turn := d / time.Duration(rounds)
	ms := make([]meter, len(subjects))
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)
	for range rounds {
		for i, sub := range subjects {
			if sub.Procs > 0 {
				runtime.GOMAXPROCS(sub.Procs)
			} else {
				runtime.GOMAXPROCS(procs)
			}
			var before crdb.BatchStats
			if sub.Batches != nil {
				before = sub.Batches()
			}
			start := time.Now()
			run(ctx, clients, turn/5, sub.Op, nil)
			var syncs0 uint64
			var took0 time.Duration
			var logErr error
			if sub.LogSyncs != nil {
				syncs0, took0, logErr = sub.LogSyncs()
			}
			var count func() (uint64, error)
			if sub.Fdatasyncs != nil {
				var err error
				if count, err = sub.Fdatasyncs(); err != nil {
					ms[i].countFailed(err)
				}
			}
			ms[i].turn(ctx, clients, turn, sub.Op)
			if count != nil {
				n, err := count()
				ms[i].fdatasyncs += n
				ms[i].counted = true
				if err != nil {
					ms[i].countFailed(err)
				}
			}
			if sub.LogSyncs != nil {
				syncs, took, err := sub.LogSyncs()
				if err = cmp.Or(logErr, err); err != nil {
					ms[i].logFailed(err)
				} else {
					ms[i].syncs += syncs - syncs0
					ms[i].syncTime += took - took0
					ms[i].logged = true
				}
			}
			if sub.Batches != nil {
				after := sub.Batches()
				ms[i].batches += after.Batches - before.Batches
				ms[i].calls += after.Calls - before.Calls
				ms[i].busy += after.Busy - before.Busy
				ms[i].batchTime += time.Since(start)
				ms[i].roundTrip = after.RoundTrip
			}
		}
	}
	rs := make([]Result, len(subjects))
	for i, sub := range subjects {
		rs[i] = ms[i].result(sub.Target, workload, clients)
	}
	return rs
}

// meter sums a subject's turns.
type meter struct {
	lat             []time.Duration
	ops, errs       int64
	first           string
	secs            float64
	cpu, other      time.Duration
	alloc, gcs      uint64
	batches, calls  uint64
	busy, batchTime time.Duration // batchTime: the turns' time, warm-ups included
	roundTrip       time.Duration
	logged          bool   // the store's log syncs were read
	logErr          string // the first turn whose log syncs could not be read: why
	syncs           uint64
	syncTime        time.Duration
	counted         bool   // fdatasyncs were counted in a turn
	fdatasyncs      uint64 // over the turns counted
	countErr        string // the first turn whose count failed: why
}

// countFailed records that counting a turn's fdatasyncs failed: the
// subject's count is then not given, and the first failure says why.
func (m *meter) countFailed(err error) {
	if m.countErr == "" {
		m.countErr = err.Error()
	}
}

// logFailed records that reading a turn's log syncs failed: the
// subject's log syncs are then not given, and the first failure says why.
func (m *meter) logFailed(err error) {
	if m.logErr == "" {
		m.logErr = err.Error()
	}
}

// turn measures op for d.
func (m *meter) turn(ctx context.Context, clients int, d time.Duration, op Op) {
	cpu0, all0 := cpuTime(), machineCPUTime()
	alloc0, gcs0 := heapStats()
	start := time.Now()
	ops, errs, first := run(ctx, clients, d, op, &m.lat)
	m.secs += time.Since(start).Seconds()
	cpu := cpuTime() - cpu0
	alloc, gcs := heapStats()
	m.alloc += alloc - alloc0
	m.gcs += gcs - gcs0
	m.cpu += cpu
	m.other += max(machineCPUTime()-all0-cpu, 0)
	m.ops += ops
	m.errs += errs
	if m.first == "" {
		m.first = first
	}
}

func (m *meter) result(target, workload string, clients int) Result {
	slices.Sort(m.lat)
	r := Result{Target: target, Workload: workload, Clients: clients, Ops: m.ops, Errors: m.errs, Seconds: m.secs, FirstError: m.first}
	if m.ops > 0 {
		r.PerSecond = float64(m.ops) / m.secs
		r.P50ms, r.P99ms, r.P999ms = ms(pct(m.lat, 0.50)), ms(pct(m.lat, 0.99)), ms(pct(m.lat, 0.999))
		r.CPUus = float64(m.cpu.Microseconds()) / float64(m.ops)
		r.DBCPUus = float64(m.other.Microseconds()) / float64(m.ops)
		r.AllocKB = float64(m.alloc) / 1024 / float64(m.ops)
		r.GCs = float64(m.gcs) * 1000 / float64(m.ops)
	}
	if m.logErr != "" {
		r.LogError = m.logErr
	} else if m.logged && m.ops > 0 && m.secs > 0 {
		r.LogSyncs = float64(m.syncs) / float64(m.ops)
		r.LogBusy = m.syncTime.Seconds() / m.secs
		if m.syncs > 0 {
			r.LogSyncMs = ms(m.syncTime / time.Duration(m.syncs))
		}
	}
	if m.countErr != "" {
		r.CountError = m.countErr
	} else if m.counted && m.ops > 0 {
		per := float64(m.fdatasyncs) / float64(m.ops)
		r.Fdatasyncs = &per
	}
	if m.batches > 0 {
		r.BatchCalls = float64(m.calls) / float64(m.batches)
		r.BatchBusy = m.busy.Seconds() / m.batchTime.Seconds()
		r.RoundTripMs = ms(m.roundTrip)
	}
	return r
}

// run runs op from clients goroutines for d, and appends the latencies of
// the operations that succeeded to lat when it is not nil.
func run(ctx context.Context, clients int, d time.Duration, op Op, lat *[]time.Duration) (ops, errs int64, first string) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	// A result counts if it came before the deadline's last millisecond.
	// The end is the context's own deadline, not a second reading of the
	// clock: a goroutine descheduled between the two would count the
	// instant DeadlineExceeded of every call made past the deadline and
	// before the context's timer, late on a loaded machine, ends it.
	deadline, _ := ctx.Deadline()
	end := deadline.Add(-time.Millisecond)
	var mu sync.Mutex
	var firstErr atomic.Value
	var wg sync.WaitGroup
	var nOps, nErrs atomic.Int64
	for c := range clients {
		wg.Go(func() {
			local := make([]time.Duration, 0, 4096)
			for ctx.Err() == nil {
				start := time.Now()
				err := op(ctx, c, seq.Add(1))
				if ctx.Err() != nil || time.Now().After(end) {
					break // the deadline may have cut the call short: not a result
				}
				if err != nil {
					nErrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				nOps.Add(1)
				if lat != nil {
					local = append(local, time.Since(start))
				}
			}
			if lat != nil {
				mu.Lock()
				*lat = append(*lat, local...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if v := firstErr.Load(); v != nil {
		first = v.(string)
	}
	return nOps.Load(), nErrs.Load(), first
}

func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapStats is what this process allocated on the heap, in bytes, and the
// garbage collections it ran, since it started.
func heapStats() (alloc, gcs uint64) {
	ss := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(ss)
	return ss[0].Value.Uint64(), ss[1].Value.Uint64()
}

// machineCPUTime is the CPU time the whole machine spent (user, nice,
// system, irq, softirq, steal), from /proc/stat. Its growth minus this
// process's is what the other processes (the database) spent.
func machineCPUTime() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += v
	}
	return time.Duration(ticks) * (time.Second / 100) // USER_HZ
}

// Markdown writes results as a table; Waiters' results, which time no
// operation, are WaitersTable's.
func Markdown(rs []Result) string {
	var b strings.Builder
	b.WriteString("| target | workload | clients | ops/s | p50 ms | p99 ms | p99.9 ms | CPU µs/op | DB CPU µs/op | alloc KiB/op | GCs/kop | errors |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		if r.Workload == WaitersWorkload {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %.0f | %.2f | %.2f | %.2f | %.0f | %.0f | %.1f | %.1f | %d |\n",
			r.Target, r.Workload, r.Clients, r.PerSecond, r.P50ms, r.P99ms, r.P999ms, r.CPUus, r.DBCPUus, r.AllocKB, r.GCs, r.Errors)
	}
	return b.String()
}

// Syncs writes, for each result with its fdatasyncs counted or its
// store's log syncs read, the fdatasync calls an operation, the log's
// syncs an operation, the mean time of a sync and the share of the time
// the log spent syncing ("–" where not known): a table, empty when there
// is none.
func Syncs(rs []Result) string {
	var b strings.Builder
	for _, r := range rs {
		if r.Fdatasyncs == nil && r.LogSyncs == 0 {
			continue
		}
		calls, log, took, busy := "–", "–", "–", "–"
		if r.Fdatasyncs != nil {
			calls = fmt.Sprintf("%.3f", *r.Fdatasyncs)
		}
		if r.LogSyncs > 0 {
			log, took, busy = fmt.Sprintf("%.3f", r.LogSyncs), fmt.Sprintf("%.3f", r.LogSyncMs), fmt.Sprintf("%.0f%%", 100*r.LogBusy)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %s |\n", r.Target, r.Workload, r.Clients, calls, log, took, busy)
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n| target | workload | clients | fdatasync calls/op | log syncs/op | ms a sync | time syncing |\n|---|---|---:|---:|---:|---:|---:|\n" + b.String()
}

// WaitersTable writes, for each result of Waiters, what the waiters added
// to ledgerd's resident memory, in all and a waiter: a table, empty when
// there is none.
func WaitersTable(rs []Result) string {
	var b strings.Builder
	for _, r := range rs {
		if r.Workload == WaitersWorkload && r.Clients > 0 {
			fmt.Fprintf(&b, "| %s | %d | %.1f | %.0f |\n", r.Target, r.Clients, r.RSSAboveIdleMB, r.RSSAboveIdleMB*(1<<20)/float64(r.Clients))
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "\n| target | waiters | MiB above idle | bytes a waiter |\n|---|---:|---:|---:|\n" + b.String()
}

// Ratios writes, for each result of a target named with prefix, its
// throughput over base's at the same point, and the CPU it took an
// operation, this process's and the other processes' together (the
// database's or Redis's), over base's: a table, empty when no target of
// prefix has a result at one of base's points.
func Ratios(rs []Result, prefix, base string) string {
	type point struct {
		workload string
		clients  int
	}
	bases := map[point]Result{}
	for _, r := range rs {
		if r.Target == base && r.PerSecond > 0 {
			bases[point{r.Workload, r.Clients}] = r
		}
	}
	if len(bases) == 0 {
		return ""
	}
	var b strings.Builder
	for _, r := range rs {
		if d, ok := bases[point{r.Workload, r.Clients}]; ok && strings.HasPrefix(r.Target, prefix) {
			cpu := "–"
			if c := d.CPUus + d.DBCPUus; c > 0 {
				cpu = fmt.Sprintf("%.2f", (r.CPUus+r.DBCPUus)/c)
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %.2f | %s |\n", r.Target, r.Workload, r.Clients, r.PerSecond/d.PerSecond, cpu)
		}
	}
	if b.Len() == 0 {
		return "" // no target of prefix at base's points
	}
	return fmt.Sprintf("\n| target | workload | clients | ops/s ÷ %s | CPU/op ÷ %s's |\n|---|---|---:|---:|---:|\n", base, base) + b.String()
}
