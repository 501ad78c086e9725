package recordkv

import (
	"sync/atomic"
	"time"
)

// stepThreshold is how far the wall clock may move from the monotonic
// clock before the store calls it a step.
const stepThreshold = time.Second

// MonoClock is an embedded store's clock when its Config.Now is nil: the wall clock as
// read when the store opened, moved on by the monotonic clock. Leases and
// retentions are compared with it, so a step of the wall clock (an
// operator's date, a VM resumed, NTP stepping) never makes a live lease
// look expired, which would let a duplicate take over, nor a record look
// past its retention, which would let the sweeper delete it early. A step
// is detected, counted and reported to Config.OnClockStep. Across
// restarts the wall clock rules: a step while the store was closed reads
// as time that passed.
type MonoClock struct {
	anchor  time.Time            // the wall clock at the start, no monotonic reading
	wall    func() time.Time     // the wall clock
	elapsed func() time.Duration // monotonic time since the start
	onStep  func(time.Duration)
	skew    atomic.Int64 // wall - store clock when last looked at, in ns
	steps   atomic.Uint64
}

// NewMonoClock starts a clock at the wall clock's time; onStep, when set,
// hears of each step of the wall clock it notices.
func NewMonoClock(onStep func(time.Duration)) *MonoClock {
	start := time.Now()
	return NewMonoClockFrom(func() time.Time { return time.Now().Round(0) }, func() time.Duration { return time.Since(start) }, onStep)
}

// NewMonoClockFrom is NewMonoClock over a given wall clock and monotonic
// clock, for tests.
func NewMonoClockFrom(wall func() time.Time, elapsed func() time.Duration, onStep func(time.Duration)) *MonoClock {
	return &MonoClock{anchor: wall(), wall: wall, elapsed: elapsed, onStep: onStep}
}

// Now returns the store's time, and notes a step of the wall clock.
func (c *MonoClock) Now() time.Time {
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

// Steps returns how many steps of the wall clock the clock noticed.
func (c *MonoClock) Steps() uint64 { return c.steps.Load() }

func abs(d int64) int64 {
	if d < 0 {
		return -d
	}
	return d
}
