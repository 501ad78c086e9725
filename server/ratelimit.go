package server

import (
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// RateLimit gives each namespace its own token bucket (golang.org/x/time/rate):
// PerSecond calls a second on average, in bursts of up to Burst. A call
// beyond it is RATE_LIMITED, with the wait until the bucket has a token as
// its retry-after; a refused call takes no token. It is safe for concurrent
// use.
type RateLimit struct {
	limit   rate.Limit
	burst   int
	now     func() time.Time
	mu      sync.Mutex
	buckets map[string]*rate.Limiter
}

// NewRateLimit returns a RateLimit of perSecond calls a second and bursts of
// burst (at least 1) per namespace.
func NewRateLimit(perSecond float64, burst int) *RateLimit {
	return &RateLimit{limit: rate.Limit(perSecond), burst: max(burst, 1), now: time.Now, buckets: map[string]*rate.Limiter{}}
}

// Allow takes a token from namespace's bucket, or returns RATE_LIMITED with
// the wait until one will be there.
func (r *RateLimit) Allow(namespace string) error {
	r.mu.Lock()
	b, ok := r.buckets[namespace]
	if !ok {
		b = rate.NewLimiter(r.limit, r.burst)
		r.buckets[namespace] = b
	}
	r.mu.Unlock()
	now := r.now()
	res := b.ReserveN(now, 1)
	wait := res.DelayFrom(now)
	if wait == 0 {
		return nil
	}
	res.CancelAt(now)
	if !res.OK() || wait == rate.InfDuration {
		wait = time.Second
	}
	return &errcode.Error{
		Code:       errcode.RateLimited,
		Message:    "the namespace is over its rate limit",
		RetryAfter: max(wait.Round(time.Millisecond), time.Millisecond),
	}
}
