package main

import (
	"context"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestGrowthSteps: a small run writes every step's row, the sweep handles
// the first half's records, and the store reopens.
func TestGrowthSteps(t *testing.T) {
	var out strings.Builder
	cfg := config{records: 2000, writers: 2, fillers: 8, outcome: 100, measure: 100 * time.Millisecond}
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	rows := out.String()
	for _, step := range []string{"empty", "first half written", "second half written", "during the sweep", "after the sweep", "reopened in"} {
		if !strings.Contains(rows, "| "+step) {
			t.Errorf("no %q row:\n%s", step, rows)
		}
	}
	// Each of the first half's 1,000 records is shrunk, then deleted: at
	// least 1,000 steps.
	m := regexp.MustCompile(`during the sweep \((\d+) steps`).FindStringSubmatch(rows)
	if m == nil || len(m[1]) < 4 {
		t.Errorf("the sweep handled too little:\n%s", rows)
	}
}

// TestPacedRun: with -paced, a run says what it offers after the empty
// store's row, measures the empty store again at that rate (the paced
// rows' baseline), and goes through every step.
func TestPacedRun(t *testing.T) {
	var out strings.Builder
	cfg := config{records: 1000, writers: 2, fillers: 4, outcome: 100, measure: 100 * time.Millisecond, paced: 0.5}
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	rows := out.String()
	if !strings.Contains(rows, "pairs/s offered (0.50 of empty)") || !strings.Contains(rows, "| empty, paced") || !strings.Contains(rows, "| after the sweep") {
		t.Errorf("a paced run's rows:\n%s", rows)
	}
}

// TestPacedWritersKeepTheSchedule: paced writers never start a pair
// before it is due, however fast the store: over the measurement they
// complete at most the rate's pairs.
func TestPacedWritersKeepTheSchedule(t *testing.T) {
	const rate = 2000.0
	stop := make(chan error, 1)
	var ops atomic.Int64
	start := time.Now()
	time.AfterFunc(200*time.Millisecond, func() { stop <- nil })
	r := measureUntil(t.Context(), 4, stop, rate, func(context.Context, int, int64) error { ops.Add(1); return nil })
	elapsed := time.Since(start).Seconds()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if limit := rate*elapsed + 1; float64(ops.Load()) > limit {
		t.Fatalf("%d pairs in %.3f s at %v a second: some started before they were due", ops.Load(), elapsed, rate)
	}
	if ops.Load() == 0 || r.p50 < 0 {
		t.Fatalf("%d pairs, p50 %v ms", ops.Load(), r.p50)
	}
}
