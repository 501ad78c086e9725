package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/bench"
	"github.com/idemledger/idemledger/lab/growth"
	"github.com/idemledger/idemledger/server/servertest"
)

// runBench runs the command's measurements with cfg and returns the
// results it wrote as JSON: the last of each target, and all of them.
func runBench(t *testing.T, cfg config) (map[string]bench.Result, []bench.Result) {
	t.Helper()
	cfg.jsonPath = filepath.Join(t.TempDir(), "results.json")
	if err := run(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cfg.jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rs []bench.Result
	if err := json.Unmarshal(b, &rs); err != nil {
		t.Fatal(err)
	}
	byTarget := map[string]bench.Result{}
	for _, r := range rs {
		if r.Ops == 0 || r.Errors != 0 {
			t.Errorf("%s %s: %d ops, %d errors (%s)", r.Target, r.Workload, r.Ops, r.Errors, r.FirstError)
		}
		byTarget[r.Target] = r
	}
	return byTarget, rs
}

// TestTurnsOnPostgres: ledgerd on one core (-ledgerd-procs 1), over unary
// calls and a stream, and direct SQL, measured in turns against a
// throwaway PostgreSQL (pgtest's: skipped without PostgreSQL, failed
// under CI=true): every target does work without errors, and the
// batching store's targets report their batches.
func TestTurnsOnPostgres(t *testing.T) {
	pg := pgtest.NewCluster(t)
	got, rs := runBench(t, config{stores: "postgres", databaseURL: pg.URL, workloads: "fresh", clients: []int{4}, apis: []string{"unary", "stream"},
		duration: 400 * time.Millisecond, rounds: 2, pool: 8, batching: "only", ledgerdProcs: map[string]int{"": 1}, outcomeSizes: []int{80, 4096}})
	for _, target := range []string{"ledgerd/postgres+batching GOMAXPROCS=1", "ledgerd/postgres+batching GOMAXPROCS=1 (stream)", "sql/postgres (pgx)"} {
		r, ok := got[target]
		if !ok {
			t.Fatalf("no result for %q; got %v", target, got)
		}
		if batched := r.BatchCalls > 0; batched != (target != "sql/postgres (pgx)") {
			t.Errorf("%s: %.1f calls a batch", target, r.BatchCalls)
		}
	}
	if len(got) != 3 {
		t.Fatalf("%d targets, want 3: %v", len(got), got)
	}
	// Every target ran the fresh workload at both outcome sizes.
	points := map[string]int{}
	for _, r := range rs {
		points[r.Workload]++
	}
	if points["fresh"] != 3 || points["fresh@4096"] != 3 || len(points) != 2 {
		t.Fatalf("results by workload %v, want fresh and fresh@4096 for each of the 3 targets", points)
	}
}

// TestDBTag: the PostgreSQL targets say when the throwaway cluster runs
// without durability, and say nothing of a database they did not start.
func TestDBTag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		durable bool
		url     string
		want    string
	}{
		{name: "durable cluster", durable: true, want: ""},
		{name: "cluster without durability", durable: false, want: " fsync=off"},
		{name: "given database, -durable=false", durable: false, url: "postgres://db", want: ""},
		{name: "given database", durable: true, url: "postgres://db", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := (config{durable: tc.durable, databaseURL: tc.url}).dbTag(); got != tc.want {
				t.Errorf("dbTag() = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestBesideRedis: the embedded store's ledgerd, in this process and in
// a process of its own, and a durable Redis run in turns, and so do the
// memory store's and a Redis without its disk (the transports' floors);
// the disk's fsync floor is reported beside them (skipped without
// redis-server, failed under CI=true).
func TestBesideRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not installed")
		}
		t.Skip("redis-server is not installed")
	}
	bin := buildLedgerd(t)
	for _, tc := range []struct {
		store, appendfsync string
		ledgerds           []string
	}{
		{"embedded", "always", []string{"ledgerd/embedded (stream)", processName + " (stream)"}},
		{"memory", "no", []string{"ledgerd/memory (stream)"}},
	} {
		t.Run(tc.store, func(t *testing.T) {
			besideRedis(t, tc.store, tc.appendfsync, bin, tc.ledgerds)
		})
	}
}

// buildLedgerd builds ledgerd into the test's directory.
func buildLedgerd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "ledgerd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/idemledger/idemledger/cmd/ledgerd").CombinedOutput(); err != nil {
		t.Fatalf("build ledgerd: %v\n%s", err, out)
	}
	return bin
}

