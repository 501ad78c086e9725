package pebble

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// What the store does on a bad day of its disk:
//
//   - A disk short of room: every write is refused, UNAVAILABLE and
//     retryable, while the disk has less free space than Config.DiskReserve,
//     so that Pebble, whose first failed log write breaks it for good, does
//     not meet a full disk. Reads go on; writes resume when room returns.
//   - A failed write of Pebble's log all the same (the disk filled between
//     the check and the write, or failed): Pebble can write no more, and may
//     hold in memory writes its log lacks. The store fails: every call after
//     it is refused, UNAVAILABLE, with ledger.ErrMustRestart, and the process
//     goes on answering. A restart opens the store from what its log holds.
//   - Pebble's error lines (a flush failing on a full disk retries every
//     second or faster) are rate-limited per kind of line.

// diskFull is the refusal of a write while the disk is short of room.
func diskFull(free, reserve uint64) error {
	return &errcode.Error{
		Code: errcode.Unavailable, RetryAfter: 5 * time.Second, Metadata: map[string]string{errcode.MetaCause: errcode.CauseStore},
		Message: fmt.Sprintf("the disk of the ledger's embedded store is full (%d bytes free, below the %d it keeps in reserve): "+
			"writes resume when room is made", free, reserve),
	}
}

// diskFresh is how long a reading of the disk's free space serves the
// writes that follow it: at 20,000 writes a second, one reading in twenty
// instead of one a write (a statfs a write was 7% of ledgerd's CPU at 128
// clients). A disk that falls below the reserve is seen by the first write
// a millisecond later at most; the reserve is there for the writes of that
// millisecond.
const diskFresh = time.Millisecond

// diskReading is a reading of the store's disk, and when it was taken by
// the store's clock.
type diskReading struct {
	at          time.Time
	free, total uint64
}

// room refuses a write while the store's disk has less free space than
// its reserve; a disk whose usage cannot be read is let through.
func (s *Store) room() error {
	r := s.disk.Load()
	if now := s.cfg.Now(); r == nil || now.Sub(r.at) > diskFresh || now.Before(r.at) {
		du, err := s.fs.GetDiskUsage(s.path)
		if err != nil {
			return nil //nolint:nilerr // a disk whose usage cannot be read (a file system in memory) takes the write
		}
		r = &diskReading{at: now, free: du.AvailBytes, total: du.TotalBytes}
		s.disk.Store(r)
	}
	reserve := uint64(s.cfg.DiskReserve)
	if s.cfg.DiskReserve == 0 {
		reserve = min(64<<20, r.total/20)
	}
	if r.free < reserve {
		return diskFull(r.free, reserve)
	}
	return nil
}

// failure is the first fatal error Pebble reported; once set, the store
// refuses every call.
type failure struct {
	first atomic.Pointer[string]
	log   *slog.Logger
}

// note records msg as the failure if it is the first, and says so once.
func (f *failure) note(msg string) {
	if f.first.CompareAndSwap(nil, &msg) {
		f.log.Error("pebble: the store failed and takes no more calls until ledgerd restarts", "error", msg)
	}
}

// err is the refusal of a call to a failed store, nil while it works.
func (f *failure) err() error {
	msg := f.first.Load()
	if msg == nil {
		return nil
	}
	return &errcode.Error{
		Code: errcode.Unavailable, RetryAfter: 5 * time.Second, Metadata: map[string]string{errcode.MetaCause: errcode.CauseStore},
		Message: "the ledger's embedded store failed a write and must be reopened: restart ledgerd (once its disk has room)",
		Err:     fmt.Errorf("%w: %s", ledger.ErrMustRestart, *msg),
	}
}

// WriteStalls is what Pebble's write stalls have cost since Open: how
// many began, and how long writes waited in them. Pebble holds writes
// back while its memtables wait to be flushed, or level 0 to be
// compacted, when the disk or the CPU falls behind the writes.
type WriteStalls struct {
	Count  uint64
	Waited time.Duration
}

// stalls counts Pebble's write stalls from its events, one at a time: a
// stall ends before the next begins.
type stalls struct {
	mu    sync.Mutex
	began time.Time // zero: none now
	WriteStalls
}

func (st *stalls) begin(pebbledb.WriteStallBeginInfo) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.Count++
	st.began = time.Now()
}

func (st *stalls) end() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.began.IsZero() {
		st.Waited += time.Since(st.began)
		st.began = time.Time{}
	}
}

// read is the stalls so far, the one under way counted to now.
func (st *stalls) read() WriteStalls {
	st.mu.Lock()
	defer st.mu.Unlock()
	w := st.WriteStalls
	if !st.began.IsZero() {
		w.Waited += time.Since(st.began)
	}
	return w
}

// WriteStalls returns the write stalls since Open.
func (s *Store) WriteStalls() WriteStalls { return s.stalls.read() }

// jobs brackets Pebble's flushes and compactions for Config.OnBackground,
// by their job ids: Pebble begins and ends each under its own lock, and
// several may run at once.
type jobs struct {
	on   func() (done func()) // nil: nothing to do
	mu   sync.Mutex
	done map[int]func()
}

