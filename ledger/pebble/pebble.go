// Package pebble provides an embedded ledger.Store on
// github.com/cockroachdb/pebble/v2, CockroachDB's storage engine: a
// log-structured merge tree with a write-ahead log.
//
// Every transition writes its record and its expiry index entry in one
// batch, committed with an fsync of the write-ahead log before the call
// returns, so an acknowledged claim or outcome survives a crash of the
// process or the machine. Concurrent commits share one fsync: the store's
// commit loop sends the writes that arrive while a sync is in flight to
// the log together, in one batch, without a timer. Transitions of one
// scope are serialized by a lock in the process; reads take none. Expired
// records are swept in small batches, and compaction gives their space
// back.
//
// One directory serves one ledgerd: it is the store for a single machine.
// Run several ledgerd instances against ledger/crdb instead.
package pebble

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// DirName is the name of the store's directory in a data directory.
const DirName = "ledger"

// Config configures a Store. The zero value works.
type Config struct {
	// Logger hears what the store says of itself: a failure that needs a
	// restart, damage found on disk, Pebble's own errors (one line of a
	// kind every logEvery). nil: slog.Default().
	Logger *slog.Logger
	// Now is the clock, for tests. nil means the wall clock read at Open,
	// moved on by the monotonic clock (recordkv.MonoClock).
	Now func() time.Time
	// OnClockStep, when set, hears of each step of the wall clock that the
	// store noticed (with Now nil). It must not block.
	OnClockStep func(time.Duration)
	// SweepInterval is the pause of Run between sweeps: 1 min.
	SweepInterval time.Duration
	// SweepBatch is how many expired records one sweep handles: 500.
	SweepBatch int
	// SweepShare is the share of the time Run may spend sweeping while a
	// backlog lasts: 0.25 (after each batch it rests three times as long
	// as the batch took), so that writers keep most of the disk and the
	// CPU when a day's records expire at once. 1 sweeps without rest.
	SweepShare float64
	// OnBackground, when set, is called as the store begins work in the
	// background that fills a core while it lasts (a sweep, a flush of a
	// memtable, a compaction), and the function it returns as that work
	// ends. It must not block. ledgerd holds every P through it
	// (internal/procs.Holds), so that the calls do not wait behind that
	// work on the one P an idle ledgerd runs on.
	OnBackground func() (done func())
	// CacheSize is the block cache, in bytes: 64 MiB. With MemTableSize it
	// bounds the memory the store keeps, whatever the data's size.
	CacheSize int64
	// MemTableSize is the size of a memtable, in bytes: 16 MiB.
	MemTableSize uint64
	// DiskReserve is the free space, in bytes, below which the store
	// refuses writes (UNAVAILABLE, retryable) so that Pebble never meets a
	// full disk: 0 means the smaller of 64 MiB and 5% of the volume. The
	// free space is read at most once a millisecond, by the store's clock.
	DiskReserve int64
	// WatermarkInterval is how often Run records the last acknowledged
	// write in WatermarkFileName: 1 s. Damage to the write-ahead log that
	// loses writes acknowledged before the last record is refused at Open;
	// a loss of only the writes of the last interval goes unseen.
	WatermarkInterval time.Duration

	// fs is the file system of the store, for tests: nil means the disk.
	fs vfs.FS
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = 500
	}
	if !(c.SweepShare > 0 && c.SweepShare <= 1) { // NaN too
		c.SweepShare = 0.25
	}
	if c.CacheSize <= 0 {
		c.CacheSize = 64 << 20
	}
	if c.MemTableSize == 0 {
		c.MemTableSize = 16 << 20
	}
	if c.WatermarkInterval <= 0 {
		c.WatermarkInterval = time.Second
	}
	if c.fs == nil {
		c.fs = vfs.Default
	}
	return c
}

