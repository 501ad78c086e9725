package ledgertest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
)

// Sweeper is a store that deletes the records past their retention.
type Sweeper interface {
	ledger.Store
	Sweep(ctx context.Context, limit int) (int, error)
}

// SweepTest checks Sweep on a store whose clock is clock. count returns how
// many records the store holds, swept or not, read without sweeping: 30
// records, a third kept three hours and the rest one (some completed, some
// with their lease extended), then two hours later exactly the 20 short
// ones are deleted, in batches, and the long ones still read back.
func SweepTest(t *testing.T, s Sweeper, clock *Clock, count func() int) {
	t.Helper()
	l := ledger.New(s, ledger.Config{})
	scope := func(i int) ledger.Scope {
		return ledger.Scope{Namespace: "sweep-" + randomHex(4), Tenant: "acme", Key: fmt.Sprint("k", i)}
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
	if n, err := s.Sweep(t.Context(), 100); err != nil || n != 0 || count() != 30 {
		t.Fatalf("Sweep before anything expired = %d, %v; %d records left, want 30", n, err, count())
	}
	clock.Advance(2 * time.Hour)
	total := 0
	for {
		n, err := s.Sweep(t.Context(), 7)
		if err != nil {
			t.Fatal(err)
		}
		if n > 7 {
			t.Fatalf("a sweep of at most 7 deleted %d", n)
		}
		total += n
		if n < 7 {
			break
		}
	}
	if total != 20 || count() != 10 {
		t.Fatalf("swept %d, %d left; want the 20 records with an hour of retention swept and 10 left", total, count())
	}
	for i := 0; i < 30; i += 3 {
		if _, err := l.Lookup(t.Context(), scopes[i], 0); err != nil {
			t.Errorf("long-lived record %d: %v", i, err)
		}
	}
}

// SweepLoopTest checks a store's Run: with records expired, Run (which
// must sweep in small batches every few milliseconds) deletes them all by
// itself, and returns nil once ctx ends. count reads without sweeping.
func SweepLoopTest(t *testing.T, s ledger.Store, clock *Clock, run func(ctx context.Context, onError func(error)) error, count func() int) {
	t.Helper()
	l := ledger.New(s, ledger.Config{})
	for i := range 5 {
		sc := ledger.Scope{Namespace: "loop-" + randomHex(4), Tenant: "acme", Key: fmt.Sprint("k", i)}
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	before := count()
	clock.Advance(2 * time.Hour)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- run(ctx, func(err error) { t.Error(err) }) }()
	deadline := time.Now().Add(10 * time.Second)
	for count() > before-5 {
		if time.Now().After(deadline) {
			t.Fatalf("%d expired records left after 10s of Run", count()-(before-5))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
}
