// Command ledgerbench measures the ledger: throughput, p50/p99/p99.9
// latency and CPU per operation, at several numbers of concurrent clients,
// for three workloads (fresh keys: Begin+Complete; replays of completed
// keys; contention on a few hot keys), on each store. On PostgreSQL it does
// the same work in the same run with the store's SQL sent straight through
// pgx, so the service's cost shows as a ratio. It also measures a write RPC
// with and without the idempotency interceptor. After the stores it can
// measure the embedded store as its data grows and is swept
// (-growth-records, lab/growth) and the memory that Lookups waiting add to
// a ledgerd process (-waiters). The targets compared at a
// point (a workload and a number of clients) run in turns, so that the
// machine's drift during the run slows them alike (-rounds). It ends with
// the performance goals the run measured (docs/performance.md): each
// one's value at each of its points, its bound, and whether it was kept.
//
// By default it starts ledgerd's service in process, on loopback gRPC, and a
// throwaway PostgreSQL with PostgreSQL's durability settings, as a ledger's
// database runs in production (-durable=false turns fsync off); -addr drives
// a running ledgerd instead.
//
//	go run ./lab/cmd/ledgerbench -json lab/results/bench.json -png lab/results/bench.png
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/timestamppb"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/bench"
	"github.com/idemledger/idemledger/lab/faultproxy"
	"github.com/idemledger/idemledger/lab/growth"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/ledger/pebble"
	"github.com/idemledger/idemledger/server"
)

type config struct {
	stores, workloads, addr, token, databaseURL, jsonPath, pngPath string
	dbCPUs                                                         string
	clients                                                        []int
	apis                                                           []string
	duration, dbRTT                                                time.Duration
	pool, rounds, maxBatchedOutcome                                int
	ledgerdProcs                                                   map[string]int // by store; "": every store
	growth                                                         growth.Config  // Records 0: no growth run
	waiters                                                        int
	rate                                                           float64 // with addr: paced fresh pairs a second, instead of the turns
	ledgerdBin                                                     string
	outcomeSizes                                                   []int
	batchInFlight                                                  []int
	interceptor, durable, redis, process                           bool
	redisFsync                                                     string
	batching                                                       string
}

// target is a target's workloads; batches, when not nil, reads the batch
// counters of the store behind it, logSyncs its log's syncs, and
// fdatasyncs counts its process's fdatasync calls; procs, when above 0, is
// GOMAXPROCS during its turns.
type target struct {
	name       string
	workloads  map[string]bench.Op
	batches    func() crdb.BatchStats
	logSyncs   func() (uint64, time.Duration, error)
	fdatasyncs bench.FdatasyncCount
	procs      int
}

// fdatasyncCounter is what counts the fdatasync calls of a process for a
// target (bench.CountFdatasyncs), when perf can count them here: it tries
// once, on this process, and says once why not. Without it the targets are
// measured as before, and their syncs a pair are the log's alone.
func fdatasyncCounter() func(pid int) bench.FdatasyncCount {
	stop, err := bench.CountFdatasyncs(os.Getpid())
	if err == nil {
		_, err = stop()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench: the fdatasync calls are not counted:", err)
		return nil
	}
	return func(pid int) bench.FdatasyncCount {
		return func() (func() (uint64, error), error) { return bench.CountFdatasyncs(pid) }
	}
}