// Store is the embedded ledger.Store on Pebble. It is safe for concurrent
// use within one process.
type Store struct {
	cfg     Config
	clock   *recordkv.MonoClock // nil when Config.Now is set
	seed    maphash.Seed
	locks   [lockStripes]stripe
	id      string
	created bool

	// open guards db: calls hold it for reading, Close for writing, so
	// that no call meets a closed database (Pebble panics there).
	open   sync.RWMutex
	db     *pebbledb.DB
	closed bool

	fs      vfs.FS
	logs    *logFS                      // Pebble's file system
	path    string                      // the store's directory
	disk    atomic.Pointer[diskReading] // the last reading of the free space
	damage  *damage                     // what Pebble reported damaged, for Ping
	fail    *failure                    // what broke Pebble, if anything did
	stalls  *stalls                     // Pebble's write stalls
	mark    *watermark                  // the last acknowledged write
	commits *commits                    // the writes on their way to the log

	// sweeping holds one Sweep at a time and where the next one's listing
	// starts (Sweep).
	sweeping  sync.Mutex
	sweepFrom []byte
}

var _ ledger.Store = (*Store)(nil)

// errClosed is what calls on a closed Store meet.
var errClosed = errors.New("pebble: store closed")

// Open opens the store in the directory dir (created with mode 0700 if
// it does not exist), in its subdirectory DirName. Close the Store when
// done. A second process that opens the same directory fails at once.
//
// A new store gets an identity, kept in the store and in the marker
// IdentityFileName beside it. Open refuses (ErrRefused) a directory whose
// marker names a ledger the store is not, or is there while the store is
// not: starting such a directory as a new ledger would run every retry's
// write again.
func Open(dir string, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pebble: data directory: %w", err)
	}
	path := filepath.Join(dir, DirName)
	want, err := readMarker(dir)
	if err != nil {
		return nil, err
	}
	if _, err := cfg.fs.Stat(path); want != "" && errors.Is(err, fs.ErrNotExist) {
		return nil, lostStore(dir, want)
	}
	logs, err := readySpares(cfg.fs, path, int64(cfg.MemTableSize+cfg.MemTableSize/10))
	if err != nil {
		return nil, err
	}
	s, err := open(path, dir, want, logs, cfg)
	if err != nil {
		logs.close()
		return nil, err
	}
	return s, nil
}

// open opens Pebble in path, on logs, and checks what it opened.
func open(path, dir, want string, logs *logFS, cfg Config) (*Store, error) {
	cache := pebbledb.NewCache(cfg.CacheSize)
	defer cache.Unref()
	damage, fail, stalls := &damage{log: cfg.Logger}, &failure{log: cfg.Logger}, &stalls{}
	jobs := &jobs{on: cfg.OnBackground, done: map[int]func(){}}
	log := &logger{fail: fail, seen: map[string]*logLimit{}, log: cfg.Logger}
	log.opening.Store(true)
	defer log.opening.Store(false)
	opts := &pebbledb.Options{
		FS:           logs,
		Cache:        cache,
		MemTableSize: cfg.MemTableSize,
		Logger:       log,
		// A damaged block fails the reads of the keys it holds, typed
		// INTERNAL, and turns readiness off; Pebble's default would end
		// the process on the first read of it.
		// Write stalls are counted, for WriteStalls; flushes and
		// compactions are work in the background, for OnBackground.
		EventListener: &pebbledb.EventListener{DataCorruption: damage.note, WriteStallBegin: stalls.begin, WriteStallEnd: stalls.end,
			FlushBegin:      func(i pebbledb.FlushInfo) { jobs.begin(i.JobID) },
			FlushEnd:        func(i pebbledb.FlushInfo) { jobs.end(i.JobID) },
			CompactionBegin: func(i pebbledb.CompactionInfo) { jobs.begin(i.JobID) },
			CompactionEnd:   func(i pebbledb.CompactionInfo) { jobs.end(i.JobID) }},
		// A marker says a ledger was here: never start an empty one.
		ErrorIfNotExists: want != "",
	}
	// Every fresh claim first reads a key that is not there. Without a
	// filter that read searches every level whose tables span the key, a
	// data block each; a Bloom filter of 10 bits a key (1% false
	// positives) skips nearly all of them, as CockroachDB's does.
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := openDB(path, opts)
	if errors.Is(err, pebbledb.ErrDBDoesNotExist) {
		return nil, lostStore(dir, want)
	}
	if err != nil && pebbledb.IsCorruptionError(err) {
		return nil, refuse("%s is damaged (%v): restore it from a backup; started as a new, empty ledger it would run every retry's write again", path, err)
	}
	if err != nil && errors.Is(err, fs.ErrNotExist) {
		// The store is there but a file it lists is not: its MANIFEST or
		// a table was deleted, or a truncated MANIFEST lists tables long
		// compacted away. No retry brings the file back.
		return nil, refuse("%s is missing a file it needs, or its MANIFEST is truncated (%v): restore it from a backup; started as a new, empty ledger it would run every retry's write again", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("pebble: open %s: %w", path, err)
	}
	id, created, mark, err := check(db, dir, want)
	if err != nil {
		if fail.err() == nil {
			_ = db.Close()
		}
		return nil, err
	}
	s := &Store{db: db, cfg: cfg, seed: maphash.MakeSeed(), id: id, created: created,
		fs: cfg.fs, logs: logs, path: path, damage: damage, fail: fail, stalls: stalls, mark: mark,
		commits: newCommits()}
	for i := range s.locks {
		s.locks[i].lock = make(chan struct{}, 1)
	}
	go s.commitLoop()
	if cfg.Now == nil {
		s.clock = recordkv.NewMonoClock(cfg.OnClockStep)
		s.cfg.Now = s.clock.Now
	}
	return s, nil
}

// openDB opens Pebble; a fatal error on the way is an error, not the end
// of the process.
func openDB(path string, opts *pebbledb.Options) (db *pebbledb.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pebble: open %s: %v", path, r)
		}
	}()
	return pebbledb.Open(path, opts)
}

