package crdb

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	crdbgo "github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// failFirst installs a trigger that raises a serialization failure (40001)
// on the first n writes to the records table.
func failFirst(t *testing.T, s *Store, n int, deferred bool) {
	t.Helper()
	forceFailures(t, s, n, deferred, "40001")
}

// forceFailures installs a trigger that raises SQLSTATE state on the first
// n writes to the records table; a sequence counts them, because a
// sequence survives the rollback.
func forceFailures(t *testing.T, s *Store, n int, deferred bool, state string) {
	t.Helper()
	timing := "BEFORE INSERT OR UPDATE ON idempotency_records FOR EACH ROW"
	create := "CREATE TRIGGER"
	if deferred {
		// A deferred constraint trigger fires at COMMIT: the COMMIT fails.
		timing = "AFTER INSERT OR UPDATE ON idempotency_records DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
		create = "CREATE CONSTRAINT TRIGGER"
	}
	for _, q := range []string{
		`CREATE SEQUENCE forced_failures`,
		`CREATE FUNCTION force_failure() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   IF nextval('forced_failures') <= ` + itoa(n) + ` THEN
		     RAISE EXCEPTION 'forced failure' USING ERRCODE = '` + state + `';
		   END IF;
		   RETURN NEW;
		 END $$`,
		create + ` force_failure ` + timing + ` EXECUTE FUNCTION force_failure()`,
	} {
		if _, err := s.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func newTestStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(t.Context(), pgtest.NewDatabase(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

func rowCount(t *testing.T, s *Store) (n int) {
	t.Helper()
	if err := s.pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_records`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestForcedFailureIsRetried: a claim and a complete whose statement the
// database rolls back as a serialization failure (40001) or as a
// deadlock's victim (40P01) run again, batched or not, and each happens
// once. A deadlock's victim can be a single-row statement (retry).
func TestForcedFailureIsRetried(t *testing.T) {
	for _, state := range []string{"40001", "40P01"} {
		for _, batching := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batching=%v", state, batching), func(t *testing.T) {
				s := newTestStore(t, Config{MaxRetries: 5, RetryBase: time.Millisecond, Batching: batching})
				// Three failures for the claim, three for the complete.
				forceFailures(t, s, 3, false, state)
				l := ledger.New(s, ledger.Config{})
				sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k"}
				res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
				if err != nil || res.Claim == nil || res.Claim.Token != 1 {
					t.Fatalf("Begin after 3 forced failures = %+v, %v; want the first claim", res, err)
				}
				if _, err := s.pool.Exec(t.Context(), `ALTER SEQUENCE forced_failures RESTART`); err != nil {
					t.Fatal(err)
				}
				rec, err := l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("inv_1"))
				if err != nil || rec.State != ledger.StateCompleted {
					t.Fatalf("Complete after 3 forced failures = %+v, %v; want completed", rec, err)
				}
				if n := rowCount(t, s); n != 1 {
					t.Fatalf("%d rows, want 1", n)
				}
				var used int64
				if err := s.pool.QueryRow(t.Context(), `SELECT last_value FROM forced_failures`).Scan(&used); err != nil || used != 4 {
					t.Fatalf("the complete ran %d times, want 3 failures and a success (%v)", used, err)
				}
			})
		}
	}
}

func TestRetriesRunOutAsContention(t *testing.T) {
	s := newTestStore(t, Config{MaxRetries: 3, RetryBase: time.Millisecond})
	failFirst(t, s, 1000, false)
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k"}
	_, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	if le := ledgertest.WantCode(t, err, errcode.Contention); !le.Retryable() {
		t.Fatal("CONTENTION must be retryable")
	}
	var used int64
	if err := s.pool.QueryRow(t.Context(), `SELECT last_value FROM forced_failures`).Scan(&used); err != nil || used != 4 {
		t.Fatalf("statement ran %d times, want 1 + 3 retries (%v)", used, err)
	}
	if n := rowCount(t, s); n != 0 {
		t.Fatalf("a failed claim left %d rows", n)
	}
}

// TestFailedCommitIsNeverASuccess is the trap of crdbpgxv5.ExecuteTx on
// PostgreSQL: a COMMIT that fails must come back as an error, and a retry
// must run the whole transaction again.
func TestFailedCommitIsNeverASuccess(t *testing.T) {
	insert := func(s *Store) error {
		return s.tx(t.Context(), s.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(t.Context(), `INSERT INTO idempotency_records
				(namespace, tenant, idem_key, state, method, fingerprint, token, attempt, created_at, lease_expires_at, expires_at, claim_id,
				 on_lease_expiry, forget_at, key_source)
				VALUES ('n', 't', 'k', 1, '/a.B/C', 'v2:x', 1, 1, now(), now(), now() + interval '1 hour', '\x00', 0, now() + interval '2 hours', '')`)
			return err
		})
	}
	t.Run("AlwaysFails", func(t *testing.T) {
		s := newTestStore(t, Config{MaxRetries: 2, RetryBase: time.Millisecond})
		failFirst(t, s, 1000, true)
		if err := insert(s); err == nil {
			t.Fatal("a transaction whose COMMIT failed was reported as a success")
		}
		if n := rowCount(t, s); n != 0 {
			t.Fatalf("%d rows after a failed COMMIT", n)
		}
	})
	t.Run("FailsOnce", func(t *testing.T) {
		s := newTestStore(t, Config{MaxRetries: 2, RetryBase: time.Millisecond})
		failFirst(t, s, 1, true)
		if err := insert(s); err != nil {
			t.Fatalf("retry after a failed COMMIT: %v", err)
		}
		if n := rowCount(t, s); n != 1 {
			t.Fatalf("%d rows, want 1", n)
		}
	})
}

// TestClassify walks the SQLSTATE table and the driver's other errors:
// every transient failure is retryable with every store's hint, and only
// what retrying cannot mend is INTERNAL.
func TestClassify(t *testing.T) {
	s := &Store{cfg: Config{}.withDefaults()}
	pg := func(state string) error { return &pgconn.PgError{Code: state, Message: "from the database"} }
	tests := []struct {
		name       string
		err        error
		want       errcode.Code
		retryAfter time.Duration
	}{
		{"SerializationFailure", pg("40001"), errcode.Contention, s.cfg.RetryCap},
		{"Deadlock", pg("40P01"), errcode.Contention, s.cfg.RetryCap},
		{"CockroachRestart", pg("CR000"), errcode.Contention, s.cfg.RetryCap},
		{"LockTimeout", pg("55P03"), errcode.Contention, s.cfg.RetryCap},
		{"OtherRollback", pg("40002"), errcode.Contention, s.cfg.RetryCap},
		{"AmbiguousCommit", pg("40003"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"StatementTimeout", pg("57014"), errcode.UpstreamTimeout, 0},
		{"ReadOnly", pg("25006"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"ConnectionFailure", pg("08006"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"DiskFull", pg("53100"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"OutOfMemory", pg("53200"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"TooManyConnections", pg("53300"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"ConfigurationLimit", pg("53400"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"AdminShutdown", pg("57P01"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"CannotConnectNow", pg("57P03"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"IOError", pg("58030"), errcode.Unavailable, ledger.StoreRetryAfter},
		{"InternalError", pg("XX000"), errcode.Internal, 0},
		{"DataCorrupted", pg("XX001"), errcode.Internal, 0},
		{"UndefinedTable", pg("42P01"), errcode.Internal, 0},
		{"UniqueViolation", pg("23505"), errcode.Internal, 0},
		{"RetriesRanOut", &crdbgo.MaxRetriesExceededError{}, errcode.Contention, s.cfg.RetryCap},
		{"Deadline", context.DeadlineExceeded, errcode.UpstreamTimeout, 0},
		{"Canceled", context.Canceled, errcode.UpstreamTimeout, 0},
		{"ClosedPool", puddle.ErrClosedPool, errcode.Unavailable, ledger.StoreRetryAfter},
		{"BrokenConnection", io.ErrUnexpectedEOF, errcode.Unavailable, ledger.StoreRetryAfter},
		{"NoRows", pgx.ErrNoRows, errcode.Internal, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			le := errcode.As(s.classify("x", tt.err))
			if le.Code != tt.want || le.RetryAfter != tt.retryAfter || le.Retryable() != tt.want.Retryable() {
				t.Fatalf("classify = %s (retryable %v, retry-after %s), want %s (retry-after %s)", le.Code, le.Retryable(), le.RetryAfter, tt.want, tt.retryAfter)
			}
			if strings.Contains(le.Message, "from the database") {
				t.Fatalf("the database's text reached the message: %q", le.Message)
			}
		})
	}
}

// TestCanceledStatementIsRetryable: a claim whose statement the database
// cancels (statement_timeout, pg_cancel_backend: SQLSTATE 57014) never
// committed; its caller gets a retryable UPSTREAM_TIMEOUT, and the retry
// claims.
func TestCanceledStatementIsRetryable(t *testing.T) {
	s := newTestStore(t, Config{})
	lock, err := s.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	if _, err := lock.Exec(t.Context(), `LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: "canceled"}
	req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
	done := make(chan error, 1)
	go func() {
		_, err := l.Begin(t.Context(), req)
		done <- err
	}()
	// Cancel the claim's statement once it waits for the lock.
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		var canceled bool
		if err := s.pool.QueryRow(t.Context(), `SELECT count(pg_cancel_backend(pid)) > 0 FROM pg_stat_activity
			WHERE query LIKE '%INSERT INTO idempotency_records%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&canceled); err != nil {
			t.Fatal(err)
		}
		return canceled
	}, "the claim waits on the lock (and is canceled)")
	err = <-done
	if le := errcode.As(err); le.Code != errcode.UpstreamTimeout || !le.Retryable() {
		t.Fatalf("a canceled claim = %v; want a retryable UPSTREAM_TIMEOUT", err)
	}
	_ = lock.Rollback(t.Context())
	res, err := l.Begin(t.Context(), req)
	if err != nil || res.Claim == nil || res.Claim.Token != 1 {
		t.Fatalf("the retry = %+v, %v; want the first claim", res, err)
	}
}

// TestAmbiguousCommitIsResolved raises SQLSTATE 40003 (statement completion
// unknown) once, as CockroachDB may: the claim and the completion still
// happen exactly once.
func TestAmbiguousCommitIsResolved(t *testing.T) {
	s := newTestStore(t, Config{RetryBase: time.Millisecond})
	for _, q := range []string{
		`CREATE SEQUENCE ambiguous`,
		`CREATE FUNCTION ambiguous() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN
		   IF nextval('ambiguous') % 2 = 1 THEN
		     RAISE EXCEPTION 'statement completion unknown' USING ERRCODE = '40003';
		   END IF;
		   RETURN NEW;
		 END $$`,
		`CREATE TRIGGER ambiguous BEFORE INSERT OR UPDATE ON idempotency_records FOR EACH ROW EXECUTE FUNCTION ambiguous()`,
	} {
		if _, err := s.pool.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k"}
	res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	if err != nil || res.Claim == nil || res.Claim.Token != 1 {
		t.Fatalf("Begin after an ambiguous commit = %+v, %v; want the first claim", res, err)
	}
	if _, err := l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("x")); err != nil {
		t.Fatalf("Complete after an ambiguous commit: %v", err)
	}
	rec, err := l.Lookup(t.Context(), sc, 0)
	if err != nil || rec.State != ledger.StateCompleted || rec.Token != 1 {
		t.Fatalf("Lookup = %+v, %v", rec, err)
	}
}

// TestMixedBatchFailures: when a statement of a batch fails with a
// serialization failure, also at COMMIT after its rows were read, the
// batch runs again and every call gets the answer of the attempt that
// committed; when the failures do not stop, every call ends in CONTENTION
// and nothing is written.
func TestMixedBatchFailures(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int
		deferred bool
	}{
		{"ClaimFailsOnce", 1, false},
		{"ClaimCommitFailsOnce", 1, true},
		{"AlwaysFails", 1000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			s := newTestStore(t, Config{Batching: true, MaxRetries: 3, RetryBase: time.Millisecond})
			held, err := s.claimOne(ctx, testClaim("held"), []byte("setup"))
			if err != nil || !held.Claimed {
				t.Fatalf("claim = %+v, %v", held, err)
			}
			// The first write of the batch is its claim's: claims run first.
			failFirst(t, s, tc.failures, tc.deferred)
			fresh, complete := claimOp(ctx, "fresh"), completeOp(ctx, t, "held", held.Record.Token, "inv_held")
			s.runOps(ctx, "", []*call[op, opResult]{complete, fresh})
			claimed, completed := <-fresh.done, <-complete.done
			rec, getErr := s.Get(ctx, testScope("held"))

			if tc.failures > 1 {
				ledgertest.WantCode(t, claimed.err, errcode.Contention)
				ledgertest.WantCode(t, completed.err, errcode.Contention)
				if n := rowCount(t, s); n != 1 || getErr != nil || rec.State != ledger.StateInProgress {
					t.Fatalf("%d rows, held = %+v, %v; want only held, in progress", n, rec, getErr)
				}
				return
			}
			if claimed.err != nil || !claimed.r.claim.Claimed || claimed.r.claim.Record.Token != 1 {
				t.Fatalf("claim = %+v, %v; want claimed, token 1", claimed.r.claim, claimed.err)
			}
			if completed.err != nil || completed.r.rec.State != ledger.StateCompleted {
				t.Fatalf("complete = %+v, %v; want completed", completed.r.rec, completed.err)
			}
			got, err := s.get(ctx, testScope("fresh"))
			if err != nil || got.rec.State != ledger.StateInProgress || got.rec.Token != 1 || string(got.claimID) != "batch-fresh" {
				t.Fatalf("fresh = %+v (claim id %q), %v; want the batch's claim", got.rec, got.claimID, err)
			}
			if getErr != nil || rec.State != ledger.StateCompleted || !rec.Outcome.Equal(ledgertest.Response("inv_held")) {
				t.Fatalf("held = %+v, %v; want completed", rec, getErr)
			}
		})
	}
}

// TestStoreCallsAreBounded: with the table locked by another session, a
// Begin with no deadline of its own answers a retryable error at the
// ledger's bound, instead of waiting for the lock; and a store opened with
// a lock_timeout answers CONTENTION when the database gives up first.
func TestStoreCallsAreBounded(t *testing.T) {
	url := pgtest.NewDatabase(t)
	migrated, err := Open(t.Context(), url, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(migrated.Close)
	if _, err := migrated.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	lock, err := migrated.pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(context.WithoutCancel(t.Context())) }()
	if _, err := lock.Exec(t.Context(), `LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	req := func(key string) ledger.BeginRequest {
		return ledger.BeginRequest{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: key}, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
	}
	for name, tt := range map[string]struct {
		cfg    Config
		ledger ledger.Config
		want   errcode.Code
	}{
		"LedgerBound":     {Config{StatementTimeout: -1, LockTimeout: -1}, ledger.Config{StoreTimeout: time.Second}, errcode.UpstreamTimeout},
		"DatabaseLockOut": {Config{LockTimeout: 500 * time.Millisecond}, ledger.Config{StoreTimeout: time.Minute}, errcode.Contention},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := Open(t.Context(), url, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			start := time.Now()
			_, err = ledger.New(s, tt.ledger).Begin(context.Background(), req(name))
			took := time.Since(start)
			if le := errcode.As(err); le.Code != tt.want || !le.Retryable() || took > 5*time.Second {
				t.Fatalf("a Begin on a locked table: %v after %v; want a retryable %s within the bound", err, took, tt.want)
			}
		})
	}
}

// TestNoErrorAllocatesNothing: what the retries ask of every statement's
// return, a nil error included, allocates nothing for a nil error
// (errors.As's targets live on the heap).
func TestNoErrorAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _, _ = sqlState(nil), isAmbiguous(nil) }); n != 0 {
		t.Fatalf("%v allocations for a nil error, want 0", n)
	}
}
