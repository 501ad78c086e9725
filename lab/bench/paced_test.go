package bench_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemledger/idemledger/lab/bench"
)

// TestPaced: every operation is offered, failures are counted and not
// timed, and a stall counts in every operation it delays: the first one
// holds the client 20 ms, so at 2,000 a second the next 39, due every
// 0.5 ms, start at 20 ms, late by 20 ms less their due time, where a
// closed loop would time only the one. On synctest's clock, the latencies
// are exact.
func TestPaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		r := bench.Paced(t.Context(), "fake", func(ctx context.Context, c int, n int64) error {
			calls++
			switch {
			case calls == 1:
				time.Sleep(20 * time.Millisecond) // the stall under measure
			case calls%5 == 0:
				return errors.New("every fifth fails")
			}
			return nil
		}, 2000, 40)
		if calls != 40 || r.Ops != 32 || r.Errors != 8 || r.FirstError != "every fifth fails" {
			t.Fatalf("%d calls, %+v; want 40 calls, 32 ops, 8 errors", calls, r)
		}
		if r.Workload != bench.PacedWorkload || r.Clients != 1 || r.Target != "fake" {
			t.Fatalf("result %+v; want the paced workload of fake from one client", r)
		}
		// The 32 timed, latest due first: 1 ms (the 39th, due at 19 ms),
		// 1.5, 2, 2.5, 3.5, …; the 17th of them is the 19th call, due at
		// 9 ms, 11 ms late; the last is the first call, 20 ms.
		if r.P50ms != 11 || r.P99ms != 20 {
			t.Fatalf("p50 %v ms, p99 %v ms; want 11 and 20", r.P50ms, r.P99ms)
		}
	})
}

// TestPacedStopsWithItsContext: a canceled run offers nothing more.
func TestPacedStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	r := bench.Paced(ctx, "fake", func(context.Context, int, int64) error {
		calls++
		cancel()
		return nil
	}, 1, 1000) // one a second: without the cancel, 1,000 seconds
	if calls != 1 || r.Ops != 1 {
		t.Fatalf("%d calls, %d ops after a cancel in the first; want 1", calls, r.Ops)
	}
}
