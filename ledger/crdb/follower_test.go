package crdb_test

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/lincheck"
)

// laggingReplica is a follower that lags: it answers from a snapshot of
// the database (a REPEATABLE READ transaction) taken when snapshot was last
// called, as a CockroachDB follower answers from its closed timestamp.
type laggingReplica struct {
	mu   sync.Mutex
	conn *pgx.Conn
	tx   pgx.Tx
}

func newLaggingReplica(t *testing.T, url string) *laggingReplica {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	r := &laggingReplica{conn: conn}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		_ = conn.Close(context.Background())
	})
	r.snapshot(t)
	return r
}

// snapshot moves the replica to the database as it is now.
func (r *laggingReplica) snapshot(t testing.TB) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx := context.Background()
	if r.tx != nil {
		_ = r.tx.Rollback(ctx)
	}
	tx, err := r.conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT 1") // the snapshot is taken by the first statement
	}
	if err != nil {
		t.Error(err)
		return
	}
	r.tx = tx
}

func (r *laggingReplica) query(ctx context.Context, sql string, args []any, dest []any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tx.QueryRow(ctx, sql, args...).Scan(dest...)
}

// TestFollowerReadsNeverClaim: a claim that reads a follower first gets,
// whatever the follower's copy says, the leaseholder's answer, and the
// follower answers alone only the replay of a completed record with the
// claim's fingerprint. The copies here lag: the key absent, the attempt in
// progress, the record completed with another fingerprint.
func TestFollowerReadsNeverClaim(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	s := openURL(t, url, crdb.Config{FollowerReads: 10 * time.Second}, true)
	replica := newLaggingReplica(t, url)
	crdb.SetFollowerReader(s, replica.query)
	l := ledger.New(s, ledger.Config{})
	sc := func(k string) ledger.Scope { return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k} }
	begin := func(k, fp string) (ledger.BeginResponse, error) {
		return l.Begin(ctx, ledger.BeginRequest{Scope: sc(k), Fingerprint: ledgertest.Fingerprint(fp), Method: ledgertest.Method})
	}
	complete := func(k string, res ledger.BeginResponse) {
		t.Helper()
		if res.Claim == nil {
			t.Fatalf("%s: not claimed: %+v", k, res)
		}
		if _, err := l.Complete(ctx, sc(k), res.Claim.Token, ledgertest.Response(k)); err != nil {
			t.Fatal(err)
		}
	}
	replays := func(k string) {
		t.Helper()
		res, err := begin(k, "p")
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if res.Claim != nil || res.Replay == nil || !res.Replay.Outcome.Equal(ledgertest.Response(k)) {
			t.Fatalf("%s: Begin = %+v, want the replay of its outcome", k, res)
		}
	}
	stats := func(served, missed uint64) {
		t.Helper()
		if got := s.FollowerReadStats(); got != (crdb.FollowerReadStats{Served: served, Missed: missed}) {
			t.Fatalf("FollowerReadStats = %+v, want %d served and %d missed", got, served, missed)
		}
	}

	// The copy predates the key.
	res, err := begin("absent", "p")
	if err != nil {
		t.Fatal(err)
	}
	stats(0, 1)
	complete("absent", res)
	replays("absent")
	stats(0, 2)

	// The copy has the attempt in progress.
	if res, err = begin("running", "p"); err != nil {
		t.Fatal(err)
	}
	replica.snapshot(t)
	complete("running", res)
	replays("running")
	stats(0, 4)

	// The copy has the record completed: the follower answers.
	replica.snapshot(t)
	replays("absent")
	replays("running")
	stats(2, 4)

	// Another fingerprint: the leaseholder refuses it.
	if _, err := begin("running", "q"); errcode.Of(err) != errcode.KeyReused {
		t.Fatalf("another fingerprint: %v, want KEY_REUSED", err)
	}
	stats(2, 5)

	// A tenant homed here does not read a follower.
	h, err := crdb.ParseHomes(stringsReader("region here primary\nregion away\ndefault here\ntenant remote away\n"))
	if err != nil {
		t.Fatal(err)
	}
	homed, err := crdb.New(ctx, s.Pool(), crdb.Config{FollowerReads: 10 * time.Second, Homes: h, Region: "here"})
	if err != nil {
		t.Fatal(err)
	}
	crdb.SetFollowerReader(homed, replica.query)
	hl := ledger.New(homed, ledger.Config{})
	for _, tenant := range []string{"local", "remote"} {
		scope := ledger.Scope{Namespace: "billing", Tenant: tenant, Key: "k"}
		res, err := hl.Begin(ctx, ledger.BeginRequest{Scope: scope, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hl.Complete(ctx, scope, res.Claim.Token, ledgertest.Response("k")); err != nil {
			t.Fatal(err)
		}
	}
	if got := homed.FollowerReadStats(); got != (crdb.FollowerReadStats{Missed: 1}) {
		t.Fatalf("FollowerReadStats = %+v, want one miss: the remote tenant's new key", got)
	}
	restricted, err := crdb.ParseHomes(stringsReader("region here primary\nregion away\ndefault here\ntenant remote away\nplacement restricted\n"))
	if err != nil {
		t.Fatal(err)
	}
	homed, err = crdb.New(ctx, s.Pool(), crdb.Config{FollowerReads: 10 * time.Second, Homes: restricted, Region: "here"})
	if err != nil {
		t.Fatal(err)
	}
	scope := ledger.Scope{Namespace: "billing", Tenant: "remote", Key: "k"}
	if res, err := ledger.New(homed, ledger.Config{}).Begin(ctx, ledger.BeginRequest{Scope: scope, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}); err != nil || res.Replay == nil {
		t.Fatalf("the replay under restricted placement = %+v, %v", res, err)
	}
	if got := homed.FollowerReadStats(); got != (crdb.FollowerReadStats{}) {
		t.Fatalf("FollowerReadStats under restricted placement = %+v: no replica is near, no follower read", got)
	}
	if _, err := crdb.New(ctx, s.Pool(), crdb.Config{Homes: h, Region: "elsewhere"}); err == nil {
		t.Error("a region the homes do not declare was taken")
	}
}

// TestFollowerReadsExpiry: a copy of a completed record whose retention
// ends within FollowerReads is not replayed from: the leaseholder answers.
func TestFollowerReadsExpiry(t *testing.T) {
	ctx := t.Context()
	clock := ledgertest.NewClock(ledgertest.Start)
	url := pgtest.NewDatabase(t)
	base := openURL(t, url, crdb.Config{}, true)
	s, err := crdb.New(ctx, base.Pool(), crdb.Config{Now: clock.Now, FollowerReads: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k"}
	req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Retention: time.Hour}
	res, err := l.Begin(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(ctx, sc, res.Claim.Token, ledgertest.Response("k")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour - 20*time.Second)
	if res, err := l.Begin(ctx, req); err != nil || res.Replay == nil {
		t.Fatalf("Begin = %+v, %v; want a replay", res, err)
	}
	if got := s.FollowerReadStats(); got.Served != 1 || got.Missed != 1 {
		t.Fatalf("FollowerReadStats = %+v, want the replay served by the follower (and the claim missed)", got)
	}
	clock.Advance(15 * time.Second) // 5 s of retention left: less than FollowerReads
	if res, err := l.Begin(ctx, req); err != nil || res.Replay == nil {
		t.Fatalf("Begin = %+v, %v; want a replay", res, err)
	}
	if got := s.FollowerReadStats(); got.Served != 1 || got.Missed != 2 {
		t.Fatalf("FollowerReadStats = %+v, want the second replay from the leaseholder", got)
	}
}

// TestLinearizableFollowerReads runs the history with every claim reading
// a follower first, from a snapshot that lags by a few milliseconds to a
// whole phase: what the callers saw is still linearizable.
func TestLinearizableFollowerReads(t *testing.T) {
	url := pgtest.NewDatabase(t)
	base := openURL(t, url, crdb.Config{}, true)
	replica := newLaggingReplica(t, url)
	var total crdb.FollowerReadStats
	for run := range 4 {
		batching := run%2 == 1
		t.Run(map[bool]string{false: "one", true: "batching"}[batching], func(t *testing.T) {
			var stores []*crdb.Store
			lincheck.Run(t, func(now func() time.Time) ledger.Store {
				s, err := crdb.New(t.Context(), base.Pool(), crdb.Config{Now: now, FollowerReads: time.Second, Batching: batching, MaxBatch: 8, BatchInFlight: 2})
				if err != nil {
					t.Fatal(err)
				}
				crdb.SetFollowerReader(s, replica.query)
				stores = append(stores, s)
				return s
			}, lincheck.Config{Fault: lincheck.Every(500*time.Microsecond, 3500*time.Microsecond, func() { // the replica's lag: the history's faults
				if rand.IntN(4) > 0 { // now and then the copy stays behind a phase
					replica.snapshot(t)
				}
			})})
			var st crdb.FollowerReadStats
			for _, s := range stores {
				st.Served += s.FollowerReadStats().Served
				st.Missed += s.FollowerReadStats().Missed
			}
			total.Served += st.Served
			total.Missed += st.Missed
			t.Logf("the lagging follower served %d replays and missed %d claims", st.Served, st.Missed)
		})
	}
	// How many replays a history makes of records the copy holds completed
	// depends on its seed and on when the snapshots fall: about one
	// history in sixty makes none (48 others served 1 to 68), so the four
	// histories are asked for it together, not each.
	if total.Served == 0 || total.Missed == 0 {
		t.Fatalf("FollowerReadStats of the four histories = %+v: the follower must both serve replays and miss", total)
	}
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
