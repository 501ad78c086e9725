package bench

import (
	"context"
	"time"
)

// Paced offers n operations at rate a second from one client, open loop:
// the i-th is due at the start plus i/rate, and starts then or, when the
// one before ran late, as soon as that one ends. Each latency counts from
// when the operation was due, so a stall shows in every operation it
// delays, not only in the one it hit (the closed loop's coordinated
// omission). The result's workload is "paced"; PerSecond is the rate
// served. It stops early when ctx ends.
func Paced(ctx context.Context, target string, op Op, rate float64, n int) Result {
	every := time.Duration(float64(time.Second) / rate)
	lat := make([]time.Duration, 0, n)
	var m meter
	start := time.Now()
	cpu0, all0 := cpuTime(), machineCPUTime()
	for i := range n {
		due := start.Add(time.Duration(i) * every)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		if err := op(ctx, 0, seq.Add(1)); err != nil {
			if m.errs++; m.first == "" {
				m.first = err.Error()
			}
			continue
		}
		m.ops++
		lat = append(lat, time.Since(due))
	}
	m.secs = time.Since(start).Seconds()
	m.cpu = cpuTime() - cpu0
	m.other = max(machineCPUTime()-all0-m.cpu, 0)
	m.lat = lat
	return m.result(target, PacedWorkload, 1)
}

// PacedWorkload is the workload name of Paced's results.
const PacedWorkload = "paced"
