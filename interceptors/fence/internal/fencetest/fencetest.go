// Package fencetest is the fence's conformance suite: every driver
// (database/sql, pgx) runs it against a real PostgreSQL, under a guard
// whose ledger keeps time by the test's clock.
package fencetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/fence"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/fencing"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

// DB is a database with the fence table and an invoices table, through
// one driver.
type DB struct {
	// Fences is the driver's fence table.
	Fences interface {
		fencing.Table
		Sweep(ctx context.Context, now time.Time, batch int) (int, error)
	}
	// Begin starts a transaction.
	Begin func(ctx context.Context) (Tx, error)
	// Exec runs a statement of its own.
	Exec func(ctx context.Context, sql string, args ...any) error
	// Int runs a query whose answer is one integer.
	Int func(ctx context.Context, sql string, args ...any) (int, error)
}

// Tx is a transaction of the driver.
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) error
	// Fence is the driver's Write.
	Fence(ctx context.Context, result any) error
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// Schema is what Open applies to a fresh database: the fence table's
// migration, as a service applies it, and the suite's invoices table.
func Schema() ([]string, error) {
	up, err := fs.ReadFile(fence.Migrations, "migrations/postgres/0001_idemledger_fences.up.sql")
	if err != nil {
		return nil, err
	}
	return []string{string(up), `CREATE TABLE invoices (idem_key TEXT NOT NULL, token BIGINT NOT NULL, amount BIGINT NOT NULL)`}, nil
}

// lease is the policies' lease: the test's clock moves past it, the
// wall clock never does within a test.
const lease = time.Minute

// env is one case's guard, clock and database.
type env struct {
	t     *testing.T
	db    DB
	g     *guard.Guard
	clock *ledgertest.Clock
	runs  atomic.Int64
}

// Run runs the suite; open returns a fresh database with Schema applied.
func Run(t *testing.T, open func(t *testing.T) DB) {
	cases := []struct {
		name string
		run  func(e *env)
	}{
		{"TheFirstAttemptCompletesWithItsFence", firstAttempt},
		{"ATakeoverFindsTheFenceAndReplaysWithoutRunning", crashAfterCommit},
		{"ATakeoverFindsNoFenceAndRuns", crashBeforeCommit},
		{"AZombieFailsAtItsCommit", zombie},
		{"ATakeoverWaitsForAnAttemptThatWroteItsFence", takeoverWaits},
		{"ARunThatFailsAfterItsCommitAnswersTheFence", failsAfterCommit},
		{"AnUnknownCommitIsSettled", unknownCommit},
		{"AFenceUnreadableAWhileIsReadAgain", unreadableAWhile},
		{"AFenceThatCannotBeWrittenFailsTheWrite", cannotBeWritten},
		{"AnOutcomeThatCannotBeEncodedFailsTheWrite", cannotBeEncoded},
		{"SweepDeletesExpiredFences", sweep},
		{"ANewRecordOfTheKeyTakesTheFence", newRecord},
		{"NothingIsWrittenOutsideAFencedRun", outsideARun},
		{"AFencedPolicyTakesNoHoldAndNoReconcile", configuration},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db := open(t)
			clock := ledgertest.NewClock(time.Now())
			conn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("payments", clock.Now))).Dial(t)
			g, err := guard.New(ledgerv1.NewLedgerServiceClient(conn), guard.WithCompletion(time.Second, 2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			c.run(&env{t: t, db: db, g: g, clock: clock})
		})
	}
}

// call is a call of the suite's method with key, fenced by the case's
// table.
func (e *env) call(key string) guard.Call {
	return Call(key, guard.Policy{Lease: lease, Fence: e.db.Fences})
}

// Call is a call of the suite's method with key, under policy.
func Call(key string, policy guard.Policy) guard.Call {
	sum := sha256.Sum256([]byte(key))
	return guard.Call{Method: "/billing.v1.Invoices/Create", Key: key, Tenant: "acme", Fingerprint: "v1:" + hex.EncodeToString(sum[:]), Policy: policy}
}