func main() {
	// As ledgerd runs without OTEL_* settings: no span is recorded.
	otel.SetTracerProvider(noop.NewTracerProvider())
	var cfg config
	var clients, apis string
	flag.StringVar(&cfg.stores, "stores", "memory,embedded,postgres", "stores to measure, in process: memory, embedded, postgres; empty: none (a run of -growth-records or -waiters alone)")
	flag.StringVar(&cfg.workloads, "workloads", "fresh,replay,hot", "workloads: fresh, replay, hot")
	flag.StringVar(&clients, "clients", "1,8,32,128", "numbers of concurrent clients")
	flag.DurationVar(&cfg.duration, "duration", 3*time.Second, "measurement time of each target at each point (plus a fifth to warm up)")
	flag.IntVar(&cfg.rounds, "rounds", 5, "the targets of a point run in turns, this many each, so that the machine's drift slows them alike")
	procs := flag.String("ledgerd-procs", "", "GOMAXPROCS of the in-process ledgerd (and its clients) during its turns, as a ledgerd sized to that many cores gets: a number for every store, or store=n pairs (postgres=1); empty or 0 leaves every core")
	flag.StringVar(&cfg.addr, "addr", "", "drive a running ledgerd at this address instead of the in-process stores")
	flag.StringVar(&cfg.token, "token", "", "bearer token for -addr")
	flag.Float64Var(&cfg.rate, "rate", 0, "with -addr: instead of the turns, offer this many fresh pairs a second from one client, open loop, for -duration over each -api, and time each pair from when it was due (what a sweep or a resize costs the writes it delays); 0: the turns")
	flag.StringVar(&cfg.databaseURL, "database-url", "", "PostgreSQL for the postgres store, empty starts a throwaway cluster; with -addr, direct SQL on it runs in turns with that ledgerd")
	flag.BoolVar(&cfg.durable, "durable", true, "start the throwaway cluster with PostgreSQL's durability settings (fsync, synchronous_commit, full_page_writes on), as a ledger's database runs in production and as CockroachDB always is; -durable=false turns them off and adds \" fsync=off\" to the PostgreSQL targets' names")
	flag.StringVar(&cfg.dbCPUs, "db-cpus", "", "pin the throwaway cluster to these CPUs (a list as taskset takes it, \"1\") and this process to the others; empty shares every CPU")
	flag.DurationVar(&cfg.dbRTT, "db-rtt", 0, "put the postgres store's database behind a proxy that adds this round trip (half each way): a database a region away; 0: none")
	outcomeSizes := flag.String("outcome-size", strconv.Itoa(bench.DefaultOutcomeSize), "bytes of the response each fresh pair stores, for every target; a list measures the fresh workload at each size, the first as fresh and the others as fresh@size, in one run")
	flag.IntVar(&cfg.maxBatchedOutcome, "max-batched-outcome", 0, "postgres store with batching: the largest outcome, in encoded bytes, a Complete sends through a batch; 0 is the store's default, -1 batches every outcome")
	flag.IntVar(&cfg.pool, "pool", 0, "connection pool size on PostgreSQL, for the store and for direct SQL alike; 0 is pgx's default, the larger of 4 and the cores, as ledgerd's")
	flag.BoolVar(&cfg.redis, "redis", true, "with the embedded or the memory store, measure in turns with it a Redis (SET NX, then SET XX) and the disk's fsync floor; needs redis-server on the PATH, and says so when it is missing")
	flag.StringVar(&cfg.redisFsync, "redis-appendfsync", "always", "the Redis peer's appendfsync: always (durable, the embedded store's peer) or no (without its disk: beside the memory store, the two transports' floors)")
	flag.BoolVar(&cfg.interceptor, "interceptor", true, "measure a write RPC with and without the idempotency interceptor")
	flag.StringVar(&apis, "api", "unary,stream", "how the clients call ledgerd: unary calls, calls on a Stream (ledger/ledgerclient), or both")
	flag.StringVar(&cfg.batching, "batching", "both", "postgres store: without statement batching (off), with it (only), or both")
	inFlight := flag.String("batch-inflight", "0", "batches in flight at once, a list: each is a batching variant, measured in turns with the others; 0 is the store's default (set from the round trip)")
	flag.IntVar(&cfg.growth.Records, "growth-records", 0, "after the stores, measure the embedded store growing to this many records, the first half swept away as it expires (lab/growth); its outcome is -outcome-size's first, each step runs -duration; 0: no growth run")
	flag.Float64Var(&cfg.growth.Rate, "growth-rate", 0, "growth: offer this many pairs a second in every step after the first; 0: flat out, or -growth-paced")
	flag.Float64Var(&cfg.growth.Paced, "growth-paced", 0, "growth: offer this fraction of the empty store's throughput in every step after the first (0.5: half); 0: flat out")
	flag.IntVar(&cfg.growth.Writers, "growth-writers", 8, "growth: concurrent writers whose throughput is measured")
	flag.IntVar(&cfg.growth.Fillers, "growth-fillers", 64, "growth: concurrent writers that fill the store")
	flag.IntVar(&cfg.growth.SweepBatch, "growth-sweep-batch", 0, "growth: records the store sweeps before it rests (pebble.Config.SweepBatch); 0: the store's default")
	flag.Float64Var(&cfg.growth.SweepShare, "growth-sweep-share", 0, "growth: the share of the time the store sweeps while a backlog lasts (pebble.Config.SweepShare); 0: the store's default")
	flag.IntVar(&cfg.waiters, "waiters", 0, "after the stores, hold this many Lookups waiting on one ledgerd process on its embedded store, over each -api, and read what they add to its resident memory; 0: none")
	flag.BoolVar(&cfg.process, "process", true, "with the embedded store, measure in turns with it a ledgerd process of its own on that store, started as the README starts it (-ledgerd)")
	flag.StringVar(&cfg.ledgerdBin, "ledgerd", "", "-waiters and -process: the ledgerd binary; empty builds ./cmd/ledgerd (run from the repository's root)")
	flag.StringVar(&cfg.jsonPath, "json", "", "write the results as JSON to this file")
	flag.StringVar(&cfg.pngPath, "png", "", "plot the fresh workload into this PNG")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memprofile := flag.String("memprofile", "", "write a heap profile of the whole run to this file: go tool pprof -sample_index=alloc_space shows what each call allocated")
	traceFile := flag.String("trace", "", "write an execution trace of the whole run to this file (go tool trace): where a call waits, goroutine by goroutine")
	from := flag.String("from", "", "measure nothing: read the results of an earlier -json run from this file, and print and plot them")
	flag.Parse()
	for _, c := range strings.Split(clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "ledgerbench: bad -clients %q\n", clients)
			os.Exit(2)
		}
		cfg.clients = append(cfg.clients, n)
	}
	for _, c := range strings.Split(*inFlight, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 0 {
			fmt.Fprintf(os.Stderr, "ledgerbench: bad -batch-inflight %q\n", *inFlight)
			os.Exit(2)
		}
		cfg.batchInFlight = append(cfg.batchInFlight, n)
	}
	for _, c := range strings.Split(*outcomeSizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n <= 0 || slices.Contains(cfg.outcomeSizes, n) {
			fmt.Fprintf(os.Stderr, "ledgerbench: bad -outcome-size %q\n", *outcomeSizes)
			os.Exit(2)
		}
		cfg.outcomeSizes = append(cfg.outcomeSizes, n)
	}
	for _, a := range strings.Split(apis, ",") {
		if a = strings.TrimSpace(a); a != "unary" && a != "stream" {
			fmt.Fprintf(os.Stderr, "ledgerbench: bad -api %q\n", apis)
			os.Exit(2)
		}
		cfg.apis = append(cfg.apis, strings.TrimSpace(a))
	}
	if cfg.redisFsync != "always" && cfg.redisFsync != "no" {
		fmt.Fprintf(os.Stderr, "ledgerbench: bad -redis-appendfsync %q\n", cfg.redisFsync)
		os.Exit(2)
	}
	var err error
	if cfg.ledgerdProcs, err = parseProcs(*procs); err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench:", err)
		os.Exit(2)
	}
	if slices.ContainsFunc(slices.Collect(maps.Values(cfg.ledgerdProcs)), func(n int) bool { return n > 0 }) && cfg.addr != "" {
		fmt.Fprintln(os.Stderr, "ledgerbench: -ledgerd-procs sizes the in-process ledgerd; it does not go with -addr")
		os.Exit(2)
	}
	if cfg.rate < 0 || cfg.rate > 0 && cfg.addr == "" {
		fmt.Fprintln(os.Stderr, "ledgerbench: -rate paces the pairs sent to the ledgerd at -addr; it needs -addr and a rate above 0")
		os.Exit(2)
	}
	if (cfg.growth.Records > 0 || cfg.waiters > 0) && cfg.addr != "" {
		fmt.Fprintln(os.Stderr, "ledgerbench: -growth-records and -waiters measure a store and a ledgerd of their own; they do not go with -addr")
		os.Exit(2)
	}
	if cfg.dbCPUs != "" && (cfg.databaseURL != "" || cfg.addr != "") {
		fmt.Fprintln(os.Stderr, "ledgerbench: -db-cpus places the throwaway cluster; it does not go with -database-url or -addr")
		os.Exit(2)
	}
	if *from != "" {
		var results []bench.Result
		b, err := os.ReadFile(*from)
		if err == nil {
			err = json.Unmarshal(b, &results)
		}
		if err == nil {
			cfg.jsonPath = "" // it is the input
			err = output(cfg, results)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "ledgerbench:", err)
			os.Exit(1)
		}
		return
	}
	if *cpuprofile != "" {
		if f, err := os.Create(*cpuprofile); err == nil {
			_ = pprof.StartCPUProfile(f)
		}
	}
	if *traceFile != "" {
		if f, err := os.Create(*traceFile); err == nil {
			_ = trace.Start(f)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err = run(ctx, cfg)
	stop()
	pprof.StopCPUProfile()
	trace.Stop()
	if *memprofile != "" {
		if f, err := os.Create(*memprofile); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			_ = f.Close()
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config) error {
	var results []bench.Result
	emit := func(r bench.Result) {
		results = append(results, r)
		store := "" // what the store behind the target says of its writes
		if r.BatchCalls > 0 {
			store = fmt.Sprintf("  batches of %.1f calls, %.1f in flight", r.BatchCalls, r.BatchBusy)
			if r.RoundTripMs > 0 {
				store += fmt.Sprintf(", round trip %.2f ms", r.RoundTripMs)
			}
		}
		if r.LogSyncs > 0 {
			store = fmt.Sprintf("  log %.2f syncs/op of %.3f ms, syncing %.0f%%", r.LogSyncs, r.LogSyncMs, 100*r.LogBusy)
		}
		if r.Fdatasyncs != nil {
			store += fmt.Sprintf("  fdatasync %.3f/op", *r.Fdatasyncs)
		}
		if r.CountError != "" {
			store += "  fdatasyncs not counted: " + r.CountError
		}
		if r.LogError != "" {
			store += "  log syncs not read: " + r.LogError
		}
		fmt.Fprintf(os.Stderr, "%-28s %-7s %4d clients: %8.0f ops/s  p50 %6.2f ms  p99 %7.2f ms  p99.9 %7.2f ms  cpu %5.0f µs/op  db %5.0f µs/op  alloc %6.1f KiB/op  %5.1f GCs/kop%s  errors %d %s\n",
			r.Target, r.Workload, r.Clients, r.PerSecond, r.P50ms, r.P99ms, r.P999ms, r.CPUus, r.DBCPUus, r.AllocKB, r.GCs, store, r.Errors, r.FirstError)
	}
	// ledgerd's binary, for the embedded store's process and the waiters:
	// -ledgerd, or built once a run.
	var removeBuild func()
	defer func() {
		if removeBuild != nil {
			removeBuild()
		}
	}()
	ledgerdBin := sync.OnceValues(func() (string, error) {
		bin, cleanup, err := ledgerdBinary(cfg.ledgerdBin)
		removeBuild = cleanup
		return bin, err
	})
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	if len(cfg.batchInFlight) == 0 {
		cfg.batchInFlight = []int{0} // the store's default
	}
	if len(cfg.outcomeSizes) == 0 {
		cfg.outcomeSizes = []int{bench.DefaultOutcomeSize}
	}
	var outs []*bench.Outcome // the first is every workload's; the others, fresh@size's
	for _, n := range cfg.outcomeSizes {
		o, err := bench.NewOutcome(n)
		if err != nil {
			return err
		}
		outs = append(outs, o)
	}
	out := outs[0]
	var workloads []string
	for _, w := range strings.Split(cfg.workloads, ",") {
		workloads = append(workloads, w)
		for _, o := range outs[1:] {
			if w == "fresh" {
				workloads = append(workloads, freshAt(o))
			}
		}
	}
	// sweep measures the targets' workloads, each point (workload and
	// clients) with the targets in turns (bench.Interleave).
	sweep := func(targets ...target) {
		for _, w := range workloads {
			for _, c := range cfg.clients {
				var subjects []bench.Subject
				for _, t := range targets {
					if op, ok := t.workloads[w]; ok {
						subjects = append(subjects, bench.Subject{Target: t.name, Op: op, Batches: t.batches, LogSyncs: t.logSyncs, Fdatasyncs: t.fdatasyncs, Procs: t.procs})
					}
				}
				if len(subjects) == 0 {
					continue
				}
				for _, r := range bench.Interleave(ctx, w, c, cfg.duration, cfg.rounds, subjects...) {
					emit(r)
				}
			}
		}
	}
	// Only the replay workload needs completed keys first; without it, a
	// ledger's first point starts on an empty table, as a new ledger does.
	replays := slices.Contains(strings.Split(cfg.workloads, ","), "replay")
	ledgerWork := func(client ledgerv1.LedgerServiceClient, tag string) (map[string]bench.Op, error) {
		l := &bench.Ledger{Client: client, Tenant: "acme", Prefix: prefix + tag, Outcome: out}
		if replays {
			if err := l.PrepareReplays(ctx); err != nil {
				return nil, fmt.Errorf("prepare replays: %w", err)
			}
		}
		work := map[string]bench.Op{"fresh": l.Fresh(), "replay": l.Replay(), "hot": l.Hot()}
		addSizes(work, outs, func(o *bench.Outcome) bench.Op { l := *l; l.Outcome = o; return l.Fresh() })
		return work, nil
	}

	if cfg.addr != "" {
		// The transport a write service's guard dials with: fixed windows,
		// so no bandwidth probes (PINGs as answers are read, each
		// acknowledged by ledgerd with a write of its own).
		conn, err := grpc.NewClient(cfg.addr, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUnaryInterceptor(func(ctx context.Context, m string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, o ...grpc.CallOption) error {
				if cfg.token != "" {
					ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+cfg.token)
				}
				return inv(ctx, m, req, reply, cc, o...)
			}))...)
		if err != nil {
			return err
		}
		defer conn.Close()
		var targets []target
		for _, api := range cfg.apis {
			client := ledgerv1.NewLedgerServiceClient(conn)
			name := "ledgerd/" + cfg.addr
			if api == "stream" {
				// The stream carries the token.
				sc := ledgerclient.New(client, ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+cfg.token)))
				defer sc.Close()
				client, name = sc, name+" (stream)"
			}
			work, err := ledgerWork(client, "remote"+api)
			if err != nil {
				return err
			}
			if cfg.rate > 0 {
				emit(bench.Paced(ctx, name, work["fresh"], cfg.rate, int(cfg.rate*cfg.duration.Seconds())))
				continue
			}
			targets = append(targets, target{name: name, workloads: work})
		}
		if cfg.rate > 0 {
			return output(cfg, results)
		}
		// With the database too, direct SQL on it runs in turns with the
		// running ledgerd.
		if cfg.databaseURL != "" {
			db, err := openDB(cfg, "postgres")
			if err != nil {
				return err
			}
			defer db.stop()
			_, closeStore, pool, err := openStore(ctx, cfg, "postgres", db, variant{})
			if err != nil {
				return err
			}
			defer closeStore()
			sql, err := sqlTarget(ctx, pool, prefix, "", replays, outs)
			if err != nil {
				return err
			}
			targets = append(targets, sql)
		}
		sweep(targets...)
		return output(cfg, results)
	}

	var stores []string
	for _, s := range strings.Split(cfg.stores, ",") {
		if s = strings.TrimSpace(s); s != "" {
			stores = append(stores, s)
		}
	}
	// The stores in ledgerd's process, which run beside a Redis, and that
	// Redis have their fdatasync calls counted (PostgreSQL syncs in
	// processes of its own, for ledgerd and direct SQL alike).
	inProcess := func(name string) bool { return name == "embedded" || name == "memory" }
	var counter func(pid int) bench.FdatasyncCount
	if slices.ContainsFunc(stores, inProcess) {
		counter = fdatasyncCounter()
	}
	for _, name := range stores {
		local := inProcess(name)
		// The variants of a store run in turns, on one database.
		variants := []variant{{}}
		if name == "postgres" {
			variants = nil
			if cfg.batching != "only" {
				variants = append(variants, variant{})
			}
			if cfg.batching != "off" {
				for _, n := range cfg.batchInFlight {
					variants = append(variants, variant{batching: true, inFlight: n})
				}
			}
		}
		db, err := openDB(cfg, name)
		if err != nil {
			return err
		}
		var targets []target
		var closers []func()
		ledgers := map[string]ledgerv1.LedgerServiceClient{}
		for _, v := range variants {
			st, closeStore, pool, err := openStore(ctx, cfg, name, db, v)
			if err != nil {
				return err
			}
			ledgerd := "ledgerd/" + name
			if v.batching {
				ledgerd += "+batching"
				if v.inFlight > 0 {
					ledgerd += fmt.Sprintf(" inflight=%d", v.inFlight)
				}
			}
			if pool != nil {
				ledgerd += cfg.dbTag()
			}
			procs := cfg.procs(name)
			if procs > 0 {
				ledgerd += fmt.Sprintf(" GOMAXPROCS=%d", procs)
			}
			client, stopServer, err := serveLedger(st)
			if err != nil {
				closeStore()
				return err
			}
			closers = append(closers, stopServer, closeStore)
			for _, api := range cfg.apis {
				c, t := client, ledgerd
				if api == "stream" {
					sc := ledgerclient.New(client)
					closers = append(closers, func() { _ = sc.Close() })
					c, t = sc, ledgerd+" (stream)"
				}
				ledgers[strings.TrimPrefix(ledgerd, "ledgerd/")+"|"+api] = c
				work, err := ledgerWork(c, fmt.Sprintf("%s-%t-%d-%s", name, v.batching, v.inFlight, api))
				if err != nil {
					return err
				}
				var batches func() crdb.BatchStats
				if s, ok := st.(*crdb.Store); ok && v.batching {
					batches = s.BatchStats
				}
				var logSyncs func() (uint64, time.Duration, error)
				if s, ok := st.(*pebble.Store); ok {
					logSyncs = func() (uint64, time.Duration, error) {
						w := s.WALSyncs()
						return w.Count, w.Sum, nil
					}
				}
				var fdatasyncs bench.FdatasyncCount
				if local && counter != nil {
					fdatasyncs = counter(os.Getpid())
				}
				targets = append(targets, target{name: t, workloads: work, batches: batches, logSyncs: logSyncs, fdatasyncs: fdatasyncs, procs: procs})
			}
			// Direct SQL runs in turns with the variants, once.
			if pool != nil && v == variants[len(variants)-1] {
				sql, err := sqlTarget(ctx, pool, prefix, cfg.dbTag(), replays, outs)
				if err != nil {
					return err
				}
				targets = append(targets, sql)
			}
		}
		if name == "embedded" && cfg.process {
			bin, err := ledgerdBin()
			if err != nil {
				return err
			}
			ts, stop, err := processTargets(ctx, cfg.apis, bin, ledgerWork, counter)
			if err != nil {
				return err
			}
			closers = append(closers, stop)
			targets = append(targets, ts...)
		}
		if local && cfg.redis {
			peer, stop, err := redisTarget(ctx, prefix+name, cfg.redisFsync, replays, outs, counter, emit)
			if err != nil {
				return err
			}
			closers = append(closers, stop)
			if peer.name != "" {
				targets = append(targets, peer)
			}
		}
		sweep(targets...)
		if cfg.interceptor && name == "embedded" {
			if err := measureInterceptor(ctx, cfg, ledgers, prefix, emit); err != nil {
				return err
			}
		}
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
		db.stop()
	}
	if cfg.waiters > 0 {
		bin, err := ledgerdBin()
		if err != nil {
			return err
		}
		for _, api := range cfg.apis {
			r, err := bench.Waiters(ctx, bin, cfg.waiters, api)
			if err != nil {
				return fmt.Errorf("waiters over %s: %w", api, err)
			}
			fmt.Fprintf(os.Stderr, "%s: %d waiters, %.1f MiB above idle\n", r.Target, r.Clients, r.RSSAboveIdleMB)
			results = append(results, r)
		}
	}
	if cfg.growth.Records > 0 {
		g := cfg.growth
		g.Outcome, g.Measure = cfg.outcomeSizes[0], cfg.duration
		fmt.Printf("\n%s, %d-byte outcomes:\n\n", growth.Target(g), g.Outcome)
		rs, err := growth.Run(ctx, g, os.Stdout)
		if err != nil {
			return fmt.Errorf("growth: %w", err)
		}
		results = append(results, rs...)
	}
	return output(cfg, results)
}

