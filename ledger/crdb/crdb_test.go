package crdb_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openStore opens a migrated store on a fresh database.
func openStore(t testing.TB, cfg crdb.Config) *crdb.Store {
	t.Helper()
	return openURL(t, pgtest.NewDatabase(t), cfg, true)
}

func openURL(t testing.TB, url string, cfg crdb.Config, migrate bool) *crdb.Store {
	t.Helper()
	s, err := crdb.Open(context.Background(), url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if migrate {
		if _, err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestConformance(t *testing.T) {
	base := openStore(t, crdb.Config{})
	if base.Dialect() != crdb.Postgres {
		t.Fatalf("dialect = %s, want postgres", base.Dialect())
	}
	runConformance(t, base)
}

// runConformance runs the suite with stores that share base's pool, each on
// its own fake clock.
func runConformance(t *testing.T, base *crdb.Store) {
	runConformanceWith(t, base, crdb.Config{})
}

// TestConformanceBatching runs the suite with statement batching on.
func TestConformanceBatching(t *testing.T) {
	runConformanceWith(t, openStore(t, crdb.Config{}), crdb.Config{Batching: true, MaxBatch: 8, BatchInFlight: 2})
}

// TestConformanceRegions runs the suite with homes (its tenants in two
// regions, batched apart), and every claim of a tenant homed away reading
// a follower first (on PostgreSQL, the primary).
func TestConformanceRegions(t *testing.T) {
	h, err := crdb.ParseHomes(strings.NewReader("region here primary\nregion away\ndefault away\ntenant acme here\n"))
	if err != nil {
		t.Fatal(err)
	}
	runConformanceWith(t, openStore(t, crdb.Config{}), crdb.Config{Batching: true, MaxBatch: 8, Homes: h, Region: "here", FollowerReads: time.Second})
}

func runConformanceWith(t *testing.T, base *crdb.Store, cfg crdb.Config) {
	cfg.SweepInterval, cfg.SweepBatch = 10*time.Millisecond, 2
	ledgertest.Suite{
		NewStore: func(t *testing.T, now func() time.Time) ledger.Store {
			cfg.Now = now
			s, err := crdb.New(t.Context(), base.Pool(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		Count: func(t *testing.T, s ledger.Store, ns string) int { return countNamespace(t, s.(*crdb.Store), ns) },
	}.Run(t)
}

func TestCockroachConformance(t *testing.T) {
	url := os.Getenv("COCKROACH_URL")
	if url == "" {
		t.Skip("COCKROACH_URL is not set: CockroachDB cannot be installed on these machines, so its conformance run needs an external cluster")
	}
	base := openURL(t, url, crdb.Config{}, true)
	if base.Dialect() != crdb.Cockroach {
		t.Fatalf("dialect = %s, want cockroach", base.Dialect())
	}
	runConformance(t, base)
}

// TestDatabaseClock runs the main path on the database's own clock.
func TestDatabaseClock(t *testing.T) {
	s := openStore(t, crdb.Config{})
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k1"}
	req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Second}
	before := time.Now()
	res, err := l.Begin(t.Context(), req)
	if err != nil || res.Claim == nil {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	if d := res.Claim.LeaseExpiresAt.Sub(before); d < 500*time.Millisecond || d > 5*time.Second {
		t.Fatalf("lease ends %s after the call began; the database clock is off", d)
	}
	_, err = l.Begin(t.Context(), req)
	ledgertest.WantCode(t, err, errcode.InProgress)
	if _, err := l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("inv")); err != nil {
		t.Fatal(err)
	}
	again, err := l.Begin(t.Context(), req)
	if err != nil || again.Replay == nil {
		t.Fatalf("Begin = %+v, %v; want a replay", again, err)
	}
}

func TestPingNeedsTheSchema(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := openURL(t, url, crdb.Config{}, false)
	if err := s.Ping(t.Context()); errcode.Of(err) != errcode.Unavailable {
		t.Fatalf("Ping before Migrate = %v, want UNAVAILABLE", err)
	}
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after Migrate = %v", err)
	}
}

func TestNewRefusesReadCommitted(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := crdb.New(t.Context(), pool, crdb.Config{}); err == nil || !strings.Contains(err.Error(), "serializable") {
		t.Fatalf("New on a read-committed pool = %v, want a refusal", err)
	}
}

// TestTwoInstancesRace runs two Ledgers on separate pools against the same
// keys: 16 goroutines on each, for each of 300 keys; with batching, the
// batches of the two instances race too.
func TestTwoInstancesRace(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	for _, tt := range []struct {
		name     string
		batching bool
		inFlight int
	}{
		{"batching=false", false, 0},
		{"batching=true", true, 0},
		// Batches in flight at once on each instance, as a distant
		// database gets: longer lock cycles, whose victim may be a
		// single-row statement.
		{"batching=true,inflight=4", true, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			twoInstancesRace(t, crdb.Config{MaxRetries: 30, Batching: tt.batching, BatchInFlight: tt.inFlight})
		})
	}
}

func twoInstancesRace(t *testing.T, cfg crdb.Config) {
	url := pgtest.NewDatabase(t)
	var ledgers [2]*ledger.Ledger
	for i := range ledgers {
		s := openURL(t, url+"&pool_max_conns=16", cfg, i == 0)
		ledgers[i] = ledger.New(s, ledger.Config{})
	}
	const keys, perInstance = 300, 16
	var claims, replays, inProgress, errs atomic.Int64
	const wave = 5
	for k0 := 0; k0 < keys; k0 += wave {
		var wg sync.WaitGroup
		for k := k0; k < min(k0+wave, keys); k++ {
			key := fmt.Sprint("key-", k)
			sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: key}
			for _, l := range ledgers {
				for range perInstance {
					wg.Go(func() {
						res, err := l.Begin(context.Background(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint(key), Method: ledgertest.Method})
						switch {
						case err == nil && res.Claim != nil:
							claims.Add(1)
							if _, err := l.Complete(context.Background(), sc, res.Claim.Token, ledgertest.Response(key)); err != nil {
								errs.Add(1)
								t.Errorf("Complete(%s): %v", key, err)
							}
						case err == nil && res.Replay != nil:
							replays.Add(1)
						case errcode.Of(err) == errcode.InProgress:
							inProgress.Add(1)
						default:
							errs.Add(1)
							t.Errorf("Begin(%s): %v", key, err)
						}
					})
				}
			}
		}
		wg.Wait()
	}
	t.Logf("claims %d, replays %d, in progress %d, errors %d", claims.Load(), replays.Load(), inProgress.Load(), errs.Load())
	if claims.Load() != keys || errs.Load() != 0 || claims.Load()+replays.Load()+inProgress.Load() != keys*perInstance*2 {
		t.Fatalf("claims = %d (want %d), errors = %d (want 0)", claims.Load(), keys, errs.Load())
	}
}

// countNamespace counts the rows of namespace, expired or not.
func countNamespace(t *testing.T, s *crdb.Store, namespace string) (n int) {
	t.Helper()
	if err := s.Pool().QueryRow(t.Context(), `SELECT count(*) FROM idempotency_records WHERE namespace = $1`, namespace).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMigrateFromTwoInstancesAtOnce(t *testing.T) {
	url := pgtest.NewDatabase(t)
	stores := []*crdb.Store{openURL(t, url, crdb.Config{}, false), openURL(t, url, crdb.Config{}, false)}
	var wg sync.WaitGroup
	applied := make([][]int, len(stores))
	errs := make([]error, len(stores))
	for i, s := range stores {
		wg.Go(func() { applied[i], errs[i] = s.Migrate(t.Context()) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	ms, _ := crdb.Migrations(crdb.Postgres)
	if got := len(applied[0]) + len(applied[1]); got != len(ms) {
		t.Fatalf("applied %v and %v; want each of the %d migrations applied once", applied[0], applied[1], len(ms))
	}
	var n int
	if err := stores[0].Pool().QueryRow(t.Context(), `SELECT count(*) FROM idemledger_schema_migrations`).Scan(&n); err != nil || n != len(ms) {
		t.Fatalf("recorded migrations = %d, %v", n, err)
	}
	if again, err := stores[1].Migrate(t.Context()); err != nil || len(again) != 0 {
		t.Fatalf("a second Migrate applied %v, %v; want nothing", again, err)
	}
}

func TestCockroachSQLText(t *testing.T) {
	ms, err := crdb.Migrations(crdb.Cockroach)
	if err != nil || len(ms) == 0 {
		t.Fatalf("cockroach migrations: %v, %v", ms, err)
	}
	schema := ms[0].SQL
	for _, want := range []string{
		"PRIMARY KEY (namespace, tenant, idem_key) USING HASH",
		"ttl_expiration_expression = 'forget_at'",
		"FAMILY lease (",
		"FAMILY result (outcome)",
	} {
		if !strings.Contains(schema, want) {
			t.Errorf("cockroach schema lacks %q", want)
		}
	}
	if strings.Contains(schema[strings.Index(schema, "FAMILY lease"):strings.Index(schema, "FAMILY result")], "outcome") {
		t.Error("the outcome must not share a column family with the lease columns")
	}
}

func TestCountsByState(t *testing.T) {
	ledgertest.CountsByState(t, func(now func() time.Time) ledger.Store { return openStore(t, crdb.Config{Now: now}) })
}
