// Package growth measures the embedded store as its data grows and is
// swept, as a day of retention does to a ledger: it fills a store with
// records, moves its clock past the first half's retention and tombstone
// window, sweeps that half away while writers run, and reports the
// writers' throughput and latency at each step, the bytes on disk per
// record, the process's memory, and how long the store takes to open.
// ledgerbench runs it after its other targets (-growth-records).
//
// The store lives in a temporary directory; every write is durable.
//
// Each step also gives the 99th percentile and the largest of the log's
// syncs and of goroutines' waits for a CPU (the runtime's
// /sched/latencies) while it ran: a stall of the writers shows which of
// the two it was, the disk or the cores.
//
// By default the measured writers run flat out, so a slower step shows as
// fewer pairs a second. With Config.Paced f they offer f times the empty
// store's throughput instead (its first measurement, flat out): a pair
// starts when it is due, whether or not the one before has finished, and
// its latency counts from then. At a rate the store keeps up with, growth
// and the sweep show in the latency and in whether the rate is kept, apart
// from each other. Config.Rate r offers r pairs a second instead, the same
// load in runs whose empty stores measured differently (two builds, two
// GOMAXPROCS).
package growth

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/lab/bench"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble"
)

// Config is a run's shape.
type Config struct {
	Records    int           // records written in all; the first half is swept away
	Writers    int           // concurrent writers whose throughput is measured
	Fillers    int           // concurrent writers that fill the store
	Outcome    int           // bytes of each record's outcome
	Measure    time.Duration // how long each throughput measurement runs
	Paced      float64       // offer this fraction of the empty store's throughput after the first measurement; 0: flat out
	Rate       float64       // offer this many pairs a second after the first measurement, whatever Paced says
	SweepBatch int           // records the store sweeps before it rests (pebble.Config.SweepBatch); 0: the store's default
	SweepShare float64       // the share of the time the store sweeps while a backlog lasts (pebble.Config.SweepShare); 0: the store's default
}

// The steps, the workloads of Run's results. Every step after the first
// measurement runs at the load the run offers: the empty store's row at
// that load is Empty, and in a paced run the measurement its rate comes
// from is EmptyFlatOut.
const (
	Empty        = "empty"
	EmptyFlatOut = "empty, flat out"
	FirstHalf    = "first half written"
	SecondHalf   = "second half written"
	Sweeping     = "during the sweep"
	AfterSweep   = "after the sweep"
)

// Prefix begins the name of every run's results.
const Prefix = "growth/"

// Target names a run's results: the store, the records and the load.
func Target(cfg Config) string {
	name := fmt.Sprintf("%sembedded %d records", Prefix, cfg.Records)
	switch {
	case cfg.Rate > 0:
		name += fmt.Sprintf(", %.0f pairs/s offered", cfg.Rate)
	case cfg.Paced > 0:
		name += fmt.Sprintf(", %.2f of empty offered", cfg.Paced)
	}
	return name
}