// Outcome is the response a run answers for amount.
func Outcome(amount int) guard.Outcome {
	return guard.Outcome{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: fmt.Appendf(nil, "invoice of %d", amount)}}
}

// write inserts the invoice of the claim in ctx and fences it in tx.
func (e *env) write(ctx context.Context, tx Tx, amount int) error {
	c, _ := guard.ClaimFromContext(ctx)
	if err := tx.Exec(ctx, "INSERT INTO invoices (idem_key, token, amount) VALUES ($1, $2, $3)", c.Key, int64(c.Token), amount); err != nil {
		return err
	}
	return tx.Fence(ctx, Outcome(amount))
}

// commitRun is a run that writes amount's invoice and commits it.
func (e *env) commitRun(amount int) guard.RunFunc {
	return func(ctx context.Context) (guard.Outcome, error) {
		e.runs.Add(1)
		tx, err := e.db.Begin(ctx)
		if err != nil {
			return guard.Outcome{}, err
		}
		if err := e.write(ctx, tx, amount); err != nil {
			_ = tx.Rollback(ctx)
			return guard.Outcome{}, err
		}
		if err := tx.Commit(ctx); err != nil {
			return guard.Outcome{}, fmt.Errorf("%w: %w", guard.ErrOutcomeUnknown, err)
		}
		return Outcome(amount), nil
	}
}

