package bench_test

import (
	"context"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/lab/bench"
	"github.com/idemledger/idemledger/ledger/crdb"
)

func TestMeasure(t *testing.T) {
	var calls atomic.Int64
	seen := map[int64]bool{}
	var dup atomic.Bool
	ch := make(chan int64, 1<<16)
	r := bench.Interleave(t.Context(), "sleep", 4, 200*time.Millisecond, 1, bench.Subject{Target: "fake", Op: func(ctx context.Context, c int, n int64) error {
		select {
		case ch <- n:
		default:
		}
		if calls.Add(1)%10 == 0 {
			return errors.New("every tenth fails")
		}
		time.Sleep(time.Millisecond) // a target that takes a millisecond: what the benchmark harness measures
		return nil
	}})[0]
	close(ch)
	for n := range ch {
		if seen[n] {
			dup.Store(true)
		}
		seen[n] = true
	}
	if dup.Load() {
		t.Fatal("an n was given twice")
	}
	if r.Ops == 0 || r.Errors == 0 || r.FirstError != "every tenth fails" {
		t.Fatalf("ops %d errors %d first %q", r.Ops, r.Errors, r.FirstError)
	}
	// 4 clients sleeping 1 ms: about 4000 ops/s, never more.
	if r.PerSecond > 4500 || r.PerSecond < 1000 {
		t.Fatalf("%.0f ops/s from 4 clients sleeping 1 ms", r.PerSecond)
	}
	if r.P50ms < 1 || r.P99ms < r.P50ms || r.P999ms < r.P99ms {
		t.Fatalf("percentiles p50 %.2f p99 %.2f p99.9 %.2f", r.P50ms, r.P99ms, r.P999ms)
	}
}

