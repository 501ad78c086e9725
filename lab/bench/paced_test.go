package bench_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemledger/idemledger/lab/bench"
)

// TestPaced: every operation is offered, failures are counted and not
// timed, and a stall counts in every operation it delays: the first one
// holds the client 20 ms, so at 2,000 a second the next forty start late
// and the median is many milliseconds, where a closed loop would time only
// the one.
func TestPaced(t *testing.T) {
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
	if r.P50ms < 5 || r.P99ms < 19 {
		t.Fatalf("p50 %.2f ms, p99 %.2f ms; want the stall in the operations it delayed (p50 ≥ 5, p99 ≥ 19)", r.P50ms, r.P99ms)
	}
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
