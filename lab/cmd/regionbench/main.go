// Command regionbench measures what a tenant's home region and the
// database's survival goal cost a protected write, on a multi-region
// CockroachDB simulated over one PostgreSQL: Begin, Complete and replay
// latencies (p50, p99) for a tenant homed in the caller's region and one
// homed far away, under ZONE and REGION survival, with replays read from a
// follower and from the leaseholder.
//
// The simulation. ledgerd runs in region "here". Every statement crosses
// the fault proxy of the far-database benchmark, whose delay is set, for
// each statement, to the round trip that statement would make on
// CockroachDB:
//   - a read (a leaseholder read, the region's ping) goes to the
//     leaseholder of the tenant's home region: -local for a tenant homed
//     here, -far for one homed away;
//   - a write (a claim, a complete) goes to the leaseholder and waits for
//     a quorum of its replicas: under ZONE survival in the home region
//     (-local more), under REGION survival across regions (-neighbour
//     more, the nearest other region);
//   - a follower read goes to the nearest replica: in this region (-local)
//     unless the database's placement is restricted, which keeps a row's
//     replicas in its home region (-far).
//
// Calls run one at a time, so the proxy's delay is the statement's own.
//
//	go run ./lab/cmd/regionbench -samples 200
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	neturl "net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/faultproxy"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

type config struct {
	samples               int
	local, neighbour, far time.Duration
	followerReads         time.Duration
	out                   string
	databaseURL           string
}

func main() {
	var cfg config
	flag.IntVar(&cfg.samples, "samples", 200, "calls measured per operation and scenario, one at a time")
	flag.DurationVar(&cfg.local, "local", time.Millisecond, "round trip within the caller's region")
	flag.DurationVar(&cfg.neighbour, "neighbour", 30*time.Millisecond, "round trip to the nearest other region (REGION survival's quorum)")
	flag.DurationVar(&cfg.far, "far", 80*time.Millisecond, "round trip to the far region a tenant is homed in")
	flag.DurationVar(&cfg.followerReads, "follower-reads", 10*time.Second, "the store's FollowerReads")
	flag.StringVar(&cfg.out, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&cfg.databaseURL, "database-url", "", "a PostgreSQL database to use instead of a throwaway cluster")
	flag.Parse()
	if err := run(context.Background(), cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "regionbench:", err)
		os.Exit(1)
	}
}

// homes: ledgerd runs in "here"; the tenant "far" is homed in "far".
const homes = `region here primary
region neighbour
region far
default here
tenant far far
`

// scenario is one placement of a tenant and one survival goal.
type scenario struct {
	Name, Tenant                  string
	leaseholder, quorum, follower time.Duration
	followerReads                 bool
}