// TestInterleave: two subjects run in turns, each for its share of the
// time, and each result counts only its own turns.
func TestInterleave(t *testing.T) {
	var mu sync.Mutex
	var turns []string // the subject of each operation, run-length encoded
	var batches, calls, syncs atomic.Uint64
	var synced atomic.Int64                                  // nanoseconds
	procs := map[string]map[int]bool{"fast": {}, "slow": {}} // GOMAXPROCS seen in each subject's turns
	op := func(name string, sleep time.Duration, batch bool) bench.Op {
		return func(ctx context.Context, c int, n int64) error {
			mu.Lock()
			if len(turns) == 0 || turns[len(turns)-1] != name {
				turns = append(turns, name)
			}
			procs[name][runtime.GOMAXPROCS(0)] = true
			mu.Unlock()
			if batch {
				batches.Add(1)
				calls.Add(3)
				syncs.Add(2) // two syncs of half a millisecond each
				synced.Add(int64(time.Millisecond))
			}
			time.Sleep(sleep) // a target of known latency: what the harness must report
			return nil
		}
	}
	stats := func() crdb.BatchStats { return crdb.BatchStats{Batches: batches.Load(), Calls: calls.Load()} }
	logSyncs := func() (uint64, time.Duration, error) { return syncs.Load(), time.Duration(synced.Load()), nil }
	// The fdatasyncs counted are the slow subject's syncs in the turns
	// its counts cover; the fast subject's counts fail on the second turn,
	// and so does the reading of its log's syncs (before the turn).
	var counts, reads atomic.Int64
	readFails := func() (uint64, time.Duration, error) {
		if reads.Add(1) == 3 {
			return 0, 0, errors.New("the metrics are gone")
		}
		return logSyncs()
	}
	countSyncs := func() (func() (uint64, error), error) {
		from := syncs.Load()
		return func() (uint64, error) { return syncs.Load() - from, nil }, nil
	}
	countFails := func() (func() (uint64, error), error) {
		if counts.Add(1) == 2 {
			return nil, errors.New("perf is gone")
		}
		return func() (uint64, error) { return 0, nil }, nil
	}
	before := runtime.GOMAXPROCS(0)
	rs := bench.Interleave(t.Context(), "sleep", 2, 600*time.Millisecond, 3,
		bench.Subject{Target: "fast", Op: op("fast", time.Millisecond, false), LogSyncs: readFails, Fdatasyncs: countFails},
		bench.Subject{Target: "slow", Op: op("slow", 4*time.Millisecond, true), Batches: stats, LogSyncs: logSyncs, Fdatasyncs: countSyncs, Procs: before + 1})
	if want := []string{"fast", "slow", "fast", "slow", "fast", "slow"}; !slices.Equal(turns, want) {
		t.Fatalf("turns %v, want %v", turns, want)
	}
	if after := runtime.GOMAXPROCS(0); after != before || len(procs["fast"]) != 1 || !procs["fast"][before] ||
		len(procs["slow"]) != 1 || !procs["slow"][before+1] {
		t.Fatalf("GOMAXPROCS %d before, %d after; seen in the turns %v, want %d in fast's and %d in slow's",
			before, after, procs, before, before+1)
	}
	fast, slow := rs[0], rs[1]
	if fast.Target != "fast" || slow.Target != "slow" || fast.Workload != "sleep" || fast.Clients != 2 {
		t.Fatalf("results %+v %+v", fast, slow)
	}
	// Each ran 3 turns of 200 ms; its warm-ups are not counted.
	for _, r := range rs {
		if r.Seconds < 0.55 || r.Seconds > 0.7 {
			t.Fatalf("%s measured for %.2f s, want about 0.6", r.Target, r.Seconds)
		}
	}
	// 2 clients sleeping 1 ms, against 4 ms: about 4 times the rate.
	if q := fast.PerSecond / slow.PerSecond; q < 2.5 || q > 5 {
		t.Fatalf("fast %.0f ops/s, slow %.0f: ratio %.1f, want about 4", fast.PerSecond, slow.PerSecond, q)
	}
	if fast.BatchCalls != 0 || slow.BatchCalls != 3 {
		t.Fatalf("batch sizes fast %.1f slow %.1f, want 0 and 3", fast.BatchCalls, slow.BatchCalls)
	}
	// Only the slow subject's operations sync, twice each, for 1 ms in
	// all: 2 syncs an operation (a little more, from the operations a
	// turn's end cut off), of 0.5 ms each; its 2 clients each spend 1 ms
	// of every 4 ms syncing, so the log syncs for about half the time.
	if fast.LogSyncs != 0 || fast.LogBusy != 0 || slow.LogSyncs < 2 || slow.LogSyncs > 2.2 ||
		slow.LogSyncMs != 0.5 || slow.LogBusy < 0.35 || slow.LogBusy > 0.55 {
		t.Fatalf("log syncs: fast %.2f/op, %.0f%% busy; slow %.2f/op of %.3f ms, %.0f%% busy; want none, and 2 of 0.5 ms for about half the time",
			fast.LogSyncs, 100*fast.LogBusy, slow.LogSyncs, slow.LogSyncMs, 100*slow.LogBusy)
	}
	// The counted fdatasyncs are the measured turns' (a warm-up's are not:
	// they would make it about 2.4).
	if slow.Fdatasyncs == nil || *slow.Fdatasyncs < 2 || *slow.Fdatasyncs > 2.2 || slow.CountError != "" {
		t.Fatalf("slow: fdatasyncs %v (%q), want 2 an operation", slow.Fdatasyncs, slow.CountError)
	}
	if fast.Fdatasyncs != nil || fast.CountError != "perf is gone" {
		t.Fatalf("fast: fdatasyncs %v (%q), want none, and why", fast.Fdatasyncs, fast.CountError)
	}
	if fast.LogError != "the metrics are gone" || slow.LogError != "" {
		t.Fatalf("log syncs not read: fast %q, slow %q; want why for fast only", fast.LogError, slow.LogError)
	}
}