// processName is the name of the embedded store's targets served by a
// ledgerd process of its own.
const processName = "ledgerd/embedded, own process"

// processTargets are the embedded store as its users run it: ledgerd's
// binary bin started as the README starts it, with every interceptor of
// the daemon and its own Ps sized to its load, its data in a temporary
// directory on the disk of the in-process store's, and its clients here,
// as Redis's are: a target for each API, and what stops it.
func processTargets(ctx context.Context, apis []string, bin string, ledgerWork func(ledgerv1.LedgerServiceClient, string) (map[string]bench.Op, error),
	counter func(pid int) bench.FdatasyncCount) (ts []target, stop func(), err error) {
	dir, err := os.MkdirTemp("", "ledgerbench-process-")
	if err != nil {
		return nil, nil, err
	}
	l, err := bench.StartLedgerd(ctx, bin, filepath.Join(dir, "data"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	closers := []func(){func() { _ = os.RemoveAll(dir) }, l.Stop}
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	for _, api := range apis {
		client, name := ledgerv1.NewLedgerServiceClient(l.Conn), processName
		if api == "stream" {
			sc := ledgerclient.New(client)
			closers = append(closers, func() { _ = sc.Close() })
			client, name = sc, name+" (stream)"
		}
		work, err := ledgerWork(client, "process-"+api)
		if err != nil {
			stop()
			return nil, nil, err
		}
		t := target{name: name, workloads: work, logSyncs: l.WALSyncs}
		if counter != nil {
			t.fdatasyncs = counter(l.Pid())
		}
		ts = append(ts, t)
	}
	return ts, stop, nil
}

// procs is GOMAXPROCS for the in-process ledgerd of a store; 0: every
// core.
func (cfg config) procs(store string) int {
	if n, ok := cfg.ledgerdProcs[store]; ok {
		return n
	}
	return cfg.ledgerdProcs[""]
}

// parseProcs reads -ledgerd-procs: a number for every store, or store=n
// pairs.
func parseProcs(s string) (map[string]int, error) {
	procs := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		store, n, ok := strings.Cut(part, "=")
		if !ok {
			store, n = "", part
		}
		v, err := strconv.Atoi(n)
		if err != nil || v < 0 || !slices.Contains([]string{"", "memory", "embedded", "postgres"}, store) {
			return nil, fmt.Errorf("bad -ledgerd-procs %q: a number, or store=number pairs of memory, embedded and postgres", s)
		}
		procs[store] = v
	}
	return procs, nil
}

// ledgerdBinary is bin, or ledgerd built from ./cmd/ledgerd when bin is
// empty, and what removes the build.
func ledgerdBinary(bin string) (string, func(), error) {
	if bin != "" {
		return bin, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "ledgerbench-ledgerd-")
	if err != nil {
		return "", nil, err
	}
	bin = filepath.Join(dir, "ledgerd")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/ledgerd").CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("build ledgerd (run from the repository's root, or pass -ledgerd): %w\n%s", err, out)
	}
	return bin, func() { _ = os.RemoveAll(dir) }, nil
}

func output(cfg config, results []bench.Result) error {
	fmt.Print(bench.Markdown(results))
	fmt.Print(bench.Syncs(results))
	fmt.Print(bench.WaitersTable(results))
	var peers []string // Redis, one target an appendfsync setting
	for _, r := range results {
		if strings.HasPrefix(r.Target, redisPrefix) && !slices.Contains(peers, r.Target) {
			peers = append(peers, r.Target)
		}
	}
	for _, peer := range peers {
		fmt.Print(bench.Ratios(results, "ledgerd/embedded", peer))
		fmt.Print(bench.Ratios(results, "ledgerd/memory", peer))
	}
	fmt.Print(bench.Ratios(results, "ledgerd/embedded", floorName))
	var sqls []string // direct SQL, one target a durability setting
	for _, r := range results {
		if strings.HasPrefix(r.Target, "sql/postgres") && !slices.Contains(sqls, r.Target) {
			sqls = append(sqls, r.Target)
		}
	}
	for _, sql := range sqls {
		fmt.Print(bench.Ratios(results, "ledgerd/postgres", sql))
	}
	fmt.Print(goalsTable(results))
	if cfg.jsonPath != "" {
		b, err := json.MarshalIndent(results, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.jsonPath, b, 0o644); err != nil {
			return err
		}
	}
	if cfg.pngPath != "" {
		return bench.Plot(results, "fresh", "Begin+Complete on fresh keys (ledgerd over loopback gRPC vs direct SQL)", cfg.pngPath)
	}
	return nil
}

// sqlTarget is the store's statements sent straight through pool; tag
// qualifies its name (dbTag).
func sqlTarget(ctx context.Context, pool *pgxpool.Pool, prefix, tag string, replays bool, outs []*bench.Outcome) (target, error) {
	sql := &bench.SQL{Pool: pool, Prefix: prefix + "sql", Outcome: outs[0]}
	if replays {
		if err := sql.PrepareReplays(ctx); err != nil {
			return target{}, err
		}
	}
	work := map[string]bench.Op{"fresh": sql.Fresh(), "replay": sql.Replay(), "hot": sql.Hot()}
	addSizes(work, outs, func(o *bench.Outcome) bench.Op { sql := *sql; sql.Outcome = o; return sql.Fresh() })
	return target{name: "sql/postgres" + tag + " (pgx)", workloads: work}, nil
}

// freshAt names the fresh workload at o's size, when it is not the
// first size.
func freshAt(o *bench.Outcome) string { return "fresh@" + strconv.Itoa(o.Size()) }

// addSizes adds to a target's work the fresh workload at each outcome size
// after the first: at(o) is that target's fresh workload storing o.
func addSizes(work map[string]bench.Op, outs []*bench.Outcome, at func(*bench.Outcome) bench.Op) {
	for _, o := range outs[1:] {
		work[freshAt(o)] = at(o)
	}
}

// redisPrefix names the Redis peer, followed by its appendfsync; floorName
// names the fsync floor's result.
const (
	redisPrefix = "redis appendfsync="
	floorName   = "floor: 2 fdatasyncs a pair"
)

// redisTarget starts a Redis of that appendfsync on the disk the embedded
// store uses and returns it as a target, after emitting that disk's fsync floor as a
// result of its own. Without redis-server it says so and returns no
// target.
func redisTarget(ctx context.Context, prefix, appendfsync string, replays bool, outs []*bench.Outcome,
	counter func(pid int) bench.FdatasyncCount, emit func(bench.Result)) (target, func(), error) {
	dir, err := os.MkdirTemp("", "ledgerbench-redis-")
	if err != nil {
		return target{}, nil, err
	}
	const samples = 500
	floor, err := bench.FsyncFloor(dir, samples)
	if err != nil {
		_ = os.RemoveAll(dir)
		return target{}, nil, err
	}
	pair := 2 * floor
	emit(bench.Result{Target: floorName, Workload: "fresh", Clients: 1, Ops: samples, PerSecond: float64(time.Second) / float64(pair),
		P50ms: float64(pair.Microseconds()) / 1000})
	addr, pid, stop, err := bench.StartRedis(ctx, dir, appendfsync)
	if errors.Is(err, exec.ErrNotFound) {
		fmt.Fprintln(os.Stderr, "ledgerbench: redis-server is not on the PATH: the embedded store is measured without its Redis peer")
		return target{}, func() { _ = os.RemoveAll(dir) }, nil
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return target{}, nil, err
	}
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 256})
	closeAll := func() { _ = client.Close(); stop(); _ = os.RemoveAll(dir) }
	r := &bench.Redis{Client: client, Prefix: prefix + "redis", Outcome: outs[0]}
	if replays {
		if err := r.PrepareReplays(ctx); err != nil {
			closeAll()
			return target{}, nil, err
		}
	}
	work := map[string]bench.Op{"fresh": r.Fresh(), "replay": r.Replay(), "hot": r.Hot()}
	addSizes(work, outs, func(o *bench.Outcome) bench.Op { r := *r; r.Outcome = o; return r.Fresh() })
	t := target{name: redisPrefix + appendfsync, workloads: work}
	if counter != nil {
		t.fdatasyncs = counter(pid)
	}
	return t, closeAll, nil
}

