package bolt

import (
	"sync/atomic"
	"time"
)

// stepThreshold is how far the wall clock may move from the monotonic
// clock before the store calls it a step.
const stepThreshold = time.Second

// monoClock is the store's clock when Config.Now is nil: the wall clock as
// read when the store opened, moved on by the monotonic clock. Leases and
// retentions are compared with it, so a step of the wall clock (an
// operator's date, a VM resumed, NTP stepping) never makes a live lease
// look expired, which would let a duplicate take over, nor a record look
// past its retention, which would let the sweeper delete it early. A step
// is detected, counted and reported to Config.OnClockStep. Across
// restarts the wall clock rules: a step while the store was closed reads
// as time that passed.
type monoClock struct {
	anchor  time.Time            // the wall clock at the start, no monotonic reading
	wall    func() time.Time     // the wall clock
	elapsed func() time.Duration // monotonic time since the start
	onStep  func(time.Duration)
	skew    atomic.Int64 // wall - store clock when last looked at, in ns
	steps   atomic.Uint64
}

func newMonoClock(onStep func(time.Duration)) *monoClock {
	start := time.Now()
	return newMonoClockFrom(func() time.Time { return time.Now().Round(0) }, func() time.Duration { return time.Since(start) }, onStep)
}

func newMonoClockFrom(wall func() time.Time, elapsed func() time.Duration, onStep func(time.Duration)) *monoClock {
	return &monoClock{anchor: wall(), wall: wall, elapsed: elapsed, onStep: onStep}
}

// Now returns the store's time, and notes a step of the wall clock.
func (c *monoClock) Now() time.Time {
	now := c.anchor.Add(c.elapsed())
	skew := int64(c.wall().Sub(now))
	if last := c.skew.Load(); abs(skew-last) > int64(stepThreshold) && c.skew.CompareAndSwap(last, skew) {
		c.steps.Add(1)
		if c.onStep != nil {
			c.onStep(time.Duration(skew - last))
		}
	}
	return now
}

func abs(d int64) int64 {
	if d < 0 {
		return -d
	}
	return d
}