// Run measures the store, writes a row a step to w as it goes, and
// returns each measured step as a result: Target(cfg), the step as its
// workload, the writers as its clients.
func Run(ctx context.Context, cfg Config, w io.Writer) ([]bench.Result, error) {
	if cfg.Records < 2 || cfg.Writers < 1 || cfg.Fillers < 1 || cfg.Outcome < 0 || cfg.Measure <= 0 || !(cfg.Paced >= 0 && cfg.Rate >= 0 && cfg.SweepShare >= 0 && cfg.SweepShare <= 1) {
		return nil, fmt.Errorf("growth: records (%d) of 2 or more, writers (%d) and fillers (%d) of 1 or more, a measurement time (%v), no negative outcome, pace or rate, and a sweep share of at most 1",
			cfg.Records, cfg.Writers, cfg.Fillers, cfg.Measure)
	}
	dir, err := os.MkdirTemp("", "growth-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := pebble.Open(dir, pebble.Config{Now: clock.Now, SweepBatch: cfg.SweepBatch, SweepShare: cfg.SweepShare})
	if err != nil {
		return nil, err
	}
	defer func() { _ = s.Close() }()
	l := ledger.New(s, ledger.Config{})
	// Every outcome is random bytes of its own, which no engine can
	// compress away, as real responses mostly are not.
	outcome := func() *ledger.Outcome {
		v := make([]byte, cfg.Outcome)
		_, _ = crand.Read(v)
		return &ledger.Outcome{Response: &anypb.Any{TypeUrl: "type.googleapis.com/bench.Invoice", Value: v}}
	}
	// observed runs m, and returns its result with what the store and the
	// scheduler did meanwhile: Pebble's write stalls, its log's syncs, and
	// how long goroutines waited for a CPU.
	observed := func(m func() timed) timed {
		stalls, syncs, sched := s.WriteStalls(), s.WALSyncs(), schedLatencies()
		r := m()
		after := s.WriteStalls()
		r.stalls = pebble.WriteStalls{Count: after.Count - stalls.Count, Waited: after.Waited - stalls.Waited}
		r.sync = syncTail(syncs, s.WALSyncs())
		r.sched = schedTail(sched, schedLatencies())
		return r
	}
	var results []bench.Result
	// row writes a step's row, live counting the records the store holds
	// (tombstones included), the measurements' own among them.
	row := func(step, label string, r timed) error {
		counts, err := s.CountByState(ctx)
		if err != nil {
			return err
		}
		var live int64
		for _, c := range counts.ByState() {
			live += int64(c)
		}
		size := diskBytes(dir)
		perRecord := "–"
		if live > 0 {
			perRecord = strconv.FormatInt(size/live, 10)
		}
		fmt.Fprintf(w, "| %s | %d | %.0f | %.2f | %.2f | %d, %.2f s | %s | %s | %d | %s | %d |\n", label, live, r.perSecond, r.p50, r.p99,
			r.stalls.Count, r.stalls.Waited.Seconds(), r.sync, r.sched, size, perRecord, rssMiB())
		results = append(results, bench.Result{Target: Target(cfg), Workload: step, Clients: cfg.Writers,
			Ops: r.ops, Seconds: r.seconds, PerSecond: r.perSecond, P50ms: r.p50, P99ms: r.p99})
		return nil
	}
	pair := func(prefix string) op {
		return func(ctx context.Context, w int, n int64) error {
			sc := ledger.Scope{Namespace: "bench", Tenant: "acme", Key: fmt.Sprintf("%s-%d-%d", prefix, w, n)}
			res, err := l.Begin(ctx, ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
			if err != nil {
				return err
			}
			_, err = l.Complete(ctx, sc, res.Claim.Token, outcome())
			return err
		}
	}
	// measured measures a step and writes its row.
	measured := func(step string, rate float64, prefix string) (timed, error) {
		stop := make(chan error, 1)
		time.AfterFunc(cfg.Measure, func() { stop <- nil })
		r := observed(func() timed { return measureUntil(ctx, cfg.Writers, stop, rate, pair(prefix)) })
		if r.err != nil {
			return r, r.err
		}
		return r, row(step, step, r)
	}

	fmt.Fprintf(w, "| step | records | pairs/s (%d writers) | p50 ms | p99 ms | write stalls | log sync p99, max ms | wait for a CPU p99, max ms | bytes on disk | bytes per record | RSS MiB |\n", cfg.Writers)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	first := Empty
	if cfg.Paced > 0 || cfg.Rate > 0 {
		first = EmptyFlatOut
	}
	empty, err := measured(first, 0, "m0")
	if err != nil {
		return nil, err
	}
	rate := cfg.Paced * empty.perSecond // 0: flat out
	if cfg.Rate > 0 {
		rate = cfg.Rate
	}
	if rate > 0 {
		fmt.Fprintf(w, "| from here on, %.0f pairs/s offered (%.2f of empty), latency from when each pair was due | | | | | | | | | | |\n", rate, rate/empty.perSecond)
		if _, err := measured(Empty, rate, "m0p"); err != nil {
			return nil, err
		}
	}
	half := int64(cfg.Records / 2)
	if err := fill(ctx, cfg.Fillers, half, pair("a")); err != nil {
		return nil, err
	}
	if _, err := measured(FirstHalf, rate, "m1"); err != nil {
		return nil, err
	}
	// The first half's retention and tombstone window run out.
	clock.Advance(ledger.DefaultRetention + ledger.DefaultTombstoneRetention + time.Hour)
	if err := fill(ctx, cfg.Fillers, half, pair("b")); err != nil {
		return nil, err
	}
	if _, err := measured(SecondHalf, rate, "m2"); err != nil {
		return nil, err
	}

	// Sweep the first half away as the store's Run does (its batches,
	// paced as the store paces them) while the writers run; measure the
	// writers until the sweep ends.
	share, batch := s.SweepShare(), s.SweepBatch()
	var swept int
	sweepDone := make(chan error, 1)
	start := time.Now()
	go func() {
		var failed error
		swept = ledger.Sweeps{Batch: batch, Share: share, Sweep: s.Sweep, OnError: func(err error) { failed = err }}.Backlog(ctx)
		sweepDone <- failed
	}()
	during := observed(func() timed { return measureUntil(ctx, cfg.Writers, sweepDone, rate, pair("m3")) })
	took := time.Since(start)
	if during.err != nil {
		return nil, during.err
	}
	if err := row(Sweeping, fmt.Sprintf("%s (%d steps in %.1f s, share %.2f)", Sweeping, swept, took.Seconds(), share), during); err != nil {
		return nil, err
	}
	for { // what the sweep left, unmeasured
		n, err := s.Sweep(ctx, batch)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
	}
	if _, err := measured(AfterSweep, rate, "m4"); err != nil {
		return nil, err
	}

	if err := s.Close(); err != nil {
		return nil, err
	}
	opened := time.Now()
	s, err = pebble.Open(dir, pebble.Config{Now: clock.Now, SweepBatch: cfg.SweepBatch, SweepShare: cfg.SweepShare})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "| reopened in %.3f s | | | | | | | | %d | | %d |\n", time.Since(opened).Seconds(), diskBytes(dir), rssMiB())
	return results, nil
}

// op is one writer's n-th operation.
type op func(ctx context.Context, w int, n int64) error

// result is a measurement's pairs, over how many seconds, their rate
// and their latency's p50 and p99 in milliseconds.
type result struct {
	ops                 int64
	seconds             float64
	perSecond, p50, p99 float64
}

// fill runs n operations from writers goroutines.
func fill(ctx context.Context, writers int, n int64, o op) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > n {
					return
				}
				if err := o(ctx, w, i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// timed is a measurement: its result, the write stalls during it, the
// tails of the log's syncs and of goroutines' waits for a CPU during it,
// or the error that ended it.
type timed struct {
	result
	stalls      pebble.WriteStalls
	sync, sched tail
	err         error
}

// measureUntil runs o from writers goroutines until stop says so, and
// returns their throughput and latency, or the first error. With a rate
// above 0 the writers share one schedule: the i-th pair is due i/rate
// seconds after the start, a writer waits for the next pair due, and a
// pair's latency counts from when it was due, so a stall shows in the
// latency of every pair it delayed.
func measureUntil(ctx context.Context, writers int, stop <-chan error, rate float64, o op) timed {
	var done atomic.Bool
	var mu sync.Mutex
	var lat []time.Duration
	var first error
	var wg sync.WaitGroup
	var due atomic.Int64 // the next pair of the schedule
	quit := make(chan struct{})
	start := time.Now()
	for w := range writers {
		wg.Go(func() {
			var mine []time.Duration
		pairs:
			// Each writer runs one pair at least, so that a measurement
			// that stop ends at once (a sweep with little to do) still
			// measures something.
			for n := int64(0); n == 0 || !done.Load(); n++ {
				t := time.Now()
				if rate > 0 {
					t = start.Add(time.Duration(float64(due.Add(1)-1) / rate * float64(time.Second)))
					var quitting <-chan struct{} // none for the first pair
					if n > 0 {
						quitting = quit
					}
					select {
					case <-time.After(time.Until(t)): // the pair's start is the subject
					case <-quitting:
						break pairs
					}
				}
				if err := o(ctx, w, n); err != nil {
					mu.Lock()
					first = errors.Join(first, err)
					mu.Unlock()
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	err := <-stop
	done.Store(true)
	close(quit)
	wg.Wait()
	secs := time.Since(start).Seconds()
	slices.Sort(lat)
	r := timed{err: errors.Join(first, err)}
	r.ops, r.seconds = int64(len(lat)), secs
	if len(lat) > 0 {
		r.perSecond = float64(len(lat)) / secs
		r.p50 = float64(lat[len(lat)/2].Microseconds()) / 1000
		r.p99 = float64(lat[len(lat)*99/100].Microseconds()) / 1000
	}
	return r
}

// diskBytes is the size of the files under dir.
func diskBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// rssMiB is the process's resident memory (VmRSS), in MiB; 0 where
// /proc is not there.
func rssMiB() int64 {
	n, _ := bench.RSS("self")
	return n >> 20
}

// schedLatency is the runtime's histogram of how long goroutines waited,
// runnable, for a CPU.
const schedLatency = "/sched/latencies:seconds"

// schedLatencies reads the runtime's histogram of waits for a CPU since
// the process started.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: schedLatency}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// tail is the 99th percentile and the largest of a histogram's
// observations between two readings, each the upper bound of its bucket
// (the lower bound of an unbounded last one); "–" without observations.
type tail struct{ p99, max time.Duration }

func (t tail) String() string {
	if t.max == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f, %.2f", t.p99.Seconds()*1000, t.max.Seconds()*1000)
}

// tailOf is the tail of the observations counts[i] with the upper bounds
// bound(i).
func tailOf(counts []uint64, bound func(i int) time.Duration) tail {
	var total uint64
	for _, c := range counts {
		total += c
	}
	var t tail
	var seen uint64
	for i, c := range counts {
		seen += c
		if t.p99 == 0 && seen > 0 && seen*100 >= total*99 {
			t.p99 = bound(i)
		}
		if c > 0 {
			t.max = bound(i)
		}
	}
	return t
}

// schedTail is the tail of the waits for a CPU between two readings.
func schedTail(before, after *metrics.Float64Histogram) tail {
	if before == nil || after == nil || len(before.Counts) != len(after.Counts) {
		return tail{}
	}
	counts := make([]uint64, len(after.Counts))
	for i := range counts {
		counts[i] = after.Counts[i] - before.Counts[i]
	}
	return tailOf(counts, func(i int) time.Duration {
		b := after.Buckets[i+1]
		if math.IsInf(b, 1) {
			b = after.Buckets[i]
		}
		return time.Duration(b * float64(time.Second))
	})
}

// syncTail is the tail of the log's syncs between two readings (its
// buckets are cumulative).
func syncTail(before, after pebble.WALSyncs) tail {
	if len(before.Buckets) != len(after.Buckets) {
		return tail{}
	}
	counts := make([]uint64, len(after.Buckets)+1)
	var below uint64
	for i, b := range after.Buckets {
		n := b.Count - before.Buckets[i].Count
		counts[i] = n - below
		below = n
	}
	counts[len(after.Buckets)] = (after.Count - before.Count) - below // beyond the last bound
	return tailOf(counts, func(i int) time.Duration {
		return after.Buckets[min(i, len(after.Buckets)-1)].Le
	})
}
