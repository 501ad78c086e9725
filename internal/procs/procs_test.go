package procs

import (
	"context"
	"math"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestSizer(t *testing.T) {
	t.Parallel()
	s := NewSizer(Policy{Ceiling: 8})
	if got := s.Procs(); got != 8 {
		t.Fatalf("a new sizer has %d Ps, want the ceiling 8", got)
	}
	type step struct {
		used float64 // cores used in the tick
		want int
		why  string
	}
	steps := []step{
		{0.5, 8, "one calm tick does not halve"},
		{3.0, 8, "a tick between Down and Up breaks the calm"},
	}
	for range DefaultCalm - 1 {
		steps = append(steps, step{0.5, 8, "calm, not yet for long enough"})
	}
	steps = append(steps,
		step{0.5, 4, "Calm ticks below Down of 8 halve"},
		step{3.5, 8, "above Up of 4 doubles at once"},
		step{7.9, 8, "never past the ceiling"},
	)
	for i, st := range steps {
		if got := s.Next(Load{Used: st.used}); got != st.want {
			t.Fatalf("step %d (%s): %v cores used gave %d Ps, want %d", i, st.why, st.used, got, st.want)
		}
	}
	// From the ceiling down to one P, and no further, on an idle process.
	var seen []int
	for range 10 * DefaultCalm {
		if n := s.Next(Load{}); len(seen) == 0 || seen[len(seen)-1] != n {
			seen = append(seen, n)
		}
	}
	if want := []int{8, 4, 2, 1}; !slices.Equal(seen, want) {
		t.Fatalf("an idle process went through %v Ps, want %v", seen, want)
	}
	// One P that the load fills doubles to two.
	if got := s.Next(Load{Used: 0.9}); got != 2 {
		t.Fatalf("0.9 cores used on one P gave %d Ps, want 2", got)
	}
}

// TestSizerWaits: long waits to run add Ps when, over the window, more
// than one in ten and at least minSlow took longer than MaxWait, however
// little CPU the process uses.
func TestSizerWaits(t *testing.T) {
	t.Parallel()
	s := NewSizer(Policy{Ceiling: 2})
	for range DefaultCalm {
		s.Next(Load{Used: 0.1, Waits: 1000})
	}
	if got := s.Procs(); got != 1 {
		t.Fatalf("a calm process has %d Ps, want 1", got)
	}
	// A busy machine: a few long waits in a hundred, and in a tick of
	// four one in six, under one in ten over the window.
	for i := range 5 * DefaultCalm {
		l := Load{Used: 0.2, Waits: 300, Slow: 9}
		if i%4 == 0 {
			l.Slow = 50
		}
		if got := s.Next(l); got != 1 {
			t.Fatalf("tick %d: %d long waits in 300 gave %d Ps, want 1", i, l.Slow, got)
		}
	}
	// One P held by a batch: a fifth of the waits long.
	s.Next(Load{Used: 0.3, Waits: 3000, Slow: 600})
	if got := s.Procs(); got != 2 {
		t.Fatalf("a fifth of the waits long gave %d Ps, want 2", got)
	}
	// At the new Ps the window starts again: the waits read at one P do
	// not count, and a window not yet full tells nothing.
	s = NewSizer(Policy{Ceiling: 4, Calm: 3})
	if got := s.Next(Load{Waits: 100, Slow: 50}); got != 4 {
		t.Fatalf("one tick of a window of three gave %d Ps, want 4", got)
	}
	// Few waits, all long: too few to tell.
	s = NewSizer(Policy{Ceiling: 2, Calm: 1})
	s.Next(Load{})
	if got := s.Next(Load{Waits: 4, Slow: 4}); got != 1 {
		t.Fatalf("four long waits of four gave %d Ps, want 1", got)
	}
}

// TestSizerRemembersAnUndoneHalving: a sweep uses half of two Ps and
// fills one. The sizer halves, doubles again at once, and then keeps two
// Ps while the load stays near the one it halved under; well below it,
// or after forgetTicks, it halves again.
func TestSizerRemembersAnUndoneHalving(t *testing.T) {
	t.Parallel()
	// undone halves two Ps to one under used cores and fills the one P.
	undone := func(used float64) *Sizer {
		t.Helper()
		s := NewSizer(Policy{Ceiling: 2})
		for range DefaultCalm {
			s.Next(Load{Used: used})
		}
		if got := s.Procs(); got != 1 {
			t.Fatalf("%v cores on two Ps for a second gave %d Ps, want 1", used, got)
		}
		if got := s.Next(Load{Used: 0.95}); got != 2 {
			t.Fatalf("a full P gave %d Ps, want 2", got)
		}
		return s
	}
	s := undone(0.55)
	for i := range 20 * DefaultCalm {
		if got := s.Next(Load{Used: 0.5 + 0.1*float64(i%2)}); got != 2 {
			t.Fatalf("tick %d: the load the halving failed under gave %d Ps, want 2", i, got)
		}
	}
	for range DefaultCalm {
		s.Next(Load{Used: 0.2})
	}
	if got := s.Procs(); got != 1 {
		t.Fatalf("0.2 cores, well under the load the halving failed under, gave %d Ps, want 1", got)
	}
	// Forgotten after forgetTicks.
	s = undone(0.55)
	for range forgetTicks {
		s.Next(Load{Used: 0.55})
	}
	for range DefaultCalm {
		s.Next(Load{Used: 0.55})
	}
	if got := s.Procs(); got != 1 {
		t.Fatalf("after forgetTicks, 0.55 cores for a second gave %d Ps, want 1", got)
	}
	// A halving from an idle process, undone by a burst, is not held
	// against the next halving.
	s = undone(0.05)
	for range DefaultCalm {
		s.Next(Load{Used: 0.5})
	}
	if got := s.Procs(); got != 1 {
		t.Fatalf("after a burst that undid an idle halving, 0.5 cores for a second gave %d Ps, want 1", got)
	}
}

func TestSizerCeilingNotAPowerOfTwo(t *testing.T) {
	t.Parallel()
	s := NewSizer(Policy{Ceiling: 3, Calm: 1})
	for _, st := range []struct {
		used float64
		want int
	}{{0, 1}, {0.8, 2}, {1.6, 3}, {2.9, 3}, {0, 1}} {
		if got := s.Next(Load{Used: st.used}); got != st.want {
			t.Fatalf("%v cores used gave %d Ps, want %d", st.used, got, st.want)
		}
	}
}

// TestRun drives Run with its own ticks and samples: it hands the
// sizer the cores used and the slow waits between two samples, sets the
// Ps only when they change, and leaves them at the ceiling when it stops.
func TestRun(t *testing.T) {
	t.Parallel()
	ticks, samples := make(chan time.Time), make(chan Sample, 1)
	r := &Reader{Buckets: []float64{0, 0.0005, 0.001, 0.002, math.Inf(1)}, Read: func() (Sample, error) { return <-samples, nil }}
	type change struct {
		procs int
		slow  uint64
	}
	changes := make(chan change, 16)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, NewSizer(Policy{Ceiling: 2, Calm: 2}), ticks, r, nil, func(n int, why Load) { changes <- change{n, why.Slow} })
	}()
	at := time.Unix(1e9, 0)
	var cpu time.Duration
	waits := []uint64{0, 0, 0, 0}
	tick := func(used float64, fast, slow uint64) {
		at = at.Add(Tick)
		cpu += time.Duration(used * float64(Tick))
		waits[0] += fast
		waits[3] += slow // from 2 ms up
		samples <- Sample{At: at, CPU: cpu, Waits: slices.Clone(waits)}
		ticks <- at
	}
	tick(0, 0, 0)      // the first sample has nothing before it
	tick(0.1, 100, 0)  // calm 1
	tick(0.1, 100, 0)  // calm 2: one P
	tick(0.2, 100, 4)  // four long waits: too few to count
	tick(0.2, 100, 30) // 34 of 234 in the window: two
	tick(1.0, 100, 0)  // stays at two
	tick(0.1, 100, 0)
	tick(0.1, 100, 0) // one P
	tick(0.9, 100, 0) // two
	cancel()
	<-done
	close(changes)
	var got []change
	for c := range changes {
		got = append(got, c)
	}
	if want := []change{{1, 0}, {2, 30}, {1, 0}, {2, 0}}; !slices.Equal(got, want) {
		t.Fatalf("Run changed the Ps %v, want %v", got, want)
	}
}