// invoices counts the key's invoices.
func (e *env) invoices(key string) int {
	e.t.Helper()
	n, err := e.db.Int(context.Background(), "SELECT count(*) FROM invoices WHERE idem_key = $1", key)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

// died runs run as a process that dies inside it: the run panics where
// die is called, and the guard neither completes nor releases. It may be
// called from a goroutine of the test's.
func (e *env) died(key string, run func(ctx context.Context, die func())) {
	e.t.Helper()
	type death struct{}
	func() {
		defer func() {
			if r := recover(); r != nil && r != (death{}) {
				panic(r)
			}
		}()
		_, _ = e.g.Do(context.Background(), e.call(key), func(ctx context.Context) (guard.Outcome, error) {
			e.runs.Add(1)
			run(ctx, func() { panic(death{}) })
			return guard.Outcome{}, errors.New("fencetest: the run was to die")
		})
		e.t.Error("the run did not die")
	}()
}

func (e *env) do(key string, run guard.RunFunc) guard.Result {
	e.t.Helper()
	res, err := e.g.Do(context.Background(), e.call(key), run)
	if err != nil {
		e.t.Fatalf("Do: %v", err)
	}
	return res
}

func same(a, b guard.Outcome) bool {
	return a.Response.GetTypeUrl() == b.Response.GetTypeUrl() && string(a.Response.GetValue()) == string(b.Response.GetValue())
}

func firstAttempt(e *env) {
	res := e.do("k1", e.commitRun(100))
	if !res.Fenced || res.Replayed || !same(res.Outcome, Outcome(100)) {
		e.t.Fatalf("first attempt: %+v, want the fenced outcome of 100", res)
	}
	again := e.do("k1", e.commitRun(999))
	if !again.Replayed || !same(again.Outcome, Outcome(100)) || e.runs.Load() != 1 {
		e.t.Fatalf("retry: %+v after %d runs, want the replay of 100 after one", again, e.runs.Load())
	}
	if n := e.invoices("k1"); n != 1 {
		e.t.Fatalf("%d invoices, want 1", n)
	}
}

func crashAfterCommit(e *env) {
	e.died("k1", func(ctx context.Context, die func()) {
		tx, err := e.db.Begin(ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		if err := e.write(ctx, tx, 100); err != nil {
			e.t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			e.t.Fatal(err)
		}
		die() // between the commit and Complete
	})
	e.clock.Advance(lease + time.Second)
	res := e.do("k1", e.commitRun(999))
	if !res.Replayed || !same(res.Outcome, Outcome(100)) {
		e.t.Fatalf("takeover: %+v, want the replay of the committed 100", res)
	}
	if e.runs.Load() != 1 || e.invoices("k1") != 1 {
		e.t.Fatalf("%d runs and %d invoices, want 1 and 1", e.runs.Load(), e.invoices("k1"))
	}
	again := e.do("k1", e.commitRun(999))
	if !again.Replayed || !same(again.Outcome, Outcome(100)) {
		e.t.Fatalf("after the takeover: %+v, want the ledger's replay of 100", again)
	}
}

func crashBeforeCommit(e *env) {
	e.died("k1", func(ctx context.Context, die func()) {
		tx, err := e.db.Begin(ctx)
		if err != nil {
			e.t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // the connection dies with the process
		if err := e.write(ctx, tx, 100); err != nil {
			e.t.Fatal(err)
		}
		die()
	})
	e.clock.Advance(lease + time.Second)
	res := e.do("k1", e.commitRun(200))
	if res.Replayed || !res.Fenced || !same(res.Outcome, Outcome(200)) {
		e.t.Fatalf("takeover: %+v, want its own run's 200", res)
	}
	if e.runs.Load() != 2 || e.invoices("k1") != 1 {
		e.t.Fatalf("%d runs and %d invoices, want 2 and 1", e.runs.Load(), e.invoices("k1"))
	}
}

func zombie(e *env) {
	started, proceed := make(chan struct{}), make(chan struct{})
	var zombieErr, firstErr error
	var first guard.Result
	firstDone := make(chan struct{})
	go func() {
		defer close(firstDone)
		first, firstErr = e.g.Do(context.Background(), e.call("k1"), func(ctx context.Context) (guard.Outcome, error) {
			e.runs.Add(1)
			tx, err := e.db.Begin(ctx)
			if err != nil {
				return guard.Outcome{}, err
			}
			close(started)
			<-proceed // its lease runs out and another attempt takes over
			if zombieErr = e.write(ctx, tx, 100); zombieErr != nil {
				return guard.Outcome{}, zombieErr
			}
			if err := tx.Commit(ctx); err != nil {
				return guard.Outcome{}, err
			}
			return Outcome(100), nil
		})
	}()
	select {
	case <-started:
	case <-firstDone:
		e.t.Fatalf("the first attempt did not run: %v", firstErr)
	}
	e.clock.Advance(lease + time.Second)
	second := e.do("k1", e.commitRun(200))
	close(proceed)
	<-firstDone
	if errcode.Of(zombieErr) != errcode.LeaseLost {
		e.t.Fatalf("the zombie's fence write: %v, want LEASE_LOST", zombieErr)
	}
	if !second.Fenced || !same(second.Outcome, Outcome(200)) {
		e.t.Fatalf("the takeover: %+v, want its own 200", second)
	}
	if firstErr != nil || !same(first.Outcome, Outcome(200)) {
		e.t.Fatalf("the zombie's caller: %+v, %v, want the takeover's 200", first, firstErr)
	}
	if n := e.invoices("k1"); n != 1 {
		e.t.Fatalf("%d invoices, want 1: the zombie's write committed", n)
	}
}

func takeoverWaits(e *env) {
	wrote, commit := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		e.died("k1", func(ctx context.Context, die func()) {
			tx, err := e.db.Begin(ctx)
			if err != nil {
				e.t.Error(err)
				return
			}
			if err := e.write(ctx, tx, 100); err != nil {
				e.t.Error(err)
			}
			close(wrote)
			<-commit
			if err := tx.Commit(ctx); err != nil {
				e.t.Error(err)
			}
			die()
		})
	})
	diedDone := make(chan struct{})
	go func() { wg.Wait(); close(diedDone) }()
	select {
	case <-wrote:
	case <-diedDone:
		e.t.Fatal("the first attempt did not write its fence")
	}
	e.clock.Advance(lease + time.Second)
	var res guard.Result
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err = e.g.Do(context.Background(), e.call("k1"), e.commitRun(999))
	}()
	close(commit) // before or after the takeover reserves: it waits for this commit either way
	<-done
	<-diedDone
	if err != nil || !res.Replayed || !same(res.Outcome, Outcome(100)) {
		e.t.Fatalf("takeover: %+v, %v, want the replay of the committed 100", res, err)
	}
	if e.runs.Load() != 1 || e.invoices("k1") != 1 {
		e.t.Fatalf("%d runs and %d invoices, want 1 and 1", e.runs.Load(), e.invoices("k1"))
	}
}

