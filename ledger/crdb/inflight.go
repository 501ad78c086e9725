package crdb

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// How many batches run at once (Config.BatchInFlight 0, the default).
//
// A batch's time is the round trip to the database plus the database's
// work on it (its statements and its commit). Batches in flight at once
// share the database's work but not the round trip, which each spends
// waiting. So one batch at a time is right while the round trip is short
// (a database nearby: a second batch would only split the commits), and
// when the round trip is long (a CockroachDB leaseholder a region away)
// the batches that fit are as many as the round trip's share of the
// batch's time allows: about batch / (batch - round trip), and twice that
// for headroom (batchesInFlight), up to the pool's size. At one batch in flight a call that arrives during a batch
// waits for it to end, so at 10 ms of round trip and 8 clients a call
// took 1.5 round trips and the batching ledger ran at 0.53x direct SQL
// (lab/results/README.md).
//
// The round trip is the least of the last pings (pgconn's empty
// statement on a connection already acquired, so neither a pool's wait
// nor a new connection counts), one at New and then one every
// pingInterval while batches run. The batch's time is the median of the
// last batchesKept batches: a mean would take the few batches that spent
// extra round trips (a new connection, a pool's health check of an idle
// one, a retry) for the database's work, and at 50 ms of round trip it
// allowed 4 batches where 16 fit, below one batch in flight.

const (
	pingInterval = 10 * time.Second
	pingsKept    = 6 // a minute of pings: the round trip follows a move of the leaseholder within a minute
	pingTimeout  = 5 * time.Second
	batchesKept  = 63 // an odd number: the median is one of them
	// batchesToTrust is how many batches are timed before the limit
	// leaves 1: one batch faster than a slow ping would allow the pool.
	batchesToTrust = 8
)

// inFlight sets the batches allowed at once from the round trip and the
// batches' time.
type inFlight struct {
	ping func(context.Context) (time.Duration, error)
	max  int
	// life bounds the pings observe starts; close ends it.
	life context.Context
	end  context.CancelFunc

	mu      sync.Mutex
	rtts    []time.Duration // the last pings' round trips, oldest first
	batches []time.Duration // the last batches' times, a ring
	next    int             // where the next batch's time goes in batches
	median  time.Duration   // of batches, kept by observe
	pinged  time.Time
	pinging bool
	wg      sync.WaitGroup
}

// limit is the batches allowed at once now.
func (f *inFlight) limit() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.rtts) == 0 || len(f.batches) < batchesToTrust {
		return 1
	}
	return batchesInFlight(f.median, slices.Min(f.rtts), f.max)
}

// batchesInFlight is how many batches of time batch to allow in flight
// when rtt of it is the round trip. batch / (batch - rtt) of them keep
// the database's work going without a pause; when that is more than one,
// twice as many are allowed, because a call that finds every batch in
// flight waits for one to end, a whole round trip, while the database is
// not what limits it (at 10 ms and 8 clients, the limit without the
// doubling ran 240 pairs/s, and 8 batches allowed ran 291, as many as
// direct SQL). From 1 to most.
func batchesInFlight(batch, rtt time.Duration, most int) int {
	work := batch - rtt
	if work <= batch/time.Duration(most) {
		return most
	}
	n := int(math.Round(float64(batch) / float64(work)))
	if n > 1 {
		n *= 2
	}
	return min(max(n, 1), most)
}

// observe keeps a batch's time, and pings when the last ping is old.
func (f *inFlight) observe(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.batches) < batchesKept {
		f.batches = append(f.batches, d)
	} else {
		f.batches[f.next] = d
	}
	f.next = (f.next + 1) % batchesKept
	sorted := slices.Clone(f.batches)
	slices.Sort(sorted)
	f.median = sorted[len(sorted)/2]
	if !f.pinging && time.Since(f.pinged) >= pingInterval {
		f.pinging = true
		f.wg.Go(func() { f.measure(f.life) })
	}
}

// measure pings the database once and keeps the round trip.
func (f *inFlight) measure(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	rtt, err := f.ping(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pinging, f.pinged = false, time.Now()
	if err == nil {
		f.rtts = append(f.rtts, rtt)
		if len(f.rtts) > pingsKept {
			f.rtts = f.rtts[1:]
		}
	}
}

// roundTrip is the round trip the limit is set from (the least of the
// pings kept), and the batches' median time: zero before the first.
func (f *inFlight) roundTrip() (rtt, batch time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.rtts) > 0 {
		rtt = slices.Min(f.rtts)
	}
	return rtt, f.median
}

// newInFlight is a tuner that pings with ping, allows at most most
// batches, and lives until close; ctx's values go with its pings.
func newInFlight(ctx context.Context, ping func(context.Context) (time.Duration, error), most int) *inFlight {
	life, end := context.WithCancel(context.WithoutCancel(ctx))
	return &inFlight{ping: ping, max: most, life: life, end: end}
}

// close ends a ping under way and waits for it.
func (f *inFlight) close() {
	f.end()
	f.wg.Wait()
}