// TestSizerHeld: a held tick puts the sizer on the ceiling, and an idle
// process stays there while held; Calm ticks after the hold it halves.
func TestSizerHeld(t *testing.T) {
	t.Parallel()
	s := NewSizer(Policy{Ceiling: 4, Calm: 2})
	for range 4 {
		s.Next(Load{})
	}
	if got := s.Procs(); got != 1 {
		t.Fatalf("an idle process on %d Ps, want 1", got)
	}
	for i := range 5 {
		if got := s.Next(Load{Held: true}); got != 4 {
			t.Fatalf("held tick %d: %d Ps, want the ceiling 4", i, got)
		}
	}
	if s.Next(Load{}) != 4 || s.Next(Load{}) != 2 {
		t.Fatalf("after the hold: %d Ps; want 4 for one calm tick, then 2", s.Procs())
	}
}

// TestRunHolds: a hold sets the ceiling at once, not at the next tick;
// an idle process stays there while the hold is on, and a hold that began
// and ended between two ticks still holds the tick; then the sizer halves
// again as before.
func TestRunHolds(t *testing.T) {
	t.Parallel()
	ticks, samples := make(chan time.Time), make(chan Sample)
	r := &Reader{Read: func() (Sample, error) { return <-samples, nil }}
	at := time.Unix(1e9, 0)
	sample := func() { at = at.Add(Tick); samples <- Sample{At: at} } // idle
	tick := func() { ticks <- at; sample() }
	type change struct {
		procs int
		held  bool
	}
	changes := make(chan change, 16)
	var h Holds
	h.Hold()() // before Run: nothing to hold
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, NewSizer(Policy{Ceiling: 2, Calm: 1}), ticks, r, &h, func(n int, why Load) { changes <- change{n, why.Held} })
	}()
	next := func() change {
		t.Helper()
		select {
		case c := <-changes:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no change of the Ps in 10 s")
			return change{}
		}
	}
	tick() // the first sample
	tick() // calm: one P
	if c := next(); c != (change{1, false}) {
		t.Fatalf("an idle tick: %+v, want one P", c)
	}
	release := h.Hold()
	if c := next(); c != (change{2, true}) {
		t.Fatalf("a hold: %+v, want the ceiling at once", c)
	}
	for range 3 {
		tick() // idle, held
	}
	release()
	release() // a second release changes nothing
	tick()    // held for part of the tick: still two
	// Run waits for the next tick's sample: it has done with the last.
	ticks <- at
	if n := len(changes); n != 0 {
		t.Fatalf("%d changes by the tick the hold ended in; want none", n)
	}
	sample() // calm: one P
	if c := next(); c != (change{1, false}) {
		t.Fatalf("after the hold: %+v, want one P", c)
	}
	h.Hold()() // begun and ended between two ticks
	if c := next(); c != (change{2, true}) {
		t.Fatalf("a short hold: %+v, want the ceiling at once", c)
	}
	tick() // held
	tick() // calm: one P
	cancel()
	<-done
	close(changes)
	var rest []change
	for c := range changes {
		rest = append(rest, c)
	}
	if want := []change{{1, false}, {2, false}}; !slices.Equal(rest, want) {
		t.Fatalf("then Run set %+v, want %+v (one P after the held tick, the ceiling when it stopped)", rest, want)
	}
	h.Hold()() // after Run: nothing to hold
}

