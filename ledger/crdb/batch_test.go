package crdb

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestBatcherCoalescesAndRecovers: calls that arrive while a batch runs are
// answered by the next batch, one per scope, at most max at a time; a call
// whose caller is gone before it runs does not wedge the batcher. It runs
// in a bubble: synctest.Wait is "every call has queued".
func TestBatcherCoalescesAndRecovers(t *testing.T) {
	synctest.Test(t, testBatcherCoalescesAndRecovers)
}

func testBatcherCoalescesAndRecovers(t *testing.T) {
	var batches, largest atomic.Int64
	release := make(chan struct{})
	b := &batcher[int, int]{max: 4, maxInFlight: 1, run: func(_ context.Context, calls []*call[int, int]) {
		if batches.Add(1) == 1 {
			<-release // hold the first batch while the others queue
		}
		seen := map[string]bool{}
		for _, c := range calls {
			if seen[c.key] {
				t.Errorf("scope %s twice in one batch", c.key)
			}
			seen[c.key] = true
			c.done <- result[int]{r: c.p * 10}
		}
		if n := int64(len(calls)); n > largest.Load() {
			largest.Store(n)
		}
	}}
	var wg sync.WaitGroup
	wg.Go(func() {
		if r, err := b.do(context.Background(), "first", 1); err != nil || r != 10 {
			t.Errorf("first call = %d, %v", r, err)
		}
	})
	synctest.Wait() // the first batch runs, held
	// A caller gone before its call runs.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.do(gone, "gone", 0); err == nil {
		t.Error("a canceled call succeeded")
	}
	for i := range 9 {
		wg.Go(func() {
			key := fmt.Sprint("k", i%3) // three scopes, three calls each
			if r, err := b.do(context.Background(), key, i); err != nil || r != i*10 {
				t.Errorf("call %d = %d, %v", i, r, err)
			}
		})
	}
	synctest.Wait() // every call queued behind the held batch
	close(release)
	wg.Wait()
	if largest.Load() > 4 || largest.Load() < 2 || batches.Load() > 6 {
		t.Fatalf("%d batches, the largest of %d calls: want coalescing, at most 4 a batch", batches.Load(), largest.Load())
	}
	// A canceled call on an idle batcher, then a lone call: it still runs
	// (nothing is wedged).
	if _, err := b.do(gone, "gone-again", 0); err == nil {
		t.Error("a canceled call succeeded")
	}
	ctx, cancelCtx := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelCtx()
	if r, err := b.do(ctx, "last", 7); err != nil || r != 70 {
		t.Fatalf("a lone call after a canceled one = %d, %v", r, err)
	}
}

// writes counts the writes of every connection a pool dials.
type writes struct{ n atomic.Int64 }

type countingConn struct {
	net.Conn
	w *writes
}

func (c countingConn) Write(b []byte) (int, error) {
	c.w.n.Add(1)
	return c.Conn.Write(b)
}

func (w *writes) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return countingConn{c, w}, nil
}