// dbTag qualifies the names of the PostgreSQL targets: " fsync=off" when
// the throwaway cluster runs without durability (-durable=false). Of a
// database given by -database-url the command knows nothing, and says
// nothing.
func (cfg config) dbTag() string {
	tag := ""
	if !cfg.durable && cfg.databaseURL == "" {
		tag = " fsync=off"
	}
	if cfg.dbRTT > 0 {
		tag += " rtt=" + cfg.dbRTT.String()
	}
	return tag
}

// variant is how a store is set up: for postgres, with batching or
// without, and the batches in flight (0: the store's default).
type variant struct {
	batching bool
	inFlight int
}

// database is the PostgreSQL a postgres store's variants share.
type database struct {
	url  string
	stop func()
}

// openDB starts the throwaway cluster for postgres (unless -database-url
// gives one), behind a delaying proxy with -db-rtt.
func openDB(cfg config, name string) (database, error) {
	if name != "postgres" {
		return database{stop: func() {}}, nil
	}
	url, stop := cfg.databaseURL, func() {}
	if url == "" {
		start := pgtest.StartCluster
		if cfg.durable {
			start = pgtest.StartDurableCluster
		}
		pg, err := start()
		if err != nil {
			return database{}, err
		}
		url, stop = pg.URL, pg.Stop
		if cfg.dbCPUs != "" {
			if err := placeCluster(pg, cfg.dbCPUs); err != nil {
				stop()
				return database{}, err
			}
		}
	}
	if cfg.dbRTT > 0 {
		far, err := farURL(url, cfg.dbRTT)
		if err != nil {
			stop()
			return database{}, err
		}
		stopDB := stop
		url, stop = far.url, func() { _ = far.proxy.Close(); stopDB() }
	}
	return database{url: url, stop: stop}, nil
}

