// Package procs sizes Go's scheduler to a daemon's load: as few Ps
// (GOMAXPROCS) as the CPU it uses needs, up to the ceiling Go gives it
// (the container's CPU limit, or GOMAXPROCS from the environment).
//
// A call through ledgerd or idemproxy passes through several goroutines:
// ledgerd's transport reader, the call, the store's commit loop, its log
// writer, the transport's writer; idemproxy's connection reader, the call,
// its ledger stream and its upstream's connection. Each hand-off that
// readies a goroutine while a P is idle wakes another thread, and on a VM
// that halts an idle core the wake costs tens of microseconds of the
// kernel's CPU. At a moderate load, calls arriving one at a time, those
// wakes are most of what a call costs; on one P there is no idle P to
// wake. Under a load that one core cannot carry, every P is busy and the
// hand-offs cost nothing more.
//
// So the process starts on the ceiling and halves its Ps once the CPU it
// used stayed below Down of them for Calm ticks in a row. It doubles them
// (up to the ceiling) after a tick in which it used more than Up of them,
// or when over the last Calm ticks more than one wait to run in ten took
// longer than MaxWait: a sweep's batch or a compaction that holds the one
// P for milliseconds makes the calls wait, though the process is far from
// using a core. On a machine whose cores are busy with other processes a
// few waits in a hundred are that long at any number of Ps, more of them
// on one; those are read over a window and do not count. A halving undone
// within seconds is not tried again under the same load for minutes: a
// sweep that uses half of two Ps fills one, and at a light load the waits
// sampled are too few to tell before the CPU does. Work the process knows
// will fill a P for a while (a store's sweep, flush or compaction) holds
// it on the ceiling (Holds): on fewer Ps every call would wait behind it.
package procs

