package ledger_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemledger/idemledger/ledger"
)

// TestSweepsBacklogPaces: with a share of 0.25 the sweeper rests three
// times as long as each full batch took, so sweeping takes at most a
// quarter of the time while the backlog lasts; with a share of 1 it does
// not rest. It stops at a short batch, and at an error, which onError
// hears. The sweeps and the rests run on a bubble's clock, so the shares
// are exact.
func TestSweepsBacklogPaces(t *testing.T) {
	t.Parallel()
	synctest.Test(t, testSweepsBacklogPaces)
}

func testSweepsBacklogPaces(t *testing.T) {
	const batch, full, took = 10, 4, 10 * time.Millisecond
	sweeper := func(fail bool) (func(context.Context, int) (int, error), *time.Duration) {
		calls := 0
		var busy time.Duration
		return func(context.Context, int) (int, error) {
			calls++
			start := time.Now()
			time.Sleep(took) // a sweep of known duration on the bubble's clock: the pacing is computed from it
			busy += time.Since(start)
			switch {
			case calls <= full:
				return batch, nil
			case fail:
				return 0, errors.New("disk full")
			}
			return 3, nil
		}, &busy
	}
	for _, tc := range []struct {
		share float64
		want  float64 // of the elapsed time spent sweeping
	}{
		// Five sweeps of 10 ms, the four full ones each followed by a
		// rest of 30 ms: 50 of 170 ms.
		{share: 0.25, want: 50.0 / 170},
		{share: 1, want: 1},
	} {
		sweep, busy := sweeper(false)
		start := time.Now()
		n := ledger.Sweeps{Batch: batch, Share: tc.share, Sweep: sweep}.Backlog(t.Context())
		elapsed := time.Since(start)
		if n != full*batch+3 {
			t.Fatalf("share %v: handled %d, want %d", tc.share, n, full*batch+3)
		}
		if got := busy.Seconds() / elapsed.Seconds(); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("share %v: swept %.4f of the time (%v of %v), want %.4f", tc.share, got, *busy, elapsed, tc.want)
		}
	}
	sweep, _ := sweeper(true)
	var heard error
	if n := (ledger.Sweeps{Batch: batch, Share: 0.5, Sweep: sweep, OnError: func(err error) { heard = err }}).Backlog(t.Context()); n != full*batch || heard == nil {
		t.Fatalf("a failing sweep: handled %d, heard %v", n, heard)
	}
}