// openStore opens a store in process; for postgres, on db, it also returns
// a pool of the same size for direct SQL.
func openStore(ctx context.Context, cfg config, name string, db database, v variant) (ledger.Store, func(), *pgxpool.Pool, error) {
	switch name {
	case "memory":
		return memory.New(memory.Config{}), func() {}, nil, nil
	case "embedded":
		dir, err := os.MkdirTemp("", "ledgerbench-embedded-")
		if err != nil {
			return nil, nil, nil, err
		}
		s, err := pebble.Open(dir, pebble.Config{})
		if err != nil {
			return nil, nil, nil, err
		}
		return s, func() { _ = s.Close(); _ = os.RemoveAll(dir) }, nil, nil
	case "postgres":
		url, sep := db.url, "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		if cfg.pool > 0 {
			url += sep + "pool_max_conns=" + strconv.Itoa(cfg.pool)
		}
		s, err := crdb.Open(ctx, url, crdb.Config{Batching: v.batching, BatchInFlight: v.inFlight, MaxBatchedOutcome: cfg.maxBatchedOutcome})
		if err != nil {
			return nil, nil, nil, err
		}
		if _, err := s.Migrate(ctx); err != nil {
			s.Close()
			return nil, nil, nil, err
		}
		return s, s.Close, s.Pool(), nil
	}
	return nil, nil, nil, fmt.Errorf("unknown store %q", name)
}

