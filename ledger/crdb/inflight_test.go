package crdb

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
)

func TestBatchesInFlight(t *testing.T) {
	for _, tc := range []struct {
		batch, rtt time.Duration
		want       int
	}{
		{2 * time.Millisecond, 100 * time.Microsecond, 1},  // a database nearby: its commit is the batch
		{3 * time.Millisecond, time.Millisecond, 4},        // 1 ms away
		{12 * time.Millisecond, 10 * time.Millisecond, 12}, // 10 ms away
		{52 * time.Millisecond, 50 * time.Millisecond, 16}, // 50 ms away: the pool's size
		{time.Millisecond, 2 * time.Millisecond, 16},       // a ping slower than a batch: the round trip is all of it
	} {
		if got := batchesInFlight(tc.batch, tc.rtt, 16); got != tc.want {
			t.Errorf("batchesInFlight(%v, %v, 16) = %d, want %d", tc.batch, tc.rtt, got, tc.want)
		}
	}
}

// TestInFlightFollowsTheRoundTrip: with a database nearby the batcher runs
// one batch at a time and the calls that arrive meanwhile share the next;
// with one a long round trip away, the calls of as many clients run at
// once instead of waiting for the batch in flight.
func TestInFlightFollowsTheRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rtt, work  time.Duration
		wantSingle bool
	}{
		{"near", 50 * time.Microsecond, 5 * time.Millisecond, true},
		{"far", 20 * time.Millisecond, time.Millisecond, false},
	} {
		// In a bubble: the batches take their durations on the bubble's
		// clock, exactly.
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var running, most atomic.Int64
				tune := newInFlight(t.Context(), func(context.Context) (time.Duration, error) { return tc.rtt, nil }, 8)
				tune.measure(t.Context())
				b := &batcher[int, int]{max: 128, tune: tune, run: func(_ context.Context, calls []*call[int, int]) {
					n := running.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(tc.rtt + tc.work) // a batch of known duration on the bubble's clock: what the in-flight limit is computed from
					running.Add(-1)
					for _, c := range calls {
						c.done <- result[int]{r: c.p}
					}
				}}
				var wg sync.WaitGroup
				for client := range 8 {
					wg.Go(func() {
						for i := range 15 {
							if _, err := b.do(context.Background(), fmt.Sprint(client, "/", i), i); err != nil {
								t.Error(err)
							}
						}
					})
				}
				wg.Wait()
				tune.close()
				limit := b.limit()
				if tc.wantSingle && (most.Load() != 1 || limit != 1) {
					t.Fatalf("near: %d batches ran at once (limit %d), want 1", most.Load(), limit)
				}
				if !tc.wantSingle && (most.Load() < 4 || limit < 4) {
					t.Fatalf("far: at most %d batches ran at once (limit %d), want the clients' calls at once", most.Load(), limit)
				}
			})
		})
	}
}

// TestRoundTripOnPostgreSQL: a batching store measures its round trip to
// the database at once and sets its limit within the pool; a fixed
// BatchInFlight is kept. (That a database nearby gets one batch at a time
// is TestInFlightFollowsTheRoundTrip's; here the machine's load decides.)
func TestRoundTripOnPostgreSQL(t *testing.T) {
	s, err := Open(t.Context(), pgtest.NewDatabase(t), Config{Batching: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	st := s.BatchStats()
	if st.RoundTrip <= 0 || st.RoundTrip > time.Second || st.Limit < 1 || st.Limit > int(s.Pool().Config().MaxConns) {
		t.Fatalf("round trip %v, limit %d: want a measured round trip and a limit within the pool", st.RoundTrip, st.Limit)
	}
	fixed, err := Open(t.Context(), pgtest.NewDatabase(t), Config{Batching: true, BatchInFlight: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer fixed.Close()
	if st := fixed.BatchStats(); st.Limit != 3 || st.RoundTrip != 0 {
		t.Fatalf("fixed BatchInFlight 3: limit %d, round trip %v", st.Limit, st.RoundTrip)
	}
}

// TestInFlightIgnoresSlowBatches: a few batches that spent extra round
// trips (a new connection, a health check of an idle one) do not pass for
// the database's work: a mean of them would cut a far database's limit.
func TestInFlightIgnoresSlowBatches(t *testing.T) {
	const rtt = 50 * time.Millisecond
	tune := newInFlight(t.Context(), func(context.Context) (time.Duration, error) { return rtt, nil }, 16)
	tune.measure(t.Context())
	for i := range 200 {
		d := rtt + 500*time.Microsecond
		if i%5 == 0 {
			d = 3 * rtt // one batch in five pays two more round trips
		}
		tune.observe(d)
	}
	tune.close()
	if got := tune.limit(); got != 16 {
		_, batch := tune.roundTrip()
		t.Fatalf("limit %d (batch time %v), want the pool's 16", got, batch)
	}
}

// TestInFlightWaitsForBatches: the limit stays 1 until batchesToTrust
// batches were timed, so that one batch faster than a slow ping cannot
// open the pool to a database nearby.
func TestInFlightWaitsForBatches(t *testing.T) {
	tune := newInFlight(t.Context(), func(context.Context) (time.Duration, error) { return 50 * time.Millisecond, nil }, 16)
	tune.measure(t.Context())
	for i := range batchesToTrust {
		if got := tune.limit(); got != 1 {
			t.Fatalf("after %d batches: limit %d, want 1", i, got)
		}
		tune.observe(51 * time.Millisecond)
	}
	tune.close()
	if got := tune.limit(); got != 16 {
		t.Fatalf("after %d batches: limit %d, want 16", batchesToTrust, got)
	}
}