// check reads the identity of the store Pebble opened and checks it, and
// its sequence, against the marker and the watermark in dir; a fatal error
// on the way (a full disk fails the identity's write) is an error.
func check(db *pebbledb.DB, dir, want string) (id string, created bool, mark *watermark, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("pebble: open %s: %v", dir, r)
		}
	}()
	if id, created, err = identity(db, dir, want); err != nil {
		return "", false, nil, err
	}
	if mark, err = openWatermark(db, dir); err != nil {
		return "", false, nil, err
	}
	return id, created, mark, nil
}

// damage remembers the first damaged file Pebble reported.
type damage struct {
	first atomic.Pointer[string]
	log   *slog.Logger
}

func (d *damage) note(info pebbledb.DataCorruptionInfo) {
	path := info.Path
	if d.first.CompareAndSwap(nil, &path) {
		d.log.Error("on-disk corruption in the embedded store: restore it from a backup", "file", info.Path, "error", info.Details)
	}
}

// Identity returns the ledger's identity.
func (s *Store) Identity() string { return s.id }

// Created reports whether Open created a new, empty ledger.
func (s *Store) Created() bool { return s.created }

// ClockSteps returns how many steps of the wall clock the store noticed.
func (s *Store) ClockSteps() uint64 {
	if s.clock == nil {
		return 0
	}
	return s.clock.Steps()
}

// Close closes the store. Calls after Close answer UNAVAILABLE.
func (s *Store) Close() error {
	s.open.Lock()
	defer s.open.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.commits.stop) // no call holds s.open: nothing more is queued
	<-s.commits.exited
	if err := s.fail.err(); err != nil {
		// A failed Pebble may wait forever in Close; the process's
		// exit lets go of its files.
		return err
	}
	err := errors.Join(s.db.Close(), s.mark.save())
	s.logs.close()
	return err
}

// with runs f on the open database, or says it is closed.
func (s *Store) with(f func(db *pebbledb.DB) error) error {
	s.open.RLock()
	defer s.open.RUnlock()
	if s.closed {
		return errClosed
	}
	if err := s.fail.err(); err != nil {
		return err
	}
	return f(s.db)
}

// Ping reports whether the store can answer: it reads one key.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if path := s.damage.first.Load(); path != nil {
		return errcode.Errorf(errcode.Internal, "the embedded store is damaged (%s): restore it from a backup", *path)
	}
	return s.classify("ping", s.with(func(db *pebbledb.DB) error {
		_, err := get(db, identityKey)
		return err
	}))
}