// besideRedis runs the store beside a Redis of that appendfsync, and
// expects the results of its ledgerds (the embedded store's process,
// run from bin, among them).
func besideRedis(t *testing.T, store, appendfsync, bin string, ledgerds []string) {
	t.Helper()
	got, all := runBench(t, config{stores: store, workloads: "fresh,replay", clients: []int{2}, apis: []string{"stream"},
		duration: 300 * time.Millisecond, rounds: 2, redis: true, redisFsync: appendfsync, process: true, ledgerdBin: bin})
	// The embedded store's log syncs at most twice a fresh pair (a
	// claim's write and a completion's, when no other write shares a
	// sync); a ledgerd process's are read from its metrics. A replay
	// writes nothing, but the store's own work may sync while replays
	// run: Pebble's first memtables are small (256 KiB), so the fresh
	// pairs fill one, and its flush syncs the log it rotates and the
	// table it writes, which the counts of the store (or of ledgerd's
	// process) include. That is a few syncs, where a replay that wrote
	// would make one or more each.
	const background = 0.05 // syncs a replay, at most
	for _, r := range all {
		if r.LogError != "" {
			t.Errorf("%s %s: log syncs not read: %s", r.Target, r.Workload, r.LogError)
		}
		embedded := strings.HasPrefix(r.Target, "ledgerd/embedded")
		fresh := embedded && r.Workload == "fresh"
		if fresh && (r.LogSyncs <= 0 || r.LogSyncs > 2.1 || r.LogSyncMs <= 0 || r.LogBusy <= 0 || r.LogBusy > 1.05) ||
			embedded && !fresh && r.LogSyncs > background || !embedded && (r.LogSyncs != 0 || r.LogBusy != 0) {
			t.Errorf("%s %s: log %.2f syncs/op of %.3f ms, syncing %.0f%% of the time", r.Target, r.Workload, r.LogSyncs, r.LogSyncMs, 100*r.LogBusy)
		}
	}
	// Where perf is (.ci/run installs it), ledgerd's fdatasync calls and
	// Redis's are counted: about twice a fresh pair with a durable Redis's
	// and the embedded store's, fewer when writes share a sync; never
	// without a disk, nor for Redis's replays; for the embedded store's,
	// only its flushes' (above).
	_, perfErr := exec.LookPath("perf")
	counted := perfErr == nil || os.Getenv("CI") == "true"
	for _, r := range all {
		if r.Target == floorName {
			continue
		}
		if !counted {
			if r.Fdatasyncs != nil {
				t.Errorf("%s %s: fdatasyncs counted without perf", r.Target, r.Workload)
			}
			continue
		}
		if r.Fdatasyncs == nil {
			t.Errorf("%s %s: fdatasyncs not counted: %s", r.Target, r.Workload, r.CountError)
			continue
		}
		durable := appendfsync == "always" && r.Workload == "fresh"
		flushes := strings.HasPrefix(r.Target, "ledgerd/embedded") && !durable
		if n := *r.Fdatasyncs; durable && (n <= 0 || n > 2.1) || flushes && n > background || !durable && !flushes && n != 0 {
			t.Errorf("%s %s: %.3f fdatasyncs a pair", r.Target, r.Workload, n)
		}
	}
	want := append([]string{redisPrefix + appendfsync, floorName}, ledgerds...)
	for _, target := range want {
		if _, ok := got[target]; !ok {
			t.Fatalf("no result for %q; got %v", target, got)
		}
	}
	if floor := got[floorName]; floor.PerSecond <= 0 || floor.Clients != 1 {
		t.Fatalf("fsync floor %+v", floor)
	}
	if len(got) != len(want) {
		t.Fatalf("%d targets, want %d: %v", len(got), len(want), got)
	}
}