// placeCluster pins pg to the CPUs in the list cpus and this process to the
// others.
func placeCluster(pg *pgtest.Cluster, cpus string) error {
	pid, err := pg.PID()
	if err != nil {
		return err
	}
	db, rest, err := bench.Place(pid, cpus)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "PostgreSQL on CPUs %s; this process (clients and ledgerd) on CPUs %s\n", db, rest)
	return nil
}

// serveLedger serves the LedgerService over loopback gRPC, as ledgerd does
// in dev mode, and returns a client of it.
func serveLedger(st ledger.Store) (ledgerv1.LedgerServiceClient, func(), error) {
	dev := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "bench", Tenants: []string{"*"}}, nil
	})
	gs := grpc.NewServer(server.TransportOptions()...)
	ledgerv1.RegisterLedgerServiceServer(gs, server.New(ledger.New(st, ledger.Config{}), server.Config{Auth: dev}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		gs.Stop()
		return nil, nil, err
	}
	return ledgerv1.NewLedgerServiceClient(conn), func() { _ = conn.Close(); gs.Stop() }, nil
}

// fixedInvoices answers every CreateInvoice at once: the handler costs
// nothing, so what is measured is the RPC and the interceptor.
type fixedInvoices struct {
	invoicev1.UnimplementedInvoiceServiceServer
}