import (
	"context"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Policy is when the Ps change. The zero values take the defaults.
type Policy struct {
	// Ceiling is the most Ps: Go's GOMAXPROCS when the process starts.
	Ceiling int
	// Up doubles the Ps after a tick in which the process used more
	// than this share of them (0.75).
	Up float64
	// Down halves the Ps once the process used less than this share of
	// them for Calm ticks in a row (0.35, 10). Calm ticks are also the
	// window the waits to run are read over.
	Down float64
	Calm int
	// MaxWait doubles the Ps when more than one wait to run in ten,
	// over a window of Calm ticks at the same Ps, took longer (2 ms), and
	// at least minSlow did.
	MaxWait time.Duration
}

// Defaults of Policy.
const (
	DefaultUp   = 0.75
	DefaultDown = 0.35
	DefaultCalm = 10
	DefaultWait = 2 * time.Millisecond
	// Tick is how often Run reads the CPU the process used.
	Tick = 100 * time.Millisecond
)

// minSlow is the fewest long waits in a window that add Ps: the runtime
// samples one wait in eight, so a handful is no share at all.
const minSlow = 5

// A halving undone within undoTicks, from a load of at least minUndone
// cores, shows that the fewer Ps could not carry that load (a sweep or a
// compaction that fills one P, though it used half of two): for
// forgetTicks the sizer halves from those Ps again only under a load
// below retryShare of it. A halving from less (an idle process) undone by
// a burst says nothing of the burst.
const (
	undoTicks   = 50   // 5 s
	forgetTicks = 3000 // 5 min
	retryShare  = 0.8
	minUndone   = 0.25
)

// Sizer decides the Ps from one tick to the next.
type Sizer struct {
	p        Policy
	cur      int
	tick     int
	calm     int     // ticks in a row below Down
	calmUsed float64 // the cores used over them
	window   []Load  // the waits of the last Calm ticks at these Ps
	halved   halving // the last halving
	// undone are the halvings undone, by the Ps halved from.
	undone map[int]halving
}

// halving is a move from more Ps to fewer, at a tick, under a load: the
// cores used over the calm ticks before it, on average.
type halving struct {
	from, to, tick int
	used           float64
}

// NewSizer starts at the ceiling.
func NewSizer(p Policy) *Sizer {
	p.Ceiling = max(p.Ceiling, 1)
	if p.Up <= 0 {
		p.Up = DefaultUp
	}
	if p.Down <= 0 {
		p.Down = DefaultDown
	}
	if p.Calm <= 0 {
		p.Calm = DefaultCalm
	}
	if p.MaxWait <= 0 {
		p.MaxWait = DefaultWait
	}
	return &Sizer{p: p, cur: p.Ceiling, undone: map[int]halving{}}
}

// Procs is the Ps the sizer has decided.
func (s *Sizer) Procs() int { return s.cur }

// Load is what the process did during a tick.
type Load struct {
	Used float64 // cores: CPU time over wall time
	// Waits counts the waits to run (a goroutine ready, then running)
	// the runtime sampled, and Slow those longer than the policy's
	// MaxWait.
	Waits, Slow uint64
	// Held is whether a hold (Holds) was on during the tick.
	Held bool
}

// Next takes the load of the last tick and returns the Ps for the next
// one.
func (s *Sizer) Next(l Load) int {
	if len(s.window) == s.p.Calm {
		s.window = s.window[1:]
	}
	s.window = append(s.window, l)
	var waits, slow uint64
	for _, w := range s.window {
		waits, slow = waits+w.Waits, slow+w.Slow
	}
	waiting := len(s.window) == s.p.Calm && slow >= minSlow && slow*10 > waits
	s.tick++
	switch {
	case l.Held:
		s.to(s.p.Ceiling) // the work held says nothing of the calls' load
	case l.Used > s.p.Up*float64(s.cur), waiting:
		if h := s.halved; h.to == s.cur && s.tick-h.tick <= undoTicks && h.used >= minUndone {
			s.undone[h.from] = h
		}
		s.to(min(2*s.cur, s.p.Ceiling))
	case l.Used < s.p.Down*float64(s.cur) && s.cur > 1 && !s.failedAt(l.Used):
		s.calmUsed += l.Used
		if s.calm++; s.calm >= s.p.Calm {
			s.halved = halving{from: s.cur, to: max(s.cur/2, 1), tick: s.tick, used: s.calmUsed / float64(s.calm)}
			s.to(s.halved.to)
		}
	default:
		s.calm, s.calmUsed = 0, 0
	}
	return s.cur
}

// failedAt reports whether halving from the Ps the sizer has was undone
// lately under a load that used is not well below.
func (s *Sizer) failedAt(used float64) bool {
	h, ok := s.undone[s.cur]
	return ok && s.tick-h.tick <= forgetTicks && used >= retryShare*h.used
}

// to moves to n Ps; the waits read at the Ps before do not count at n.
func (s *Sizer) to(n int) {
	if n != s.cur {
		s.window = s.window[:0]
	}
	s.cur, s.calm, s.calmUsed = n, 0, 0
}

// Sample is the process's CPU time (user and system, every thread) and
// its waits to run so far, at a moment.
type Sample struct {
	At  time.Time
	CPU time.Duration
	// Waits counts the waits to run by how long they took, in the
	// buckets of Reader.Buckets.
	Waits []uint64
}

// Run sizes the Ps until ctx ends: at each tick it reads a sample, hands
// the load since the sample before to s, and calls set when the Ps
// change, with the load that changed them. h, when not nil, holds the Ps
// at the ceiling: its holds set the ceiling through set at once, a tick
// with a hold on is Held, and no fewer Ps are set while one is on. When
// ctx ends Run leaves the Ps at the ceiling.
func Run(ctx context.Context, s *Sizer, ticks <-chan time.Time, r *Reader, h *Holds, set func(procs int, why Load)) {
	if h == nil {
		h = &Holds{}
	}
	h.start(s.p.Ceiling, set)
	defer func() {
		if s.cur != s.p.Ceiling {
			s.cur = s.p.Ceiling
			h.set(s.cur, Load{})
		}
		h.stop()
	}()
	var last Sample
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
		}
		now, err := r.Read()
		if err != nil {
			continue
		}
		held := h.tick()
		if wall := now.At.Sub(last.At); !last.At.IsZero() && wall > 0 {
			before, l := s.cur, r.load(last, now, s.p.MaxWait)
			l.Held = held
			if after := s.Next(l); after != before {
				h.set(after, l)
			}
		}
		last = now
	}
}

