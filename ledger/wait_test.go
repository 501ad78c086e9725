package ledger_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
)

// countingStore counts the reads of a memory store.
type countingStore struct {
	*memory.Store
	reads atomic.Int64
}

func (s *countingStore) Get(ctx context.Context, sc ledger.Scope) (ledger.Record, error) {
	s.reads.Add(1)
	return s.Store.Get(ctx, sc)
}

func (s *countingStore) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	s.reads.Add(1)
	return s.Store.GetMany(ctx, scopes)
}

// waitOn starts n Lookups with a wait on n held keys (one each) and returns
// their scopes and a channel of their answers.
func waitOn(t *testing.T, l *ledger.Ledger, ns string, n int) ([]ledger.Scope, chan error) {
	t.Helper()
	base := l.Waiters()
	scopes := make([]ledger.Scope, n)
	answers := make(chan error, n)
	for i := range scopes {
		scopes[i] = ledger.Scope{Namespace: ns, Tenant: "t", Key: fmt.Sprint("k", i)}
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scopes[i], Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range scopes {
		go func() {
			_, err := l.Lookup(t.Context(), s, 30*time.Second)
			answers <- err
		}()
	}
	ledgertest.Eventually(t, 10*time.Second, func() bool { return l.Waiters() >= base+n }, "%d waiters waiting", n)
	return scopes, answers
}

// TestWaitersDoNotPollEach: the store's read rate while Lookups wait is
// the shared poller's, whatever the number of waiters: 10 and 1,000
// waiters make the same few reads a second (each waiter polled the store
// every 250 ms or less).
func TestWaitersDoNotPollEach(t *testing.T) {
	t.Parallel()
	// In a bubble the poller's ticker runs on the bubble's clock: a second
	// of polling passes as soon as every goroutine waits, and the count is
	// exact.
	synctest.Test(t, func(t *testing.T) {
		rate := func(n int) int64 {
			s := &countingStore{Store: memory.New(memory.Config{})}
			l := ledger.New(s, ledger.Config{PollInterval: 50 * time.Millisecond})
			scopes, answers := waitOn(t, l, fmt.Sprint("ns", n), n)
			synctest.Wait() // each waiter's own first read is done
			before := s.reads.Load()
			time.Sleep(time.Second) // a second of the bubble's clock: the poller's reads in it are the subject
			reads := s.reads.Load() - before
			for _, sc := range scopes { // end the waits: a release wakes its waiter
				rec, err := l.Lookup(t.Context(), sc, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Release(t.Context(), sc, rec.Token); err != nil {
					t.Fatal(err)
				}
			}
			for range n {
				if err := <-answers; errcode.Of(err) != errcode.NotFound {
					t.Fatalf("a woken waiter: %v; want NOT_FOUND (released)", err)
				}
			}
			time.Sleep(2 * l.Config().PollInterval) // the bubble's clock: the poller ends at its next tick, nothing watched
			return reads
		}
		few, many := rate(10), rate(1000)
		t.Logf("store reads in 1 s with 10 waiters: %d; with 1,000: %d", few, many)
		if few > 25 || many > 25 {
			t.Fatalf("store reads in 1 s: %d with 10 waiters, %d with 1,000; want the poller's ~20 (1,000 reads in chunks of 1,000)", few, many)
		}
	})
}

// TestWaiterWakesOnComplete: a Complete wakes its waiters at once, long
// before the poller would look.
func TestWaiterWakesOnComplete(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{PollInterval: time.Hour})
	scopes, answers := waitOn(t, l, "ns", 3)
	start := time.Now()
	rec, err := l.Lookup(t.Context(), scopes[1], 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), scopes[1], rec.Token, ledgertest.Response("inv")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-answers:
		if err != nil || time.Since(start) > time.Second {
			t.Fatalf("the waiter answered %v after %v", err, time.Since(start))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the Complete did not wake its waiter")
	}
	if n := l.Waiters(); n != 2 {
		t.Fatalf("%d waiters left, want 2", n)
	}
}

// TestWaitersAreBoundedPerNamespace: past MaxWaiters, a namespace's
// Lookup with a wait is RATE_LIMITED; another namespace still waits.
func TestWaitersAreBoundedPerNamespace(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{MaxWaiters: 4})
	scopes, _ := waitOn(t, l, "busy", 4)
	_, err := l.Lookup(t.Context(), scopes[0], time.Second)
	if le := ledgertest.WantCode(t, err, errcode.RateLimited); !le.Retryable() || le.RetryAfter <= 0 {
		t.Fatalf("%+v: want retryable with a hint", le)
	}
	waitOn(t, l, "other", 1)
	if l.Waiters() != 5 {
		t.Fatalf("%d waiters, want 5", l.Waiters())
	}
}

// TestWaitersAreBoundedInAll: past MaxWaitersTotal, a Lookup with a wait
// is RATE_LIMITED in every namespace, each under its own bound.
func TestWaitersAreBoundedInAll(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{MaxWaiters: 4, MaxWaitersTotal: 6})
	waitOn(t, l, "a", 3)
	scopes, _ := waitOn(t, l, "b", 3)
	_, err := l.Lookup(t.Context(), scopes[0], time.Second)
	if le := ledgertest.WantCode(t, err, errcode.RateLimited); !le.Retryable() {
		t.Fatalf("%+v: want retryable", le)
	}
	other := ledger.Scope{Namespace: "c", Tenant: "t", Key: "k"}
	if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: other, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}); err != nil {
		t.Fatal(err)
	}
	_, err = l.Lookup(t.Context(), other, time.Second)
	ledgertest.WantCode(t, err, errcode.RateLimited)
	if l.Waiters() != 6 {
		t.Fatalf("%d waiters, want 6", l.Waiters())
	}
}

// TestEndWaitsAnswersEveryWaiter: EndWaits answers every Lookup waiting,
// and every later one that would wait, at once with a retryable
// UNAVAILABLE; a Lookup that needs no wait is answered as before.
func TestEndWaitsAnswersEveryWaiter(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	scopes, answers := waitOn(t, l, "ns", 20)
	l.EndWaits()
	for range scopes {
		if le := ledgertest.WantCode(t, <-answers, errcode.Unavailable); !le.Retryable() || le.RetryAfter <= 0 {
			t.Fatalf("%+v: want a retryable UNAVAILABLE with a hint", le)
		}
	}
	if n := l.Waiters(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
	_, err := l.Lookup(t.Context(), scopes[0], 30*time.Second)
	ledgertest.WantCode(t, err, errcode.Unavailable)
	if rec, err := l.Lookup(t.Context(), scopes[0], 0); err != nil || rec.State != ledger.StateInProgress {
		t.Fatalf("a Lookup without a wait = %+v, %v; want the record", rec, err)
	}
}