// TestMixedBatch: a batch of claims and completes is one write to the
// database, and every call gets the answer its own statement would give:
// fresh claims win, a replay and a claim of a held key do not, a complete
// with the holder's token completes (also when a claim of the same key
// shares the batch: claims run first), a complete with a stale token loses.
func TestMixedBatch(t *testing.T) {
	ctx := t.Context()
	pc, err := pgxpool.ParseConfig(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	var w writes
	pc.MaxConns = 1 // one connection, its statements prepared by a first batch
	pc.ConnConfig.DialFunc = w.dial
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := New(ctx, pool, Config{Batching: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	claim := func(k string) ledger.ClaimResult {
		res, err := s.claimOne(ctx, testClaim(k), []byte("setup-"+k))
		if err != nil || !res.Claimed {
			t.Fatalf("claim %s = %+v, %v", k, res, err)
		}
		return res
	}
	held, other, done := claim("held"), claim("other"), claim("done")
	if _, err := s.completeOne(ctx, ledger.CompleteParams{Scope: testScope("done"), Token: done.Record.Token, Outcome: ledgertest.Response("inv_done")}, mustMarshal(t, ledgertest.Response("inv_done"))); err != nil {
		t.Fatal(err)
	}

	newClaim := func(k string) *call[op, opResult] { return claimOp(ctx, k) }
	newComplete := func(k string, token uint64, id string) *call[op, opResult] { return completeOp(ctx, t, k, token, id) }
	fresh1, fresh2, replay, heldAgain := newClaim("fresh-1"), newClaim("fresh-2"), newClaim("done"), newClaim("held")
	complete, stale := newComplete("held", held.Record.Token, "inv_held"), newComplete("other", other.Record.Token+1, "inv_other")

	warm1, warm2 := newClaim("warm-1"), newComplete("warm-1", 1, "inv_warm")
	s.runOps(ctx, "", []*call[op, opResult]{warm1, warm2})
	<-warm1.done
	<-warm2.done

	before := w.n.Load()
	s.runOps(ctx, "", []*call[op, opResult]{complete, fresh1, replay, stale, heldAgain, fresh2})
	if n := w.n.Load() - before; n != 1 {
		t.Fatalf("the batch took %d writes to the database, want 1", n)
	}

	for _, c := range []*call[op, opResult]{fresh1, fresh2} {
		if res := <-c.done; res.err != nil || !res.r.claim.Claimed || res.r.claim.Record.Token != 1 {
			t.Errorf("fresh claim %s = %+v, %v; want claimed with token 1", c.key, res.r.claim, res.err)
		}
	}
	if res := <-replay.done; res.err != nil || res.r.claim.Claimed || res.r.claim.Record.State != ledger.StateCompleted ||
		!res.r.claim.Record.Outcome.Equal(ledgertest.Response("inv_done")) {
		t.Errorf("replay = %+v, %v; want the completed record", res.r.claim, res.err)
	}
	if res := <-heldAgain.done; res.err != nil || res.r.claim.Claimed || res.r.claim.Record.State != ledger.StateInProgress {
		t.Errorf("claim of a held key = %+v, %v; want the record in progress (claims run before completes)", res.r.claim, res.err)
	}
	if res := <-complete.done; res.err != nil || res.r.rec.State != ledger.StateCompleted || !res.r.rec.Outcome.Equal(ledgertest.Response("inv_held")) {
		t.Errorf("complete = %+v, %v; want completed with inv_held", res.r.rec, res.err)
	}
	res := <-stale.done
	ledgertest.WantCode(t, res.err, errcode.LeaseLost)

	if rec, err := s.Get(ctx, testScope("other")); err != nil || rec.State != ledger.StateInProgress || rec.Token != other.Record.Token {
		t.Errorf("after a stale complete the record is %+v, %v; want it unchanged", rec, err)
	}
	if rec, err := s.Get(ctx, testScope("held")); err != nil || rec.State != ledger.StateCompleted {
		t.Errorf("held = %+v, %v; want completed", rec, err)
	}
}

func mustMarshal(t *testing.T, o *ledger.Outcome) []byte {
	t.Helper()
	b, err := o.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testScope(k string) ledger.Scope {
	return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k}
}

func testClaim(k string) ledger.ClaimParams {
	return ledger.ClaimParams{Scope: testScope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method,
		Lease: time.Minute, Retention: time.Hour}
}

// claimOp is a batched claim of k, with the nonce "batch-" + k.
func claimOp(ctx context.Context, k string) *call[op, opResult] {
	return &call[op, opResult]{ctx: ctx, key: opKey('c', testScope(k)), done: make(chan result[opResult], 1),
		p: op{claim: &claimCall{p: testClaim(k), nonce: []byte("batch-" + k)}}}
}

// completeOp is a batched complete of k with token and the response id.
func completeOp(ctx context.Context, t *testing.T, k string, token uint64, id string) *call[op, opResult] {
	out := ledgertest.Response(id)
	return &call[op, opResult]{ctx: ctx, key: opKey('u', testScope(k)), done: make(chan result[opResult], 1),
		p: op{complete: &completeCall{p: ledger.CompleteParams{Scope: testScope(k), Token: token, Outcome: out}, outcome: mustMarshal(t, out)}}}
}

// TestCrossedBatches: the one lock cycle batches allow. Two ledger
// instances run at once a batch each that crosses a claim and a complete of
// two keys (A claims x and completes y; B claims y and completes x). A test
// transaction holds y while B's claim and then A's complete queue on it,
// so that when it lets go B locks y, then waits for x, which A holds: a
// deadlock. PostgreSQL aborts one batch (40P01); its calls fall back to
// their own statements, and every call gets a right answer.
func TestCrossedBatches(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	// Break the cycle in 100 ms instead of 1 s, where the test may (superuser).
	_, _ = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{admin.Config().Database}.Sanitize()+" SET deadlock_timeout = '100ms'")
	instance := func() *Store {
		s, err := Open(ctx, url, Config{Batching: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	a, b := instance(), instance()
	if _, err := a.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	x, err := a.claimOne(ctx, testClaim("x"), []byte("holder-x"))
	if err != nil {
		t.Fatal(err)
	}
	y, err := a.claimOne(ctx, testClaim("y"), []byte("holder-y"))
	if err != nil {
		t.Fatal(err)
	}
	waiting := func(n int) {
		t.Helper()
		// Poll PostgreSQL until the sessions wait on the lock.
		ledgertest.Eventually(t, 10*time.Second, func() bool {
			var got int
			if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'").Scan(&got); err != nil {
				t.Fatal(err)
			}
			return got >= n
		}, "%d sessions wait on a lock", n)
	}
	var deadlocks atomic.Int64
	for _, s := range []*Store{a, b} {
		s.batchFailed = func(err error) {
			if sqlState(err) == "40P01" {
				deadlocks.Add(1)
			}
		}
	}

	hold, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(ctx, "SELECT 1 FROM idempotency_records WHERE idem_key = 'y' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	bCalls := []*call[op, opResult]{claimOp(ctx, "y"), completeOp(ctx, t, "x", x.Record.Token, "inv_x")}
	aCalls := []*call[op, opResult]{claimOp(ctx, "x"), completeOp(ctx, t, "y", y.Record.Token, "inv_y")}
	var wg sync.WaitGroup
	wg.Go(func() { b.runOps(ctx, "", bCalls) })
	waiting(1) // B's claim of y
	wg.Go(func() { a.runOps(ctx, "", aCalls) })
	waiting(2) // A's complete of y, holding x
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	for _, c := range []*call[op, opResult]{aCalls[0], bCalls[0]} {
		if res := <-c.done; res.err != nil || res.r.claim.Claimed || res.r.claim.Record.State == ledger.StateAbsent {
			t.Errorf("claim %s = %+v, %v; want the holder's record", c.key, res.r.claim, res.err)
		}
	}
	for _, c := range []*call[op, opResult]{aCalls[1], bCalls[1]} {
		if res := <-c.done; res.err != nil || res.r.rec.State != ledger.StateCompleted {
			t.Errorf("complete %s = %+v, %v; want completed", c.key, res.r.rec, res.err)
		}
	}
	for k, id := range map[string]string{"x": "inv_x", "y": "inv_y"} {
		if rec, err := a.Get(ctx, testScope(k)); err != nil || rec.State != ledger.StateCompleted || !rec.Outcome.Equal(ledgertest.Response(id)) {
			t.Errorf("%s = %+v, %v; want completed with %s", k, rec, err, id)
		}
	}
	if deadlocks.Load() != 1 {
		t.Fatalf("%d batches were aborted as deadlocked, want 1: the test did not cross them", deadlocks.Load())
	}
}

// TestBatchStats: the counters see every batch and every call, and calls
// that queue behind a running batch are counted as one batch. A test
// transaction holds the row of a first claim so that ten more claims queue
// behind it.
func TestBatchStats(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	// One batch in flight, so that the ten claims queue behind the held one.
	s, err := Open(ctx, url, Config{Batching: true, BatchInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.BatchStats(); got != (BatchStats{Limit: 1}) {
		t.Fatalf("BatchStats of a new store = %+v, want no batch and the limit of 1", got)
	}
	if _, err := s.Claim(ctx, testClaim("held")); err != nil {
		t.Fatal(err)
	}
	if got := s.BatchStats(); got.Batches != 1 || got.Calls != 1 {
		t.Fatalf("BatchStats after one claim = %+v, want 1 batch of 1 call", got)
	}
	// The batch's time is added as it ends, a moment after its caller has
	// its answer.
	ledgertest.Eventually(t, 10*time.Second, func() bool { return s.BatchStats().Busy > 0 }, "the batch's busy time counted")

	hold := lockRows(t, url, "idem_key = 'held'")
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.Claim(ctx, testClaim("held")); err != nil {
			t.Error(err)
		}
	})
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		// Poll the batcher until PostgreSQL holds its batch on the lock.
		ledgertest.Eventually(t, 10*time.Second, func() bool {
			s.ops[""].mu.Lock()
			defer s.ops[""].mu.Unlock()
			return cond()
		}, "%s", what)
	}
	waitFor("the claim of the held row to run", func() bool { return s.ops[""].inFlight == 1 })
	for i := range 10 {
		wg.Go(func() {
			if _, err := s.Claim(ctx, testClaim(fmt.Sprint("queued-", i))); err != nil {
				t.Error(err)
			}
		})
	}
	waitFor("ten claims to queue", func() bool { return len(s.ops[""].pending) == 10 })
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if got := s.BatchStats(); got.Batches != 3 || got.Calls != 12 {
		t.Fatalf("BatchStats = %+v, want 3 batches of 12 calls: the first claim, the held one, then the ten queued behind it", got)
	}

	off, err := Open(ctx, url, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(off.Close)
	if _, err := off.Claim(ctx, testClaim("unbatched")); err != nil {
		t.Fatal(err)
	}
	if got := off.BatchStats(); got != (BatchStats{}) {
		t.Fatalf("BatchStats without batching = %+v, want zero", got)
	}
}

// lockRows locks the records where holds, in a transaction of its own
// connection, until the test rolls it back (or ends).
func lockRows(t *testing.T, url, where string) pgx.Tx {
	t.Helper()
	ctx := t.Context()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	hold, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.Exec(ctx, "SELECT 1 FROM idempotency_records WHERE "+where+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	return hold
}

// openMigrated opens a store with cfg on a database of its own, migrated,
// closed when the test ends.
func openMigrated(t *testing.T, cfg Config) *Store {
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

// TestLargeOutcomesRunAlone: a Complete whose outcome is over
// MaxBatchedOutcome runs its own statement, beside the batches, and a
// small one goes through a batch; both store their outcome, and a
// Complete that applied answers with the outcome it sent.
func TestLargeOutcomesRunAlone(t *testing.T) {
	ctx := t.Context()
	s := openMigrated(t, Config{Batching: true, MaxBatchedOutcome: 1 << 10})
	for _, tc := range []struct {
		key     string
		size    int
		batched bool
	}{
		{"small", 100, true},
		{"at-limit", 1<<10 - 64, true},
		{"large", 64 << 10, false},
	} {
		claim, err := s.Claim(ctx, testClaim(tc.key))
		if err != nil || !claim.Claimed {
			t.Fatalf("%s: claim %+v, %v", tc.key, claim, err)
		}
		out := ledgertest.Response(strings.Repeat("x", tc.size))
		if b := mustMarshal(t, out); (len(b) <= 1<<10) != tc.batched {
			t.Fatalf("%s: %d encoded bytes, on the wrong side of the limit", tc.key, len(b))
		}
		before := s.BatchStats().Calls
		rec, err := s.Complete(ctx, ledger.CompleteParams{Scope: testScope(tc.key), Token: claim.Record.Token, Outcome: out})
		if err != nil {
			t.Fatal(err)
		}
		if batched := s.BatchStats().Calls > before; batched != tc.batched {
			t.Errorf("%s: went through a batch: %t, want %t", tc.key, batched, tc.batched)
		}
		if rec.State != ledger.StateCompleted || !rec.Outcome.Equal(out) {
			t.Errorf("%s: Complete answered %v with another outcome", tc.key, rec.State)
		}
		got, err := s.Get(ctx, testScope(tc.key))
		if err != nil || !got.Outcome.Equal(out) {
			t.Fatalf("%s: stored outcome differs (%v)", tc.key, err)
		}
		// The same Complete again is answered from the stored row.
		again, err := s.Complete(ctx, ledger.CompleteParams{Scope: testScope(tc.key), Token: claim.Record.Token, Outcome: out})
		if err != nil || !again.Outcome.Equal(out) {
			t.Fatalf("%s: repeated Complete: %v", tc.key, err)
		}
	}
}

// TestLargeOutcomesInBorrowedBuffers: an outcome sent in its own statement
// is encoded into a buffer that goes back to a pool, uncleared, when the
// statement is done. Many at once, of sizes that share the pool's tiers
// and of bytes of their own, each store exactly their outcome: no buffer
// is reused while a statement still reads it, and none carries the bytes
// of an earlier, longer outcome into a shorter one.
func TestLargeOutcomesInBorrowedBuffers(t *testing.T) {
	ctx := t.Context()
	s := openMigrated(t, Config{Batching: true, MaxBatchedOutcome: 1 << 10})
	const workers, each = 8, 6
	outcome := func(w, i int) *ledger.Outcome {
		// 40 to 100 KiB: all in the 64 and 128 KiB tiers, longer and
		// shorter in turns.
		size := (40 + (w*each+i)*37%61) << 10
		return ledgertest.Response(strings.Repeat(string(rune('a'+(w*each+i)%26)), size))
	}
	key := func(w, i int) string { return fmt.Sprintf("borrowed-%d-%d", w, i) }
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				claim, err := s.Claim(ctx, testClaim(key(w, i)))
				if err != nil || !claim.Claimed {
					t.Errorf("%s: claim %+v, %v", key(w, i), claim, err)
					return
				}
				if _, err := s.Complete(ctx, ledger.CompleteParams{Scope: testScope(key(w, i)), Token: claim.Record.Token, Outcome: outcome(w, i)}); err != nil {
					t.Errorf("%s: %v", key(w, i), err)
					return
				}
			}
		})
	}
	wg.Wait()
	for w := range workers {
		for i := range each {
			got, err := s.Get(ctx, testScope(key(w, i)))
			if err != nil || !got.Outcome.Equal(outcome(w, i)) {
				t.Errorf("%s: stored outcome differs from the one sent (%v)", key(w, i), err)
			}
		}
	}
}
