package bolt

import (
	"sync"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/internal/recordkv"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// fakeTime is a wall clock and a monotonic clock that tests move apart.
type fakeTime struct {
	mu      sync.Mutex
	wall    time.Time
	elapsed time.Duration
}

func (f *fakeTime) Wall() time.Time        { f.mu.Lock(); defer f.mu.Unlock(); return f.wall }
func (f *fakeTime) Elapsed() time.Duration { f.mu.Lock(); defer f.mu.Unlock(); return f.elapsed }
func (f *fakeTime) pass(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wall = f.wall.Add(d)
	f.elapsed += d
}
func (f *fakeTime) step(d time.Duration) { f.mu.Lock(); defer f.mu.Unlock(); f.wall = f.wall.Add(d) }

// TestClockStepExpiresNothingEarly: the wall clock jumps an hour ahead
// while a second passes. A live lease stays live (no takeover), a record
// within its retention is not swept, and the step is noticed once.
func TestClockStepExpiresNothingEarly(t *testing.T) {
	ft := &fakeTime{wall: ledgertest.Start}
	var steps []time.Duration
	s := openInternal(t, Config{})
	s.clock = recordkv.NewMonoClockFrom(ft.Wall, ft.Elapsed, func(d time.Duration) { steps = append(steps, d) })
	s.cfg.Now = s.clock.Now
	l := ledger.New(s, ledger.Config{})
	req := func(key string) ledger.BeginRequest {
		return ledger.BeginRequest{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: key}, Fingerprint: ledgertest.Fingerprint("p"),
			Method: ledgertest.Method, Lease: 30 * time.Second, Retention: 2 * time.Hour}
	}
	held, err := l.Begin(t.Context(), req("held"))
	if err != nil {
		t.Fatal(err)
	}
	done, err := l.Begin(t.Context(), req("done"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), req("done").Scope, done.Claim.Token, ledgertest.Response("inv")); err != nil {
		t.Fatal(err)
	}

	ft.pass(time.Second)
	ft.step(3 * time.Hour) // past the lease and the retention, on the wall clock only

	_, err = l.Begin(t.Context(), req("held"))
	ledgertest.WantCode(t, err, ledger.CodeInProgress)
	if n, err := s.Sweep(t.Context(), 100); err != nil || n != 0 {
		t.Fatalf("Sweep after the step = %d, %v; want nothing swept", n, err)
	}
	res, err := l.Begin(t.Context(), req("done"))
	if err != nil || res.Replay == nil {
		t.Fatalf("Begin on the completed key after the step = %+v, %v; want its replay", res, err)
	}
	if len(steps) != 1 || steps[0] != 3*time.Hour || s.ClockSteps() != 1 {
		t.Fatalf("steps noticed: %v (%d); want one of 3h", steps, s.ClockSteps())
	}
	// Time that really passes still expires the lease.
	ft.pass(30 * time.Second)
	if res, err := l.Begin(t.Context(), req("held")); err != nil || res.Claim == nil || res.Claim.Token != held.Claim.Token+1 {
		t.Fatalf("Begin after the lease really ran out = %+v, %v; want a takeover", res, err)
	}
}