// TestSyncs: the table of the results whose fdatasyncs were counted or
// whose store's log was read, each with what is known of it.
func TestSyncs(t *testing.T) {
	calls, none := 0.048, 0.0
	rs := []bench.Result{
		{Target: "ledgerd/embedded", Workload: "fresh", Clients: 8, LogSyncs: 0.75, LogSyncMs: 0.31, LogBusy: 0.97},
		{Target: "redis", Workload: "fresh", Clients: 8, Fdatasyncs: &calls},
		{Target: "redis", Workload: "replay", Clients: 8, Fdatasyncs: &none},
		{Target: "sql", Workload: "fresh", Clients: 8},
	}
	md := bench.Syncs(rs)
	for _, row := range []string{
		"| ledgerd/embedded | fresh | 8 | – | 0.750 | 0.310 | 97% |",
		"| redis | fresh | 8 | 0.048 | – | – | – |",
		"| redis | replay | 8 | 0.000 | – | – | – |",
	} {
		if !strings.Contains(md, row) {
			t.Errorf("no row %q in:\n%s", row, md)
		}
	}
	if strings.Count(md, "\n") != 6 || strings.Contains(md, "sql") {
		t.Fatalf("syncs:\n%s", md)
	}
	if md := bench.Syncs(rs[3:]); md != "" {
		t.Fatalf("syncs with none counted or read:\n%s", md)
	}
}

// TestWaitersTable: the waiters' results have a table of their own, and
// the results' table leaves them out.
func TestWaitersTable(t *testing.T) {
	rs := []bench.Result{
		{Target: bench.WaitersTarget("stream"), Workload: bench.WaitersWorkload, Clients: 10000, Ops: 10000, RSSAboveIdleMB: 18.6},
		{Target: "ledgerd/embedded", Workload: "fresh", Clients: 8, PerSecond: 700},
	}
	md := bench.WaitersTable(rs)
	if strings.Count(md, "\n") != 4 || !strings.Contains(md, "| ledgerd/embedded waiters (stream) | 10000 | 18.6 | 1950 |") {
		t.Fatalf("waiters:\n%s", md)
	}
	if md := bench.Markdown(rs); strings.Contains(md, "waiters") || !strings.Contains(md, "| ledgerd/embedded | fresh | 8 | 700 |") {
		t.Fatalf("results:\n%s", md)
	}
	if md := bench.WaitersTable(rs[1:]); md != "" {
		t.Fatalf("waiters with none measured:\n%s", md)
	}
}

func TestMarkdownAndPlot(t *testing.T) {
	rs := []bench.Result{
		{Target: "a", Workload: "fresh", Clients: 1, PerSecond: 100},
		{Target: "a", Workload: "fresh", Clients: 8, PerSecond: 700},
		{Target: "b", Workload: "fresh", Clients: 1, PerSecond: 200},
		{Target: "b", Workload: "replay", Clients: 1, PerSecond: 900},
	}
	if md := bench.Markdown(rs); strings.Count(md, "\n") != 6 || !strings.Contains(md, "| a | fresh | 8 | 700 |") {
		t.Fatalf("markdown:\n%s", md)
	}
	path := filepath.Join(t.TempDir(), "p.png")
	if err := bench.Plot(rs, "fresh", "test", path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := png.Decode(f); err != nil {
		t.Fatalf("the plot is no PNG: %v", err)
	}
	if err := bench.Plot(rs, "hot", "test", path); err == nil {
		t.Fatal("plotting a workload with no results did not fail")
	}
}

// TestRatios: each target of the prefix over the base at the same point,
// in throughput and in CPU an operation, the other processes' included.
func TestRatios(t *testing.T) {
	rs := []bench.Result{
		{Target: "ledgerd/x", Workload: "fresh", Clients: 8, PerSecond: 600, CPUus: 90, DBCPUus: 10},
		{Target: "ledgerd/x", Workload: "fresh", Clients: 32, PerSecond: 900, CPUus: 50},
		{Target: "base", Workload: "fresh", Clients: 8, PerSecond: 800, CPUus: 30, DBCPUus: 20},
		{Target: "other", Workload: "fresh", Clients: 8, PerSecond: 1},
	}
	md := bench.Ratios(rs, "ledgerd/", "base")
	if !strings.Contains(md, "| ledgerd/x | fresh | 8 | 0.75 | 2.00 |") || strings.Contains(md, "| 32 |") || strings.Contains(md, "other") {
		t.Fatalf("ratios:\n%s", md)
	}
	if md := bench.Ratios(rs, "ledgerd/", "absent"); md != "" {
		t.Fatalf("ratios over a base not measured:\n%s", md)
	}
}