func failsAfterCommit(e *env) {
	res := e.do("k1", func(ctx context.Context) (guard.Outcome, error) {
		if _, err := e.commitRun(100)(ctx); err != nil {
			return guard.Outcome{}, err
		}
		return guard.Outcome{}, guard.UnknownOutcome("the reply was lost", nil)
	})
	if !res.Fenced || !same(res.Outcome, Outcome(100)) {
		e.t.Fatalf("%+v, want the fenced 100", res)
	}
	again := e.do("k1", e.commitRun(999))
	if !again.Replayed || !same(again.Outcome, Outcome(100)) || e.invoices("k1") != 1 {
		e.t.Fatalf("retry: %+v with %d invoices, want the replay of 100 and 1", again, e.invoices("k1"))
	}
}

// failingOver is a fence table whose first Reserve calls fail, as a
// database's do while it fails over.
type failingOver struct {
	fencing.Table
	failures atomic.Int64 // left to fail
}

func (f *failingOver) Reserve(ctx context.Context, s fencing.Scope, token uint64) (fencing.Row, error) {
	if f.failures.Add(-1) >= 0 {
		return fencing.Row{}, errors.New("fencetest: the database is failing over")
	}
	return f.Table.Reserve(ctx, s, token)
}

// unreadableAWhile: a run that commits and then fails, whose fence cannot
// be read at first (its database failing over, the likely cause of the
// failure), is settled by the fence once it can be read: the guard reads
// it again within the completion's time to try, where it gave up after
// as many tries as it was given and answered OUTCOME_UNKNOWN.
func unreadableAWhile(e *env) {
	fences := &failingOver{Table: e.db.Fences}
	fences.failures.Store(3)
	res, err := e.g.Do(context.Background(), Call("k1", guard.Policy{Lease: lease, Fence: fences}), func(ctx context.Context) (guard.Outcome, error) {
		if _, err := e.commitRun(100)(ctx); err != nil {
			return guard.Outcome{}, err
		}
		return guard.Outcome{}, guard.UnknownOutcome("the reply was lost", nil)
	})
	if err != nil || !res.Fenced || !same(res.Outcome, Outcome(100)) {
		e.t.Fatalf("%+v, %v; want the fenced 100", res, err)
	}
	if left := fences.failures.Load(); left >= 0 {
		e.t.Fatalf("the fence was read without its %d failures", left+1)
	}
}