// TestGoals: each goal is read at its points against its base, and says
// whether its bound was kept; points, workloads and targets it does not
// hold for are left out.
func TestGoals(t *testing.T) {
	rs := []bench.Result{
		{Target: "ledgerd/embedded (stream)", Workload: "fresh", Clients: 32, PerSecond: 900, P50ms: 2, P99ms: 7, CPUus: 150, DBCPUus: 10},
		{Target: durableRedis, Workload: "fresh", Clients: 32, PerSecond: 1000, P50ms: 1, P99ms: 2, CPUus: 40, DBCPUus: 40},
		{Target: "ledgerd/embedded (stream)", Workload: "fresh", Clients: 2, PerSecond: 900}, // no goal at 2 clients
		{Target: durableRedis, Workload: "fresh", Clients: 2, PerSecond: 100},
		{Target: "ledgerd/postgres (stream)", Workload: "fresh", Clients: 8, PerSecond: 1200, P50ms: 1, P99ms: 2},
		{Target: "sql/postgres (pgx)", Workload: "fresh", Clients: 8, PerSecond: 1000},
		{Target: "ledgerd/postgres (stream)", Workload: largeOutcome, Clients: 32, PerSecond: 85},
		{Target: "sql/postgres (pgx)", Workload: largeOutcome, Clients: 32, PerSecond: 100},
		{Target: "ledgerd/postgres (stream)", Workload: largeOutcome, Clients: 8, PerSecond: 897},
		{Target: "sql/postgres (pgx)", Workload: largeOutcome, Clients: 8, PerSecond: 1000},
		{Target: "rpc/unprotected", Workload: "write", Clients: 1, P50ms: 0.05},
		{Target: "rpc/protected (embedded ledger, stream)", Workload: "write", Clients: 1, P50ms: 0.95},
		{Target: bench.WaitersTarget("stream"), Workload: bench.WaitersWorkload, Clients: 10000, Ops: 10000, RSSAboveIdleMB: 18.6},
		{Target: bench.WaitersTarget("unary"), Workload: bench.WaitersWorkload, Clients: 10000, Ops: 10000, RSSAboveIdleMB: 230}, // no goal over unary calls
		{Target: "growth/embedded 400 records, 3000 pairs/s offered", Workload: growth.Empty, Clients: 8, PerSecond: 1000, P99ms: 4},
		{Target: "growth/embedded 400 records, 3000 pairs/s offered", Workload: growth.FirstHalf, Clients: 8, PerSecond: 900, P99ms: 5},
		{Target: "growth/embedded 400 records, 3000 pairs/s offered", Workload: growth.SecondHalf, Clients: 8, PerSecond: 700, P99ms: 5},
		{Target: "growth/embedded 400 records, 3000 pairs/s offered", Workload: growth.Sweeping, Clients: 8, PerSecond: 630, P99ms: 12},
		{Target: "growth/embedded 400 records, 3000 pairs/s offered", Workload: growth.AfterSweep, Clients: 8, PerSecond: 1100, P99ms: 3},
	}
	md := goalsTable(rs)
	for _, want := range []string{
		"| pairs/s over durable Redis's | ledgerd/embedded (stream) | redis appendfsync=always | fresh | 32 | 0.90 | ≥ 1.00 | no |",
		"| CPU a pair ≤ 2× Redis's client and server | ledgerd/embedded (stream) | redis appendfsync=always | fresh | 32 | 2.00 | ≤ 2.00 | yes |",
		"| pairs/s over direct SQL's | ledgerd/postgres (stream) | sql/postgres (pgx) | fresh | 8 | 1.20 | ≥ 1.00 | yes |",
		"| 256 KiB outcomes: pairs/s over direct SQL's | ledgerd/postgres (stream) | sql/postgres (pgx) | fresh@262144 | 32 | 0.85 | ≥ 0.90 | no |",
		// A value that misses its bound by less than the last digit shown
		// is shown with a digit more.
		"| 256 KiB outcomes: pairs/s over direct SQL's | ledgerd/postgres (stream) | sql/postgres (pgx) | fresh@262144 | 8 | 0.897 | ≥ 0.90 | no |",
		"| a protected write's p50 over an unprotected one's, ms | rpc/protected (embedded ledger, stream) | rpc/unprotected | write | 1 | +0.90 | ≤ +1.00 | yes |",
		"| p99 ÷ p50 | ledgerd/embedded (stream) | – | fresh | 32 | 3.50 | ≤ 3.00 | no |",
		"| 10,000 Lookup waiters on a Stream: MiB above idle | ledgerd/embedded waiters (stream) | – | lookup-wait | 10000 | 18.6 | ≤ 50.0 | yes |",
		"| growth: pairs/s over the empty store's, at the same load | growth/embedded 400 records, 3000 pairs/s offered | its empty step | first half written | 8 | 0.90 | ≥ 0.80 | yes |",
		"| growth: pairs/s over the empty store's, at the same load | growth/embedded 400 records, 3000 pairs/s offered | its empty step | second half written | 8 | 0.70 | ≥ 0.80 | no |",
		"| growth: pairs/s over the empty store's, at the same load | growth/embedded 400 records, 3000 pairs/s offered | its empty step | after the sweep | 8 | 1.10 | ≥ 0.80 | yes |",
		"| during the sweep: pairs/s over the step before's | growth/embedded 400 records, 3000 pairs/s offered | its second half written step | during the sweep | 8 | 0.90 | ≥ 0.80 | yes |",
		"| during the sweep: p99 over the step before's | growth/embedded 400 records, 3000 pairs/s offered | its second half written step | during the sweep | 8 | 2.40 | ≤ 2.00 | no |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("no row %q in:\n%s", want, md)
		}
	}
	if rows := strings.Count(md, "\n| ") - 1; rows != 13 {
		t.Errorf("%d goal rows, want 13:\n%s", rows, md)
	}
	// Only the protected write's goal has its target and its base here.
	if md := goalsTable(rs[10:12]); strings.Count(md, "\n| ")-1 != 1 || !strings.Contains(md, "rpc/protected") {
		t.Errorf("goals of the interceptor's results alone:\n%s", md)
	}
	if md := goalsTable(rs[2:4]); md != "" {
		t.Errorf("goals at a point none holds at:\n%s", md)
	}
}