func (fixedInvoices) CreateInvoice(_ context.Context, req *invoicev1.CreateInvoiceRequest) (*invoicev1.CreateInvoiceResponse, error) {
	return &invoicev1.CreateInvoiceResponse{Invoice: &invoicev1.Invoice{Id: "inv_" + req.GetRequestId(), Tenant: req.GetTenant(), Number: 1, CustomerId: req.GetCustomerId(),
		Currency: req.GetCurrency(), TotalMicros: 42_000_000, CreatedAt: timestamppb.Now()}}, nil
}

// measureInterceptor measures CreateInvoice unprotected and protected by the
// interceptor over each of ledgers, keyed by the ledger's store and API
// ("embedded|stream").
func measureInterceptor(ctx context.Context, cfg config, ledgers map[string]ledgerv1.LedgerServiceClient, prefix string, emit func(bench.Result)) error {
	targets := map[string]grpc.UnaryServerInterceptor{"rpc/unprotected": nil}
	for key, client := range ledgers {
		store, api, _ := strings.Cut(key, "|")
		g, err := guard.New(client)
		if err != nil {
			return err
		}
		icpt, err := grpcguard.UnaryServerInterceptor(g,
			grpcguard.WithMethod("/idemledger.examples.invoice.v1.InvoiceService/CreateInvoice", grpcguard.Method{Policy: guard.Policy{}}),
			grpcguard.WithKeyField("request_id"))
		if err != nil {
			return err
		}
		target := "rpc/protected (" + store + " ledger)"
		if api == "stream" {
			target = "rpc/protected (" + store + " ledger, stream)"
		}
		targets[target] = icpt
	}
	names := slices.Sorted(maps.Keys(targets))
	slices.Reverse(names) // unprotected first
	var subjects []bench.Subject
	for i, target := range names {
		var opts []grpc.ServerOption
		if icpt := targets[target]; icpt != nil {
			opts = append(opts, grpc.UnaryInterceptor(icpt))
		}
		gs := grpc.NewServer(opts...)
		invoicev1.RegisterInvoiceServiceServer(gs, fixedInvoices{})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go func() { _ = gs.Serve(lis) }()
		defer gs.Stop()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer conn.Close()
		w := &bench.Invoices{Client: invoicev1.NewInvoiceServiceClient(conn), Prefix: fmt.Sprint(prefix, "-inv-", i)}
		subjects = append(subjects, bench.Subject{Target: target, Op: w.Write()})
	}
	for _, c := range cfg.clients {
		for _, r := range bench.Interleave(ctx, "write", c, cfg.duration, cfg.rounds, subjects...) {
			emit(r)
		}
	}
	return nil
}

// far is a database reached through a proxy that delays it.
type far struct {
	url   string
	proxy *faultproxy.Proxy
}

// farURL is url through a proxy that adds rtt of round trip to every
// exchange with the database.
func farURL(raw string, rtt time.Duration) (far, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		return far{}, err
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		return far{}, err
	}
	p.SetDelay(rtt / 2)
	u.Host = p.Addr()
	return far{url: u.String(), proxy: p}, nil
}