func unknownCommit(e *env) {
	for _, commits := range []bool{true, false} {
		key := fmt.Sprintf("k-%t", commits)
		open := make(chan Tx, 1)
		var res guard.Result
		var doErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			res, doErr = e.g.Do(context.Background(), e.call(key), func(ctx context.Context) (guard.Outcome, error) {
				// Its transaction outlives the run: the run's context ends
				// when the guard has its answer, and a driver would then
				// roll the transaction back, or cut its COMMIT short.
				tx, err := e.db.Begin(context.WithoutCancel(ctx))
				if err != nil {
					return guard.Outcome{}, err
				}
				if err := e.write(ctx, tx, 100); err != nil {
					return guard.Outcome{}, err
				}
				open <- tx // its COMMIT is on its way: nobody knows yet
				return guard.Outcome{}, guard.UnknownOutcome("the connection broke during COMMIT", nil)
			})
		}()
		tx := <-open
		end := tx.Rollback
		if commits {
			end = tx.Commit
		}
		if err := end(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		<-done
		switch {
		case commits && (doErr != nil || !res.Fenced || !same(res.Outcome, Outcome(100))):
			e.t.Fatalf("a commit that landed: %+v, %v, want the fenced 100", res, doErr)
		case !commits && (doErr != nil || !res.Outcome.Transient || ledgerstatus.FromError(res.Outcome.Status.Err()).Code != errcode.Unavailable):
			e.t.Fatalf("a commit that did not land: %+v, %v, want a released UNAVAILABLE", res, doErr)
		}
		again := e.do(key, e.commitRun(200))
		want := Outcome(200)
		if commits {
			want = Outcome(100)
		}
		if !same(again.Outcome, want) || e.invoices(key) != 1 {
			e.t.Fatalf("retry: %+v with %d invoices, want %s and 1", again, e.invoices(key), want.Response.GetValue())
		}
	}
}

func cannotBeWritten(e *env) {
	ctx := context.Background()
	if err := e.db.Exec(ctx, "ALTER TABLE idemledger_fences RENAME TO idemledger_fences_away"); err != nil {
		e.t.Fatal(err)
	}
	var writeErr, commitErr error
	first, err := e.g.Do(ctx, e.call("k1"), func(ctx context.Context) (guard.Outcome, error) {
		tx, err := e.db.Begin(ctx)
		if err != nil {
			return guard.Outcome{}, err
		}
		writeErr = e.write(ctx, tx, 100)
		commitErr = tx.Commit(ctx) // a handler that commits anyway
		return guard.Outcome{Status: ledgerstatus.Encode(errcode.As(writeErr)), Transient: guard.Transient(writeErr)}, nil
	})
	if errcode.Of(writeErr) != errcode.Unavailable || !errcode.As(writeErr).Retryable() {
		e.t.Fatalf("the fence write: %v, want a retryable UNAVAILABLE", writeErr)
	}
	if commitErr == nil || e.invoices("k1") != 0 {
		e.t.Fatalf("the commit: %v, %d invoices: the write committed without its fence", commitErr, e.invoices("k1"))
	}
	if err != nil || !first.Outcome.Transient {
		e.t.Fatalf("the call: %+v, %v, want its UNAVAILABLE, the key released", first, err)
	}
	if err := e.db.Exec(ctx, "ALTER TABLE idemledger_fences_away RENAME TO idemledger_fences"); err != nil {
		e.t.Fatal(err)
	}
	res := e.do("k1", e.commitRun(200))
	if !res.Fenced || !same(res.Outcome, Outcome(200)) || e.invoices("k1") != 1 {
		e.t.Fatalf("the retry once the table is back: %+v with %d invoices, want 200 and 1", res, e.invoices("k1"))
	}
}

func cannotBeEncoded(e *env) {
	var writeErr, commitErr error
	_, _ = e.g.Do(context.Background(), e.call("k1"), func(ctx context.Context) (guard.Outcome, error) {
		tx, err := e.db.Begin(ctx)
		if err != nil {
			return guard.Outcome{}, err
		}
		if err := tx.Exec(ctx, "INSERT INTO invoices (idem_key, token, amount) VALUES ('k1', 1, 100)"); err != nil {
			return guard.Outcome{}, err
		}
		writeErr = tx.Fence(ctx, "not an Outcome")
		commitErr = tx.Commit(ctx)
		return guard.Outcome{Status: ledgerstatus.Encode(errcode.As(writeErr))}, nil
	})
	if errcode.Of(writeErr) != errcode.Internal {
		e.t.Fatalf("the fence write: %v, want INTERNAL", writeErr)
	}
	if commitErr == nil || e.invoices("k1") != 0 {
		e.t.Fatalf("the commit: %v, %d invoices: the write committed without its fence", commitErr, e.invoices("k1"))
	}
}