// Claim implements ledger.Store. A claim that would change nothing (a
// replay, IN_PROGRESS, KEY_REUSED, RETRY_TOO_LATE) is answered from a
// read, with no write and no fsync; a claim that writes takes the scope's
// lock and decides again.
func (s *Store) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return ledger.ClaimResult{}, s.classify("claim", err)
	}
	var res ledger.ClaimResult
	var readOnly bool
	key := recordKey(p.Scope)
	st := s.stripe(key)
	read := st.begin()
	err := s.with(func(db *pebbledb.DB) error {
		var err error
		if read.rec, err = getRecord(db, p.Scope, key); err != nil {
			return err
		}
		now := s.cfg.Now()
		next, claimed := ledger.NextClaim(read.rec, p, now)
		res, readOnly = ledger.ClaimResult{Record: next, Now: now}, !claimed
		return nil
	})
	if err != nil {
		return ledger.ClaimResult{}, s.classify("claim", err)
	}
	if readOnly && st.settled(read) {
		return res, nil
	}
	// A claim that writes, or whose read met a write still syncing,
	// decides again under the lock.
	err = s.update(ctx, "claim", p.Scope, &read, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, claimed := ledger.NextClaim(cur, p, now)
		res = ledger.ClaimResult{Record: next, Claimed: claimed, Now: now}
		if !claimed {
			return nil, nil
		}
		return &next, nil
	})
	if err != nil {
		return ledger.ClaimResult{}, err
	}
	return res, nil
}

// Complete implements ledger.Store.
func (s *Store) Complete(ctx context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	var rec ledger.Record
	err := s.update(ctx, "complete", p.Scope, nil, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, err := ledger.NextComplete(cur, p, now)
		rec = next
		return &next, err
	})
	if err != nil {
		return ledger.Record{}, err
	}
	return rec, nil
}

// Release implements ledger.Store.
func (s *Store) Release(ctx context.Context, p ledger.ReleaseParams) error {
	return s.update(ctx, "release", p.Scope, nil, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, err := ledger.NextRelease(cur, p, now)
		return &next, err
	})
}

// Extend implements ledger.Store.
func (s *Store) Extend(ctx context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	var rec ledger.Record
	err := s.update(ctx, "extend", p.Scope, nil, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, err := ledger.NextExtend(cur, p, now)
		rec = next
		return &next, err
	})
	if err != nil {
		return ledger.Record{}, err
	}
	return rec, nil
}

// Resolve implements ledger.Store.
func (s *Store) Resolve(ctx context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	var rec ledger.Record
	var now time.Time
	err := s.update(ctx, "resolve", p.Scope, nil, func(cur *ledger.Record, at time.Time) (*ledger.Record, error) {
		next, err := ledger.NextResolve(cur, p, at)
		rec, now = next, at
		return &next, err
	})
	if err != nil {
		return ledger.Record{}, err
	}
	view, _ := rec.AsOf(now)
	return view, nil
}

// Get implements ledger.Store.
func (s *Store) Get(ctx context.Context, scope ledger.Scope) (ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Record{}, s.classify("get", err)
	}
	key := recordKey(scope)
	st := s.stripe(key)
	read := st.begin()
	err := s.with(func(db *pebbledb.DB) error {
		var err error
		read.rec, err = getRecord(db, scope, key)
		return err
	})
	if err == nil && !st.settled(read) {
		read.rec, err = s.readLocked(ctx, scope, key)
	}
	if err != nil {
		return ledger.Record{}, s.classify("get", err)
	}
	view, ok := read.rec.AsOf(s.cfg.Now())
	if !ok {
		return ledger.Record{}, errcode.Errorf(errcode.NotFound, "no record for this key")
	}
	return view, nil
}

