// Package backoff is the project's one retry backoff: full jitter over an
// exponential (AWS Architecture Blog, "Exponential Backoff And Jitter").
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// FullJitter returns a uniform wait in [0, min(limit, base·2^(attempt-1)))
// before retry number attempt (from 1); 0 for attempt 0 or less, or when
// base or limit is not positive. It is safe for concurrent use.
func FullJitter(base, limit time.Duration, attempt int) time.Duration {
	if attempt <= 0 || base <= 0 || limit <= 0 {
		return 0
	}
	ceiling := limit
	if attempt < 32 && base<<(attempt-1) > 0 && base<<(attempt-1) < limit {
		ceiling = base << (attempt - 1)
	}
	return rand.N(ceiling)
}

// Sleep waits d, or until ctx ends, whichever is first; it returns ctx's
// error when ctx ended first. d of 0 or less returns at once.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
