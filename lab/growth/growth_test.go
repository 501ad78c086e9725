package growth

import (
	"context"
	"io"
	"math"
	"regexp"
	"runtime/metrics"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger/pebble"
)

// TestGrowthSteps: a small run writes every step's row, the sweep handles
// the first half's records, and the store reopens.
func TestGrowthSteps(t *testing.T) {
	var out strings.Builder
	cfg := Config{Records: 2000, Writers: 2, Fillers: 8, Outcome: 100, Measure: 100 * time.Millisecond}
	results, err := Run(t.Context(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	rows := out.String()
	for _, step := range []string{"empty", "first half written", "second half written", "during the sweep", "after the sweep", "reopened in"} {
		if !strings.Contains(rows, "| "+step) {
			t.Errorf("no %q row:\n%s", step, rows)
		}
	}
	// A result a measured step, each with its pairs.
	var steps []string
	for _, r := range results {
		steps = append(steps, r.Workload)
		if r.Target != "growth/embedded 2000 records" || r.Clients != 2 || r.Ops == 0 || r.PerSecond <= 0 || r.P99ms < r.P50ms {
			t.Errorf("a step's result: %+v", r)
		}
	}
	if want := []string{Empty, FirstHalf, SecondHalf, Sweeping, AfterSweep}; !slices.Equal(steps, want) {
		t.Errorf("results of %q, want %q", steps, want)
	}
	// Every measured step has syncs of the log and waits for a CPU: both
	// tails are there.
	for _, line := range strings.Split(rows, "\n") {
		cells := strings.Split(line, " | ")
		if !strings.HasPrefix(line, "| ") || len(cells) != 11 || strings.HasPrefix(line, "| step") || strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| reopened") {
			continue
		}
		for _, c := range cells[6:8] {
			if !regexp.MustCompile(`^\d+\.\d\d, \d+\.\d\d$`).MatchString(c) {
				t.Errorf("a step without its tails (%q): %s", c, line)
			}
		}
	}
	// Each of the first half's 1,000 records is shrunk, then deleted: at
	// least 1,000 steps.
	m := regexp.MustCompile(`during the sweep \((\d+) steps`).FindStringSubmatch(rows)
	if m == nil || len(m[1]) < 4 {
		t.Errorf("the sweep handled too little:\n%s", rows)
	}
}

// TestPacedRun: paced, a run says what it offers after the empty store's
// row flat out, measures the empty store again at that rate (the paced
// steps' baseline, Empty), and goes through every step.
func TestPacedRun(t *testing.T) {
	var out strings.Builder
	cfg := Config{Records: 1000, Writers: 2, Fillers: 4, Outcome: 100, Measure: 100 * time.Millisecond, Paced: 0.5}
	results, err := Run(t.Context(), cfg, &out)
	if err != nil {
		t.Fatal(err)
	}
	rows := out.String()
	if !strings.Contains(rows, "pairs/s offered (0.50 of empty)") || !strings.Contains(rows, "| empty, flat out") || !strings.Contains(rows, "| after the sweep") {
		t.Errorf("a paced run's rows:\n%s", rows)
	}
	var steps []string
	for _, r := range results {
		steps = append(steps, r.Workload)
	}
	if want := []string{EmptyFlatOut, Empty, FirstHalf, SecondHalf, Sweeping, AfterSweep}; !slices.Equal(steps, want) || results[0].Target != "growth/embedded 1000 records, 0.50 of empty offered" {
		t.Errorf("a paced run's results: %+v", results)
	}
}

// TestBadConfig: a run with nothing to measure is refused before it
// starts.
func TestBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Records: 1, Writers: 1, Fillers: 1, Measure: time.Second},
		{Records: 100, Writers: 0, Fillers: 1, Measure: time.Second},
		{Records: 100, Writers: 1, Fillers: 1},
		{Records: 100, Writers: 1, Fillers: 1, Measure: time.Second, Rate: -1},
		{Records: 100, Writers: 1, Fillers: 1, Measure: time.Second, SweepShare: 2},
		{Records: 100, Writers: 1, Fillers: 1, Measure: time.Second, SweepShare: math.NaN()},
	} {
		if _, err := Run(t.Context(), cfg, io.Discard); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
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

// TestTails: the 99th percentile and the largest observation are the
// bounds of their buckets, from both kinds of histogram.
func TestTails(t *testing.T) {
	bounds := []time.Duration{time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond}
	// 990 syncs under 1 ms, 9 under 5, 1 over 10 ms (beyond the last bound).
	syncs := func(counts ...uint64) pebble.WALSyncs {
		w := pebble.WALSyncs{Count: counts[len(counts)-1]}
		for i, le := range bounds {
			w.Buckets = append(w.Buckets, pebble.WALSyncBucket{Le: le, Count: counts[i]})
		}
		return w
	}
	before, after := syncs(5, 5, 5, 5, 5), syncs(995, 995, 1004, 1004, 1005)
	if got, want := syncTail(before, after), (tail{p99: time.Millisecond, max: 10 * time.Millisecond}); got != want {
		t.Errorf("syncTail = %+v, want %+v", got, want)
	}
	if got := syncTail(after, after).String(); got != "–" {
		t.Errorf("no syncs: %q", got)
	}
	h := func(counts ...uint64) *metrics.Float64Histogram {
		return &metrics.Float64Histogram{Counts: counts, Buckets: []float64{0, 0.001, 0.002, math.Inf(1)}}
	}
	// 98 waits under 1 ms, 1 under 2 ms, 1 over 2 ms.
	if got, want := schedTail(h(1, 1, 1), h(99, 2, 2)), (tail{p99: 2 * time.Millisecond, max: 2 * time.Millisecond}); got != want {
		t.Errorf("schedTail = %+v, want %+v", got, want)
	}
	if got, want := (tail{p99: 1500 * time.Microsecond, max: 20 * time.Millisecond}).String(), "1.50, 20.00"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

// TestEveryWriterMeasures: a measurement stopped as it starts, as a sweep
// with little to do stops one, still runs a pair a writer, paced or not.
func TestEveryWriterMeasures(t *testing.T) {
	for _, rate := range []float64{0, 1000} {
		stop := make(chan error, 1)
		stop <- nil
		var ops atomic.Int64
		r := measureUntil(t.Context(), 3, stop, rate, func(context.Context, int, int64) error { ops.Add(1); return nil })
		if r.err != nil || r.ops < 3 || r.ops != ops.Load() {
			t.Errorf("rate %v: %d pairs measured of %d run (%v), want a writer's at least", rate, r.ops, ops.Load(), r.err)
		}
	}
}