// GetMany implements ledger.Store from one snapshot.
func (s *Store) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.classify("get", err)
	}
	keys := make([][]byte, len(scopes))
	reads := make([]seen, len(scopes))
	for i, sc := range scopes {
		keys[i] = recordKey(sc)
		reads[i] = s.stripe(keys[i]).begin()
	}
	err := s.with(func(db *pebbledb.DB) error {
		snap := db.NewSnapshot()
		defer snap.Close()
		for i, sc := range scopes {
			var err error
			if reads[i].rec, err = getRecord(snap, sc, keys[i]); err != nil {
				return err
			}
		}
		return nil
	})
	for i, sc := range scopes {
		if err == nil && !s.stripe(keys[i]).settled(reads[i]) {
			reads[i].rec, err = s.readLocked(ctx, sc, keys[i])
		}
	}
	if err != nil {
		return nil, s.classify("get", err)
	}
	recs := make([]ledger.Record, len(scopes))
	now := s.cfg.Now()
	for i, r := range reads {
		if view, ok := r.rec.AsOf(now); ok {
			recs[i] = view
		}
	}
	return recs, nil
}

// transition computes the record to store from the stored one (nil when
// absent). It returns nil to store nothing, or a rule error (LEASE_LOST),
// which also stores nothing.
type transition func(cur *ledger.Record, now time.Time) (*ledger.Record, error)

// update runs one transition under the scope's lock and commits it with
// an fsync, in the commit loop's next group. It reads the record again
// unless read (when given) is still what Pebble holds: no write of its
// stripe since it began. The call returns at ctx's end if the commit, or
// a commit of its stripe it waits for, takes longer (a stalled disk); the
// commit may still land, as a call cut off by a broken connection may
// have.
func (s *Store) update(ctx context.Context, op string, scope ledger.Scope, read *seen, next transition) error {
	if err := ctx.Err(); err != nil {
		return s.classify(op, err)
	}
	key := recordKey(scope)
	st := s.stripe(key)
	if err := st.lockBy(ctx); err != nil {
		return s.classify(op, err)
	}
	var w *write
	var ruleErr error
	err := s.with(func(db *pebbledb.DB) (err error) {
		w, ruleErr, err = s.queue(db, st, scope, key, read, next)
		return err
	})
	if w == nil {
		st.Unlock()
		if err != nil {
			return s.classify(op, err)
		}
		return ruleErr
	}
	select {
	case err = <-w.done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	return s.classify(op, err)
}

// queue decides a transition under st's lock, held, and queues its write
// for the commit loop, which lets go of the lock. It queues nothing, and
// returns no write, when the transition stores nothing: a rule error
// (ruleErr, an answer, not a failed commit) or no change.
func (s *Store) queue(db *pebbledb.DB, st *stripe, scope ledger.Scope, key []byte, read *seen, next transition) (w *write, ruleErr, err error) {
	var cur *ledger.Record
	if read != nil && read.writes == st.writes.Load() {
		cur = read.rec
	} else if cur, err = st.read(db, scope, key); err != nil {
		return nil, nil, err
	}
	rec, ruleErr := next(cur, s.cfg.Now())
	if ruleErr != nil || rec == nil {
		return nil, ruleErr, nil
	}
	if err := s.room(); err != nil {
		return nil, nil, err // only a write is refused on a full disk
	}
	b := db.NewBatch()
	if err := put(b, key, cur, rec); err != nil {
		_ = b.Close()
		return nil, nil, err
	}
	st.syncing.Add(1) // until the loop counts the write, for settled
	w = &write{b: b, st: st, key: key, rec: rec, done: make(chan error, 1)}
	s.commits.add(w) // under s.open: Close lets the loop commit it
	return w, nil, nil
}

// classify turns what Pebble or the context said into a ledger error, as
// every store does: a call whose context ended is UPSTREAM_TIMEOUT, a
// closed store or a failed disk is UNAVAILABLE, a record that cannot be
// read is INTERNAL.
func (s *Store) classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if e := (*errcode.Error)(nil); errors.As(err, &e) {
		return e // the store's own answer: a full disk, a failed store
	}
	err = fmt.Errorf("pebble: %s: %w", op, err)
	switch {
	case errors.Is(err, recordkv.ErrCorrupt):
		return errcode.Wrap(errcode.Internal, err, "the ledger could not read a record")
	case pebbledb.IsCorruptionError(err):
		return errcode.Wrap(errcode.Internal, err, "the embedded store is damaged where this record is kept")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ledger.TimedOut(err)
	default:
		return ledger.Unavailable(err)
	}
}