// TestRunLeavesTheCeiling: a Run that stopped on fewer Ps sets the
// ceiling back.
func TestRunLeavesTheCeiling(t *testing.T) {
	t.Parallel()
	ticks := make(chan time.Time)
	at := time.Unix(1e9, 0)
	r := &Reader{Read: func() (Sample, error) { at = at.Add(Tick); return Sample{At: at}, nil }}
	var set []int
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, NewSizer(Policy{Ceiling: 4, Calm: 1}), ticks, r, nil, func(n int, _ Load) { set = append(set, n) })
	}()
	for range 3 {
		ticks <- time.Time{} // Run reads the time of its samples, not of its ticks
	}
	cancel()
	<-done
	if want := []int{2, 1, 4}; !slices.Equal(set, want) {
		t.Fatalf("Run set %v Ps, want %v", set, want)
	}
}

// TestNewReader reads this process: its CPU time grows while it spins,
// and its waits to run are counted, in runtime/metrics' buckets.
func TestNewReader(t *testing.T) {
	t.Parallel()
	r := NewReader()
	a, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
	}
	done := make(chan struct{})
	for range 1000 {
		go func() { done <- struct{}{} }()
		<-done
	}
	b, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	if !b.At.After(a.At) || b.CPU <= a.CPU {
		t.Fatalf("20 ms spinning read %v then %v", a.CPU, b.CPU)
	}
	if len(r.Buckets) != len(b.Waits)+1 {
		t.Fatalf("%d buckets for %d counts", len(r.Buckets), len(b.Waits))
	}
	var before, after uint64
	for i := range b.Waits {
		before, after = before+a.Waits[i], after+b.Waits[i]
	}
	if after <= before { // the runtime samples the waits it counts
		t.Fatalf("1000 goroutines started and run: the waits counted went from %d to %d", before, after)
	}
	if l := r.load(a, b, DefaultWait); l.Used <= 0 || l.Waits == 0 || l.Slow > l.Waits {
		t.Fatalf("load %+v", l)
	}
}

// TestNewReaderSeesAQueue: goroutines queued behind the one P, each
// running 50 µs, wait for the ones before them, and the reader counts most
// of their waits as long. Not parallel: it runs on one P.
func TestNewReaderSeesAQueue(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	r := NewReader()
	a, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(func() {
			for end := time.Now().Add(50 * time.Microsecond); time.Now().Before(end); {
			}
		})
	}
	wg.Wait()
	b, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	l := r.load(a, b, DefaultWait)
	t.Logf("%d waits of %d longer than %v", l.Slow, l.Waits, DefaultWait)
	if l.Slow*2 < l.Waits || l.Waits < 50 {
		t.Fatalf("1000 goroutines queued behind one P: %d waits of %d longer than %v", l.Slow, l.Waits, DefaultWait)
	}
}