// TestProcsByStore: -ledgerd-procs takes a number for every store or a
// number a store, and refuses anything else.
func TestProcsByStore(t *testing.T) {
	for _, tc := range []struct {
		flag               string
		embedded, postgres int
	}{
		{"", 0, 0}, {"0", 0, 0}, {"2", 2, 2}, {"postgres=1", 0, 1}, {"4, postgres=1", 4, 1}, {"embedded=4,postgres=1", 4, 1}, {"4,postgres=0", 4, 0},
	} {
		procs, err := parseProcs(tc.flag)
		if err != nil {
			t.Fatalf("%q: %v", tc.flag, err)
		}
		cfg := config{ledgerdProcs: procs}
		if cfg.procs("embedded") != tc.embedded || cfg.procs("postgres") != tc.postgres {
			t.Errorf("%q: embedded %d, postgres %d; want %d, %d", tc.flag, cfg.procs("embedded"), cfg.procs("postgres"), tc.embedded, tc.postgres)
		}
	}
	for _, bad := range []string{"x", "-1", "redis=1", "postgres=", "postgres=one"} {
		if _, err := parseProcs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestGrowthAndWaiters: with no store, a run measures growth and the
// Lookup waiters of a ledgerd process alone, and its goals table holds
// both against their bounds.
func TestGrowthAndWaiters(t *testing.T) {
	bin := buildLedgerd(t)
	cfg := config{apis: []string{"stream", "unary"}, duration: 100 * time.Millisecond, outcomeSizes: []int{100},
		growth: growth.Config{Records: 600, Writers: 2, Fillers: 4}, waiters: 2000, ledgerdBin: bin}
	_, rs := runBench(t, cfg)
	var workloads []string
	for _, r := range rs {
		workloads = append(workloads, r.Workload)
		if r.Workload == bench.WaitersWorkload && (r.Clients != 2000 || r.Seconds <= 0) {
			t.Errorf("waiters: %+v", r)
		}
		// A unary call waiting holds a goroutine and its stack in ledgerd
		// (tens of KB): 2,000 of them show above the garbage collector's
		// noise, where a Stream's waiters may not.
		if r.Target == bench.WaitersTarget("unary") && r.RSSAboveIdleMB < 5 {
			t.Errorf("2,000 unary waiters added %.1f MiB", r.RSSAboveIdleMB)
		}
	}
	want := []string{bench.WaitersWorkload, bench.WaitersWorkload, growth.Empty, growth.FirstHalf, growth.SecondHalf, growth.Sweeping, growth.AfterSweep}
	if !slices.Equal(workloads, want) {
		t.Fatalf("results of %q, want %q", workloads, want)
	}
	md := goalsTable(rs)
	if n := strings.Count(md, "| growth/embedded 600 records |"); n != 5 {
		t.Errorf("%d growth goal rows, want 5:\n%s", n, md)
	}
	// 2,000 waiters are no point of the 10,000 waiters' goal.
	if strings.Contains(md, "waiters") {
		t.Errorf("a waiters' goal at 2,000 waiters:\n%s", md)
	}
}

// TestPacedAgainstALedgerd: -rate with -addr offers the paced fresh pairs
// to a running ledgerd over each API, and reports them as the paced
// workload, every pair served.
func TestPacedAgainstALedgerd(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, servertest.MemoryLedger("bench"))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	cfg := config{addr: lis.Addr().String(), apis: []string{"stream", "unary"}, workloads: "fresh",
		rate: 200, duration: 250 * time.Millisecond, outcomeSizes: []int{100}}
	_, rs := runBench(t, cfg)
	if len(rs) != 2 {
		t.Fatalf("%d results, want one a API: %+v", len(rs), rs)
	}
	for _, r := range rs {
		if r.Workload != bench.PacedWorkload || r.Clients != 1 || r.Ops != 50 || r.P50ms <= 0 {
			t.Errorf("%s: %+v; want 50 paced pairs from one client", r.Target, r)
		}
	}
}
