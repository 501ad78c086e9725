package ledgertest

import (
	"sync"
	"time"
)

// Clock is a fake clock, safe for concurrent use. Its times are whole
// microseconds, the precision of SQL timestamps.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a Clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock {
	return &Clock{now: start.Truncate(time.Microsecond)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d, rounded down to a microsecond.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d.Truncate(time.Microsecond))
}