func (j *jobs) begin(id int) {
	if j.on == nil {
		return
	}
	done := j.on()
	j.mu.Lock()
	defer j.mu.Unlock()
	j.done[id] = done
}

func (j *jobs) end(id int) {
	j.mu.Lock()
	done, ok := j.done[id]
	delete(j.done, id)
	j.mu.Unlock()
	if ok {
		done()
	}
}

// WALSyncs is how long the store's log syncs took since Open: each is
// one fdatasync of Pebble's write-ahead log, which every write waits for
// before it is acknowledged (a sync serves every write queued behind
// it). Buckets count as a Prometheus histogram's do, cumulatively:
// Buckets[i].Count syncs took at most Buckets[i].Le. A slow disk shows
// here; a write that waits for a CPU after its sync does not. A sync is
// counted a moment after the writes it made durable are acknowledged.
type WALSyncs struct {
	Count   uint64
	Sum     time.Duration
	Buckets []WALSyncBucket
}

// WALSyncBucket is one bound of WALSyncs.
type WALSyncBucket struct {
	Le    time.Duration
	Count uint64
}

// walSyncBounds choose the bounds WALSyncs reports among Pebble's own
// (100 µs apart up to 5 ms, then 50 steps of a geometric series up to
// 10 s): for each of these, the first of Pebble's at or above it, so
// that every count is Pebble's, exact.
var walSyncBounds = []time.Duration{
	100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
}

// WALSyncs returns the log's syncs since Open; none once the store is
// closed or has failed.
func (s *Store) WALSyncs() WALSyncs {
	var m dto.Metric
	if err := s.with(func(db *pebbledb.DB) error { return db.Metrics().LogWriter.FsyncLatency.Write(&m) }); err != nil {
		return WALSyncs{}
	}
	h := m.GetHistogram()
	w := WALSyncs{Count: h.GetSampleCount(), Sum: time.Duration(h.GetSampleSum())} // Pebble observes nanoseconds
	next := 0
	for _, b := range h.GetBucket() {
		// Pebble's bounds are floats: its last, 10 s, is a hair under.
		le := b.GetUpperBound() * (1 + 1e-9)
		if next == len(walSyncBounds) || le < float64(walSyncBounds[next]) {
			continue
		}
		w.Buckets = append(w.Buckets, WALSyncBucket{Le: time.Duration(b.GetUpperBound()).Round(time.Microsecond), Count: b.GetCumulativeCount()})
		for next < len(walSyncBounds) && le >= float64(walSyncBounds[next]) {
			next++
		}
	}
	return w
}

// fatal is what Fatalf panics with on the commit path, for commit to
// recover.
type fatal struct{ msg string }

// commitFatalf is the format of Pebble's fatal commit error, the one
// Fatalf call made on the goroutine of the caller of Apply.
const commitFatalf = "pebble: fatal commit error: %v"

// commit commits b. A failed commit breaks Pebble (a Fatalf, or a panic
// of a later commit that meets the broken log): it fails the store, and
// is answered as the failure.
func (s *Store) commit(b *pebbledb.Batch, opts *pebbledb.WriteOptions) (err error) {
	if err := s.fail.err(); err != nil {
		return err
	}
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprint(r)
			if f, ok := r.(fatal); ok {
				msg = f.msg
			}
			s.fail.note(msg)
			err = s.fail.err()
		}
	}()
	return b.Commit(opts)
}

// logger is Pebble's logger for one store: informational lines dropped,
// error lines rate-limited, and a fatal error failing the store instead
// of ending the process.
type logger struct {
	fail    *failure
	opening atomic.Bool // in Open, whose goroutine meets every fatal error
	mu      sync.Mutex
	seen    map[string]*logLimit // by format
	log     *slog.Logger
	now     func() time.Time // nil: the wall clock
}

// logLimit is the state of one kind of line: when it was last written,
// and how many were dropped since.
type logLimit struct {
	last    time.Time
	dropped int
}

// logEvery is the least time between two lines of one kind.
const logEvery = 10 * time.Second

func (*logger) Infof(string, ...any) {}

func (l *logger) Errorf(format string, args ...any) {
	l.mu.Lock()
	lim := l.seen[format]
	if lim == nil {
		lim = &logLimit{}
		l.seen[format] = lim
	}
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if !lim.last.IsZero() && now.Sub(lim.last) < logEvery {
		lim.dropped++
		l.mu.Unlock()
		return
	}
	dropped := lim.dropped
	lim.last, lim.dropped = now, 0
	l.mu.Unlock()
	line := fmt.Sprintf("pebble: "+format, args...)
	if dropped > 0 {
		line += fmt.Sprintf(" (and %d more like it in the last %s)", dropped, logEvery)
	}
	l.log.Error(line)
}

// Fatalf fails the store. On the commit path, and in Open, it panics, for
// commit or Open to recover: returning would let Apply report a failed
// write as done. Any other fatal error is met by one of Pebble's own
// goroutines (a flush, a compaction), which it parks for good: returning
// would let Pebble go on from a state it calls fatal, and a panic would
// end the process.
func (l *logger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if l.opening.Load() {
		panic(fatal{msg})
	}
	l.fail.note(msg)
	if format == commitFatalf {
		panic(fatal{msg})
	}
	select {}
}