func sweep(e *env) {
	short := e.call("short")
	short.Policy.Retention = time.Minute
	for i := range 3 {
		c := short
		c.Key = fmt.Sprint("short-", i)
		if _, err := e.g.Do(context.Background(), c, e.commitRun(i)); err != nil {
			e.t.Fatal(err)
		}
	}
	long := e.call("long")
	long.Policy.Retention = 48 * time.Hour
	if _, err := e.g.Do(context.Background(), long, e.commitRun(9)); err != nil {
		e.t.Fatal(err)
	}
	count := func() int {
		n, err := e.db.Int(context.Background(), "SELECT count(*) FROM idemledger_fences")
		if err != nil {
			e.t.Fatal(err)
		}
		return n
	}
	if n, err := e.db.Fences.Sweep(context.Background(), time.Now(), 10); err != nil || n != 0 || count() != 4 {
		e.t.Fatalf("a sweep now: %d deleted (%v), %d left, want 0 and 4", n, err, count())
	}
	later := time.Now().Add(time.Hour)
	if n, err := e.db.Fences.Sweep(context.Background(), later, 2); err != nil || n != 2 {
		e.t.Fatalf("a batch of 2: %d deleted (%v)", n, err)
	}
	if n, err := e.db.Fences.Sweep(context.Background(), later, 2); err != nil || n != 1 {
		e.t.Fatalf("the next batch: %d deleted (%v), want the last expired one", n, err)
	}
	if count() != 1 {
		e.t.Fatalf("%d fences left, want the unexpired one", count())
	}
}

func newRecord(e *env) {
	c := e.call("k1")
	c.Policy.Retention, c.Policy.NoTombstones = time.Minute, true
	if _, err := e.g.Do(context.Background(), c, e.commitRun(100)); err != nil {
		e.t.Fatal(err)
	}
	e.clock.Advance(2 * lease) // the record is gone, its fence not yet swept
	res, err := e.g.Do(context.Background(), c, e.commitRun(200))
	if err != nil || !res.Fenced || !same(res.Outcome, Outcome(200)) {
		e.t.Fatalf("the key's new record: %+v, %v, want its own run's 200", res, err)
	}
	if e.invoices("k1") != 2 {
		e.t.Fatalf("%d invoices, want one a record", e.invoices("k1"))
	}
}

func outsideARun(e *env) {
	ctx := context.Background()
	tx, err := e.db.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Fence(ctx, Outcome(1)); err != nil {
		e.t.Fatalf("outside a guarded run: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
	unfenced := e.call("k1")
	unfenced.Policy.Fence = nil
	if _, err := e.g.Do(ctx, unfenced, e.commitRun(100)); err != nil {
		e.t.Fatal(err)
	}
	if n, err := e.db.Int(ctx, "SELECT count(*) FROM idemledger_fences"); err != nil || n != 0 {
		e.t.Fatalf("%d fences (%v), want none", n, err)
	}
}

func configuration(e *env) {
	hold := e.call("k1")
	hold.Policy.OnLeaseExpiry = guard.Hold
	reconcile := e.call("k2")
	reconcile.Reconcile = func(context.Context) (*guard.Outcome, error) { return nil, nil }
	for _, c := range []guard.Call{hold, reconcile} {
		if _, err := e.g.Do(context.Background(), c, e.commitRun(1)); errcode.Of(err) != errcode.Internal {
			e.t.Fatalf("%+v: %v, want INTERNAL", c.Policy, err)
		}
	}
	if err := hold.Policy.Check(); err == nil {
		e.t.Fatal("Check accepts a fenced HOLD")
	}
	if e.runs.Load() != 0 {
		e.t.Fatal("a call of a policy that cannot work ran")
	}
}