// Reader reads samples: of this process by default (NewReader), of
// anything its Read gives.
type Reader struct {
	// Buckets are the bounds of Sample.Waits's buckets, in seconds, as
	// runtime/metrics gives them: bucket i holds the waits from
	// Buckets[i] up to Buckets[i+1].
	Buckets []float64
	Read    func() (Sample, error)
}

// NewReader reads the process's CPU time from getrusage and its waits to
// run from runtime/metrics.
func NewReader() *Reader {
	m := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(m)
	r := &Reader{}
	if m[0].Value.Kind() == metrics.KindFloat64Histogram {
		r.Buckets = m[0].Value.Float64Histogram().Buckets
	}
	r.Read = func() (Sample, error) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return Sample{}, err
		}
		s := Sample{At: time.Now(), CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
		metrics.Read(m)
		if m[0].Value.Kind() == metrics.KindFloat64Histogram {
			s.Waits = slices.Clone(m[0].Value.Float64Histogram().Counts) // Read reuses it
		}
		return s, nil
	}
	return r
}

// load is what the process did between two samples.
func (r *Reader) load(a, b Sample, maxWait time.Duration) Load {
	l := Load{Used: float64(b.CPU-a.CPU) / float64(b.At.Sub(a.At))}
	if len(a.Waits) != len(b.Waits) || len(r.Buckets) != len(b.Waits)+1 {
		return l
	}
	for i := range b.Waits {
		n := b.Waits[i] - a.Waits[i]
		l.Waits += n
		if r.Buckets[i] >= maxWait.Seconds() {
			l.Slow += n
		}
	}
	return l
}

// Size sizes the process's Ps until ctx ends, up to the GOMAXPROCS it
// has when called, held by h (nil: never), and logs each change at debug.
// With one P it returns at once.
func Size(ctx context.Context, log *slog.Logger, h *Holds) {
	ceiling := runtime.GOMAXPROCS(0)
	if ceiling <= 1 {
		return
	}
	t := time.NewTicker(Tick)
	defer t.Stop()
	Run(ctx, NewSizer(Policy{Ceiling: ceiling}), t.C, NewReader(), h, func(n int, why Load) {
		runtime.GOMAXPROCS(n)
		log.DebugContext(ctx, "GOMAXPROCS set", "procs", n, "cores_used", why.Used, "waits", why.Waits, "slow_waits", why.Slow, "held", why.Held)
	})
}

// Holds keeps a process on the ceiling while work it is told of runs: a
// store's sweep, flush or compaction fills a P for as long as it lasts,
// though the process used half of two before it, and on fewer Ps every
// call would wait behind it.
// Its zero value is ready; a hold before Run starts, or after it ends,
// changes nothing.
type Holds struct {
	mu      sync.Mutex
	on      int  // holds not yet released
	recent  bool // a hold was on since the last tick
	cur     int  // the Ps Run set, 0 when Run is not running
	ceiling int
	apply   func(int, Load)
}

// Hold moves the process to the ceiling at once, and keeps it there until
// release is called (once; later calls do nothing).
func (h *Holds) Hold() (release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.on++
	h.recent = true
	if h.apply != nil && h.cur < h.ceiling {
		h.cur = h.ceiling
		h.apply(h.cur, Load{Held: true})
	}
	return sync.OnceFunc(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.on--
		h.recent = true
	})
}

func (h *Holds) start(ceiling int, apply func(int, Load)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur, h.ceiling, h.apply = ceiling, ceiling, apply
}

func (h *Holds) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cur, h.apply = 0, nil
}

// tick reports whether a hold was on since the tick before.
func (h *Holds) tick() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	held := h.on > 0 || h.recent
	h.recent = false
	return held
}

// set applies the sizer's n Ps, unless a hold is on and n is fewer than
// the ceiling (a hold that began after the tick read it): the next tick
// is Held, and the sizer goes back to the ceiling.
func (h *Holds) set(n int, why Load) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.on > 0 && n < h.ceiling || n == h.cur {
		return
	}
	h.cur = n
	h.apply(n, why)
}
