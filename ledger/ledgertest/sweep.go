package ledgertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Sweeper is a store that deletes the records past their retention: Sweep
// deletes up to limit of them, and Run sweeps until ctx ends.
type Sweeper interface {
	ledger.Store
	Sweep(ctx context.Context, limit int) (int, error)
	Run(ctx context.Context, onError func(error)) error
}

// sweeper returns a fresh store of the suite, its clock, a namespace of the
// rule's own and a count of its records in it; it skips the test for a
// store that does not sweep.
func (suite Suite) sweeper(t *testing.T) (Sweeper, *Clock, string, func() int) {
	t.Helper()
	clock := NewClock(suite.start)
	st := suite.NewStore(t, clock.Now)
	s, ok := st.(Sweeper)
	if !ok {
		t.Skipf("%T does not sweep", st)
	}
	ns := "sweep-" + randomHex(6)
	return s, clock, ns, func() int { return suite.Count(t, st, ns) }
}

// ruleSweep checks Sweep: 30 records, a third kept three hours and the
// rest one (some completed, some with their lease extended), then two
// hours later exactly the 20 short ones are deleted, in batches, and the
// long ones still read back.
func ruleSweep(t *testing.T, suite Suite) {
	s, clock, ns, count := suite.sweeper(t)
	l := ledger.New(s, noTombstones)
	scope := func(i int) ledger.Scope {
		return ledger.Scope{Namespace: ns, Tenant: "acme", Key: fmt.Sprint("k", i)}
	}
	scopes := make([]ledger.Scope, 30)
	for i := range scopes {
		scopes[i] = scope(i)
		retention := time.Hour
		if i%3 == 0 {
			retention = 3 * time.Hour
		}
		res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scopes[i], Fingerprint: Fingerprint("p"), Method: Method, Retention: retention})
		if err != nil {
			t.Fatal(err)
		}
		switch i % 4 {
		case 0:
			_, err = l.Complete(t.Context(), scopes[i], res.Claim.Token, Response("x"))
		case 1: // an extended lease may move the record in an expiry index
			_, err = l.Extend(t.Context(), scopes[i], res.Claim.Token, 10*time.Minute)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// Other rules may share the store (a database): its counts are the
	// namespace's, and a sweep may also delete other rules' records.
	if _, err := s.Sweep(t.Context(), 100); err != nil || count() != 30 {
		t.Fatalf("Sweep before anything expired: %v; %d records left, want 30", err, count())
	}
	clock.Advance(2 * time.Hour)
	for {
		n, err := s.Sweep(t.Context(), 7)
		if err != nil {
			t.Fatal(err)
		}
		if n > 7 {
			t.Fatalf("a sweep of at most 7 deleted %d", n)
		}
		if n < 7 {
			break
		}
	}
	if count() != 10 {
		t.Fatalf("%d records left; want the 20 records with an hour of retention swept and 10 left", count())
	}
	for i := 0; i < 30; i += 3 {
		if _, err := l.Lookup(t.Context(), scopes[i], 0); err != nil {
			t.Errorf("long-lived record %d: %v", i, err)
		}
	}
}

// ruleSweepLoop checks a store's Run: with records expired, Run (which
// must sweep in small batches every few milliseconds) deletes them all by
// itself, and returns nil once ctx ends.
func ruleSweepLoop(t *testing.T, suite Suite) {
	s, clock, ns, count := suite.sweeper(t)
	l := ledger.New(s, noTombstones)
	for i := range 5 {
		sc := ledger.Scope{Namespace: ns, Tenant: "acme", Key: fmt.Sprint("k", i)}
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 5 {
		t.Fatalf("%d records, want 5", n)
	}
	clock.Advance(2 * time.Hour)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- s.Run(ctx, func(err error) { t.Error(err) }) }()
	deadline := time.Now().Add(10 * time.Second)
	for count() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d expired records left after 10s of Run", count())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
}

// sweepAll sweeps until a sweep finds less than a full batch.
func sweepAll(t *testing.T, s Sweeper) {
	t.Helper()
	for {
		n, err := s.Sweep(t.Context(), 100)
		if err != nil {
			t.Fatal(err)
		}
		if n < 100 {
			return
		}
	}
}

// ruleSweepTombstones: the sweeper turns a completed record past its
// retention into a tombstone (the outcome is gone, the record stays and
// still answers KEY_EXPIRED), and deletes it past its tombstone window.
func ruleSweepTombstones(t *testing.T, suite Suite) {
	s, clock, ns, count := suite.sweeper(t)
	l := ledger.New(s, ledger.Config{})
	hour := time.Hour
	sc := ledger.Scope{Namespace: ns, Tenant: "acme", Key: "done"}
	req := ledger.BeginRequest{Scope: sc, Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour, TombstoneRetention: &hour}
	res, err := l.Begin(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), sc, res.Claim.Token, Response("x")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	sweepAll(t, s)
	rec, err := l.Lookup(t.Context(), sc, 0)
	if err != nil || rec.State != ledger.StateExpired || rec.Outcome != nil || count() != 1 {
		t.Fatalf("after a sweep past the retention: %+v, %v, %d records; want one tombstone without its outcome", rec, err, count())
	}
	_, err = l.Begin(t.Context(), req)
	want(t, err, errcode.KeyExpired)
	clock.Advance(time.Hour)
	sweepAll(t, s)
	if n := count(); n != 0 {
		t.Fatalf("%d records past the tombstone window, want 0", n)
	}
}

// ruleSweepAbandoned: an attempt nobody completed or released reads as
// absent once its retention ends. The sweeper keeps it through its
// tombstone window, so that a claim of its key then gets a token above
// its own, and deletes it after.
func ruleSweepAbandoned(t *testing.T, suite Suite) {
	s, clock, ns, count := suite.sweeper(t)
	l := ledger.New(s, ledger.Config{})
	hour := time.Hour
	begin := func(key string) ledger.BeginResponse {
		t.Helper()
		res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: ledger.Scope{Namespace: ns, Tenant: "acme", Key: key},
			Fingerprint: Fingerprint("p"), Method: Method, Lease: time.Minute, Retention: time.Hour, TombstoneRetention: &hour})
		if err != nil || res.Claim == nil {
			t.Fatalf("Begin %s: %+v, %v; want a claim", key, res, err)
		}
		return res
	}
	begin("abandoned")
	first := begin("claimed-again")
	clock.Advance(time.Hour)
	sweepAll(t, s)
	if n := count(); n != 2 {
		t.Fatalf("%d records after a sweep at the attempts' retention; want both kept through their tombstone window", n)
	}
	_, err := l.Lookup(t.Context(), ledger.Scope{Namespace: ns, Tenant: "acme", Key: "abandoned"}, 0)
	want(t, err, errcode.NotFound)
	if again := begin("claimed-again"); again.Claim.Token <= first.Claim.Token {
		t.Fatalf("a claim of a swept attempt's key got token %d; want one above its %d", again.Claim.Token, first.Claim.Token)
	}
	clock.Advance(time.Hour)
	sweepAll(t, s)
	if n := count(); n != 1 {
		t.Fatalf("%d records past the abandoned attempt's tombstone window; want only the key claimed again", n)
	}
}