// Row is one measured operation of a scenario.
type Row struct {
	Scenario string  `json:"scenario"`
	Op       string  `json:"op"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	Model    string  `json:"model"`
}

func scenarios(cfg config) []scenario {
	return []scenario{
		{Name: "homed here, ZONE", Tenant: "near", leaseholder: cfg.local, quorum: cfg.local, follower: cfg.local, followerReads: true},
		{Name: "homed here, REGION", Tenant: "near", leaseholder: cfg.local, quorum: cfg.neighbour, follower: cfg.local, followerReads: true},
		{Name: "homed far, ZONE", Tenant: "far", leaseholder: cfg.far, quorum: cfg.local, follower: cfg.local, followerReads: true},
		{Name: "homed far, ZONE, no follower reads", Tenant: "far", leaseholder: cfg.far, quorum: cfg.local, follower: cfg.local},
		{Name: "homed far, ZONE, placement restricted", Tenant: "far", leaseholder: cfg.far, quorum: cfg.local, follower: cfg.far, followerReads: true},
		{Name: "homed far, REGION", Tenant: "far", leaseholder: cfg.far, quorum: cfg.neighbour, follower: cfg.local, followerReads: true},
	}
}

// topology sets the proxy's delay for each statement from the scenario in
// force: the tracer of the store's pool.
type topology struct {
	proxy *faultproxy.Proxy
	now   atomic.Pointer[scenario]
	// replaying: the claims now running find completed records, which
	// they lock and return without writing (no quorum).
	replaying atomic.Bool
	// off leaves the proxy's delay alone.
	off atomic.Bool
}

func (tp *topology) delay(sql string) {
	if tp.off.Load() {
		return
	}
	sc := tp.now.Load()
	if sc == nil {
		tp.proxy.SetDelay(0)
		return
	}
	rtt := sc.leaseholder
	switch {
	case strings.Contains(sql, "COALESCE($4::TIMESTAMPTZ, now()) FROM idempotency_records"): // the follower read
		rtt = sc.follower
	case strings.Contains(sql, "UPDATE idempotency_records"), strings.Contains(sql, "INSERT INTO") && !tp.replaying.Load():
		rtt += sc.quorum
	}
	tp.proxy.SetDelay(rtt / 2)
}

func (tp *topology) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	tp.delay(data.SQL)
	return ctx
}

func (tp *topology) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func run(ctx context.Context, cfg config, w io.Writer) error {
	url := cfg.databaseURL
	if url == "" {
		pg, err := pgtest.StartCluster()
		if err != nil {
			return err
		}
		defer pg.Stop()
		url = pg.URL
	}
	h, err := crdb.ParseHomes(strings.NewReader(homes))
	if err != nil {
		return err
	}
	direct, err := crdb.Open(ctx, url, crdb.Config{})
	if err != nil {
		return err
	}
	_, err = direct.Migrate(ctx)
	if err == nil {
		_, err = direct.ApplyHomes(ctx, h, false)
	}
	direct.Close()
	if err != nil {
		return err
	}

	u, err := neturl.Parse(url)
	if err != nil {
		return err
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		return err
	}
	defer func() { _ = proxy.Close() }()
	proxy.SetDelay(0) // every connection follows the delay the tracer sets
	u.Host = proxy.Addr()
	pc, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return err
	}
	tp := &topology{proxy: proxy}
	pc.ConnConfig.Tracer = tp
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pc.AfterConnect = crdb.ConfigureConn
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return err
	}
	defer pool.Close()

	var rows []Row
	fmt.Fprintf(w, "Round trips: local %v, neighbour %v, far %v. %d calls an operation, one at a time; ms.\n\n", cfg.local, cfg.neighbour, cfg.far, cfg.samples)
	fmt.Fprintln(w, "| tenant, survival goal | Begin (new key) p50 / p99 | Complete p50 / p99 | replay p50 / p99 | replay from |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	for i, sc := range scenarios(cfg) {
		scfg := crdb.Config{Batching: true, BatchInFlight: 1, Homes: h, Region: "here"}
		if sc.followerReads {
			scfg.FollowerReads = cfg.followerReads
		}
		s, err := crdb.New(ctx, pool, scfg)
		if err != nil {
			return err
		}
		l := ledger.New(s, ledger.Config{})
		tp.now.Store(&sc)
		got, err := measure(ctx, l, cfg.samples, sc.Tenant, fmt.Sprint("s", i), &tp.replaying)
		tp.now.Store(nil)
		if err != nil {
			return err
		}
		from := "leaseholder"
		if sc.followerReads && sc.Tenant == "far" {
			from = "follower"
			if st := s.FollowerReadStats(); st.Served < uint64(cfg.samples) {
				return fmt.Errorf("%s: the follower served %d of %d replays", sc.Name, st.Served, cfg.samples)
			}
		}
		fmt.Fprintf(w, "| %s | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %s |\n", sc.Name,
			got[0].P50ms, got[0].P99ms, got[1].P50ms, got[1].P99ms, got[2].P50ms, got[2].P99ms, from)
		for j := range got {
			got[j].Scenario = sc.Name
			got[j].Model = model(sc, got[j].Op)
		}
		rows = append(rows, got...)
	}

	// The simulation against the plain proxy: the far tenant's Begin with
	// every exchange delayed by the far round trip, no tracer.
	plain, err := crdb.New(ctx, pool, crdb.Config{Batching: true, BatchInFlight: 1, Homes: h, Region: "here"})
	if err != nil {
		return err
	}
	tp.off.Store(true)
	proxy.SetDelay(cfg.far / 2)
	cross, err := measure(ctx, ledger.New(plain, ledger.Config{}), cfg.samples, "far", "plain", &tp.replaying)
	proxy.SetDelay(0)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nCheck: the far tenant with every exchange %v away (the proxy alone, no quorum): Begin %.1f / %.1f, Complete %.1f / %.1f, replay %.1f / %.1f.\n",
		cfg.far, cross[0].P50ms, cross[0].P99ms, cross[1].P50ms, cross[1].P99ms, cross[2].P50ms, cross[2].P99ms)
	for j := range cross {
		cross[j].Scenario = "check: every exchange far"
		cross[j].Model = cfg.far.String()
	}
	rows = append(rows, cross...)
	if cfg.out != "" {
		b, err := json.MarshalIndent(struct {
			Local, Neighbour, Far string
			Samples               int
			Rows                  []Row
		}{cfg.local.String(), cfg.neighbour.String(), cfg.far.String(), cfg.samples, rows}, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(cfg.out, append(b, '\n'), 0o644)
	}
	return nil
}

// model is the round trips an operation makes in a scenario.
func model(sc scenario, op string) string {
	follow := sc.followerReads && sc.Tenant == "far"
	switch op {
	case "begin":
		if follow {
			return fmt.Sprintf("follower %v + leaseholder %v + quorum %v", sc.follower, sc.leaseholder, sc.quorum)
		}
		return fmt.Sprintf("leaseholder %v + quorum %v", sc.leaseholder, sc.quorum)
	case "complete":
		return fmt.Sprintf("leaseholder %v + quorum %v", sc.leaseholder, sc.quorum)
	}
	// A replay's claim locks the completed row and writes nothing: no
	// quorum.
	if follow {
		return fmt.Sprintf("follower %v", sc.follower)
	}
	return fmt.Sprintf("leaseholder %v", sc.leaseholder)
}

// measure runs n claims of new keys, their completes, and then their
// replays, one at a time, and returns each's p50 and p99.
func measure(ctx context.Context, l *ledger.Ledger, n int, tenant, prefix string, replaying *atomic.Bool) ([]Row, error) {
	begins, completes, replays := make([]time.Duration, 0, n), make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	outcome := &ledger.Outcome{Response: &anypb.Any{TypeUrl: "type.googleapis.com/bench.Invoice", Value: make([]byte, 500)}}
	req := func(i int) ledger.BeginRequest {
		return ledger.BeginRequest{Scope: ledger.Scope{Namespace: "bench", Tenant: tenant, Key: fmt.Sprint(prefix, "-", i)},
			Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
	}
	// Two calls first, unmeasured: the pool's connection and its
	// statements are ready.
	for i := -2; i < n; i++ {
		start := time.Now()
		res, err := l.Begin(ctx, req(i))
		if err != nil {
			return nil, err
		}
		if res.Claim == nil {
			return nil, fmt.Errorf("key %d was not claimed", i)
		}
		began := time.Now()
		if _, err := l.Complete(ctx, req(i).Scope, res.Claim.Token, outcome); err != nil {
			return nil, err
		}
		if i >= 0 {
			begins, completes = append(begins, began.Sub(start)), append(completes, time.Since(began))
		}
	}
	replaying.Store(true)
	defer replaying.Store(false)
	for i := range n {
		start := time.Now()
		res, err := l.Begin(ctx, req(i))
		if err != nil {
			return nil, err
		}
		if res.Replay == nil {
			return nil, fmt.Errorf("key %d was not replayed", i)
		}
		replays = append(replays, time.Since(start))
	}
	row := func(op string, d []time.Duration) Row {
		slices.Sort(d)
		ms := func(x time.Duration) float64 { return float64(x.Microseconds()) / 1000 }
		return Row{Op: op, P50ms: ms(d[len(d)/2]), P99ms: ms(d[(len(d)*99)/100])}
	}
	return []Row{row("begin", begins), row("complete", completes), row("replay", replays)}, nil
}
