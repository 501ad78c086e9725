// Package bolt provides ledgerd's default store: a durable ledger.Store in a
// single file on local disk, on go.etcd.io/bbolt.
//
// Every transition is one bbolt read-write transaction, committed with an
// fsync before the call returns, so an acknowledged claim or outcome
// survives a crash of the process or the machine. Concurrent transitions go
// through a group commit, which commits up to Config.MaxBatchSize of them in one
// transaction and one fsync, without a timer: a lone transition commits at
// once, and those that arrive during a commit share the next one. The file is locked while open: a second
// process that opens it waits Config.OpenTimeout and then fails.
//
// One file serves one ledgerd: it is the store for a single machine. Run
// several ledgerd instances against ledger/crdb instead.
package bolt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/internal/recordkv"
)

// FileName is the name of the store's file in a data directory.
const FileName = "ledger.db"

var (
	recordsBucket = []byte("records") // scope key -> encoded record
	expiryBucket  = []byte("expiry")  // expiry key -> nothing, sorted by expiry
)

// Config configures a Store. The zero value works.
type Config struct {
	// Now is the clock, for tests. nil means the wall clock read at Open,
	// moved on by the monotonic clock, so that a step of the wall clock
	// never expires a lease or a record early (see monoClock).
	Now func() time.Time
	// OnClockStep, when set, hears of each step of the wall clock that the
	// store noticed (with Now nil), with its size; ledgerd logs and counts
	// them. It must not block.
	OnClockStep func(time.Duration)
	// MaxBatchDelay is ignored: transitions share a transaction by
	// arriving while one commits, without waiting for company.
	//
	// Deprecated: the group commit has no timer.
	MaxBatchDelay time.Duration
	// MaxBatchSize caps the transitions of one transaction: 256.
	MaxBatchSize int
	// OpenTimeout is how long Open waits for another process to release
	// the file: 1 s.
	OpenTimeout time.Duration
	// SweepInterval is the pause of Run between sweeps: 1 min.
	SweepInterval time.Duration
	// SweepBatch is how many expired records one sweep deletes: 500.
	SweepBatch int
}

func (c Config) withDefaults() Config {
	if c.MaxBatchDelay <= 0 {
		c.MaxBatchDelay = time.Millisecond
	}
	if c.MaxBatchSize <= 0 {
		c.MaxBatchSize = 256
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = time.Second
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = 500
	}
	return c
}

// Store is the embedded ledger.Store. It is safe for concurrent use within
// one process.
type Store struct {
	db      *bbolt.DB
	commits *committer
	cfg     Config
	clock   *recordkv.MonoClock // nil when Config.Now is set
	id      string
	created bool
}

var (
	_ ledger.Store      = (*Store)(nil)
	_ ledger.ManyGetter = (*Store)(nil)
)

// Open opens the store in the directory dir, which is created with mode
// 0700 if it does not exist. Close the Store when done.
//
// An empty directory gets a new ledger, and the marker IdentityFileName
// beside the file. Open refuses (ErrRefused), with a message that says
// what to do, a directory whose ledger.db is empty, truncated, not a
// ledger file, missing while the marker is there, or another ledger's
// than the marker names: starting such a directory as a new ledger would
// run every retry's write again.
func Open(dir string, cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bolt: data directory: %w", err)
	}
	path := filepath.Join(dir, FileName)
	_, statErr := os.Stat(path)
	fileIsNew := errors.Is(statErr, fs.ErrNotExist)
	switch {
	case statErr != nil && !fileIsNew:
		return nil, fmt.Errorf("bolt: %w", statErr)
	case !fileIsNew:
		if err := checkFile(path); err != nil {
			return nil, err
		}
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: cfg.OpenTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("bolt: %s is locked by another process: %w", path, err)
	}
	if err != nil {
		return nil, fmt.Errorf("bolt: open %s: %w", path, err)
	}
	db.MaxBatchDelay = cfg.MaxBatchDelay
	db.MaxBatchSize = cfg.MaxBatchSize
	err = db.Update(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{recordsBucket, expiryBucket} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("bolt: create buckets in %s: %w", path, err)
	}
	id, created, err := identity(db, dir, fileIsNew)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	s := &Store{db: db, commits: &committer{db: db, maxSize: cfg.MaxBatchSize}, cfg: cfg, id: id, created: created}
	if cfg.Now == nil {
		s.clock = recordkv.NewMonoClock(cfg.OnClockStep)
		s.cfg.Now = s.clock.Now
	}
	return s, nil
}

// ClockSteps returns how many steps of the wall clock the store noticed.
func (s *Store) ClockSteps() uint64 {
	if s.clock == nil {
		return 0
	}
	return s.clock.Steps()
}

// Identity returns the ledger's identity, as the marker beside its file
// records it.
func (s *Store) Identity() string { return s.id }

// Created reports whether Open created a new, empty ledger.
func (s *Store) Created() bool { return s.created }

// Close closes the file. Calls after Close answer UNAVAILABLE.
func (s *Store) Close() error { return s.db.Close() }

// Ping reports whether the store can answer: it runs a read transaction.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.classify("ping", s.db.View(func(*bbolt.Tx) error { return nil }))
}

// Claim implements ledger.Store. A claim that would change nothing (a
// replay, IN_PROGRESS, KEY_REUSED, RETRY_TOO_LATE) is answered from a read
// transaction, with no write and no fsync; only a claim that writes goes
// through a batched write transaction, which decides again.
func (s *Store) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return ledger.ClaimResult{}, s.classify("claim", err)
	}
	var res ledger.ClaimResult
	var readOnly bool
	key := recordkv.ScopeKey(p.Scope)
	err := s.db.View(func(tx *bbolt.Tx) error {
		cur, err := get(tx, p.Scope, key)
		if err != nil {
			return err
		}
		now := s.cfg.Now()
		next, claimed := ledger.NextClaim(cur, p, now)
		res, readOnly = ledger.ClaimResult{Record: next, Claimed: false, Now: now}, !claimed
		return nil
	})
	if err != nil {
		return ledger.ClaimResult{}, s.classify("claim", err)
	}
	if readOnly {
		return res, nil
	}
	err = s.update(ctx, "claim", p.Scope, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, claimed := ledger.NextClaim(cur, p, now)
		res = ledger.ClaimResult{Record: next, Claimed: claimed, Now: now}
		if !claimed {
			return nil, nil
		}
		return &next, nil
	})
	if err != nil {
		return ledger.ClaimResult{}, err // res may still be written by a batch that outlived the call
	}
	return res, nil
}

// Complete implements ledger.Store.
func (s *Store) Complete(ctx context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	var rec ledger.Record
	err := s.update(ctx, "complete", p.Scope, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, err := ledger.NextComplete(cur, p, now)
		rec = next
		return &next, err
	})
	if err != nil {
		return ledger.Record{}, err // rec may still be written by a batch that outlived the call
	}
	return rec, nil
}

// Release implements ledger.Store.
func (s *Store) Release(ctx context.Context, p ledger.ReleaseParams) error {
	return s.update(ctx, "release", p.Scope, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, err := ledger.NextRelease(cur, p, now)
		return &next, err
	})
}

// Extend implements ledger.Store.
func (s *Store) Extend(ctx context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	var rec ledger.Record
	err := s.update(ctx, "extend", p.Scope, func(cur *ledger.Record, now time.Time) (*ledger.Record, error) {
		next, err := ledger.NextExtend(cur, p, now)
		rec = next
		return &next, err
	})
	if err != nil {
		return ledger.Record{}, err // rec may still be written by a batch that outlived the call
	}
	return rec, nil
}

// Resolve implements ledger.Store.
func (s *Store) Resolve(ctx context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	var rec ledger.Record
	var now time.Time
	err := s.update(ctx, "resolve", p.Scope, func(cur *ledger.Record, at time.Time) (*ledger.Record, error) {
		next, err := ledger.NextResolve(cur, p, at)
		rec, now = next, at
		return &next, err
	})
	if err != nil {
		return ledger.Record{}, err // rec may still be written by a batch that outlived the call
	}
	view, _ := rec.AsOf(now)
	return view, nil
}

// Get implements ledger.Store.
func (s *Store) Get(ctx context.Context, scope ledger.Scope) (ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Record{}, s.classify("get", err)
	}
	var rec *ledger.Record
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		rec, err = get(tx, scope, recordkv.ScopeKey(scope))
		return err
	})
	if err != nil {
		return ledger.Record{}, s.classify("get", err)
	}
	view, ok := rec.AsOf(s.cfg.Now())
	if !ok {
		return ledger.Record{}, ledger.Errorf(ledger.CodeNotFound, "no record for this key")
	}
	return view, nil
}

// GetMany implements ledger.ManyGetter in one read transaction.
func (s *Store) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, s.classify("get", err)
	}
	recs := make([]ledger.Record, len(scopes))
	err := s.db.View(func(tx *bbolt.Tx) error {
		now := s.cfg.Now()
		for i, sc := range scopes {
			rec, err := get(tx, sc, recordkv.ScopeKey(sc))
			if err != nil {
				return err
			}
			if view, ok := rec.AsOf(now); ok {
				recs[i] = view
			}
		}
		return nil
	})
	if err != nil {
		return nil, s.classify("get", err)
	}
	return recs, nil
}

// transition computes the record to store from the stored one (nil when
// absent). It returns nil to store nothing, or a rule error (LEASE_LOST),
// which also stores nothing.
type transition func(cur *ledger.Record, now time.Time) (*ledger.Record, error)

// update runs one transition in a batched read-write transaction. DB.Batch
// may run fn more than once (when another function of the batch fails), so
// fn only assigns to the caller's variables and reports rule errors through
// ruleErr, never as the batch's error: a rule error is an answer, not a
// failed transaction.
func (s *Store) update(ctx context.Context, op string, scope ledger.Scope, next transition) error {
	if err := ctx.Err(); err != nil {
		return s.classify(op, err)
	}
	key := recordkv.ScopeKey(scope)
	var ruleErr error
	err := waitFor(ctx, func() error {
		return s.commits.do(func(tx *bbolt.Tx) error {
			cur, err := get(tx, scope, key)
			if err != nil {
				return err
			}
			rec, err := next(cur, s.cfg.Now())
			if ruleErr = err; err != nil || rec == nil {
				return nil //nolint:nilerr // a rule error is an answer, not a failed transaction
			}
			return put(tx, key, cur, rec)
		})
	})
	if err != nil {
		return s.classify(op, err)
	}
	return ruleErr
}

func get(tx *bbolt.Tx, scope ledger.Scope, key []byte) (*ledger.Record, error) {
	v := tx.Bucket(recordsBucket).Get(key)
	if v == nil {
		return nil, nil
	}
	rec, err := recordkv.Decode(scope, v)
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// put stores rec in place of cur and moves its entry in the expiry index.
func put(tx *bbolt.Tx, key []byte, cur, rec *ledger.Record) error {
	v, err := recordkv.Encode(rec)
	if err != nil {
		return err
	}
	expiry := tx.Bucket(expiryBucket)
	if cur != nil && !recordkv.SweepAt(cur).Equal(recordkv.SweepAt(rec)) {
		if err := expiry.Delete(recordkv.ExpiryKey(recordkv.SweepAt(cur), key)); err != nil {
			return err
		}
	}
	if err := expiry.Put(recordkv.ExpiryKey(recordkv.SweepAt(rec), key), nil); err != nil {
		return err
	}
	return tx.Bucket(recordsBucket).Put(key, v)
}

// waitFor runs f, and returns its error, or ctx's when ctx ends first: a
// commit that a stalled disk holds up answers at the call's bound (the
// transaction may still commit later, as a call cut off by a broken
// connection may have).
func waitFor(ctx context.Context, f func() error) error {
	if ctx.Done() == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Sweep works through up to limit records whose time came, oldest first: a
// completed record past its retention shrinks to a tombstone (its outcome
// dropped), a record past ForgetAt is deleted. It returns how many it
// handled. Reads already see such records as tombstones or absent; the
// sweep only frees the space.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, s.classify("sweep", err)
	}
	n := 0
	err := s.db.Update(func(tx *bbolt.Tx) error {
		n = 0
		now := s.cfg.Now()
		records := tx.Bucket(recordsBucket)
		c := tx.Bucket(expiryBucket).Cursor()
		for k, _ := c.First(); k != nil && n < limit; k, _ = c.First() {
			if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) > uint64(now.UnixNano()) {
				break
			}
			key := append([]byte(nil), k[8:]...)
			if err := c.Delete(); err != nil {
				return err
			}
			n++
			v := records.Get(key)
			if v == nil {
				continue
			}
			scope, err := recordkv.DecodeScopeKey(key)
			if err != nil {
				return err
			}
			rec, err := recordkv.Decode(scope, v)
			if err != nil {
				return err
			}
			if rec.Forgotten(now) {
				if err := records.Delete(key); err != nil {
					return err
				}
				continue
			}
			if rec.Shrinkable(now) {
				rec.State, rec.Outcome = ledger.StateExpired, nil
			}
			// Index it again at its next event, the record rewritten
			// without its outcome if it shrank.
			if err := put(tx, key, nil, &rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, s.classify("sweep", err)
	}
	return n, nil
}

// Run sweeps expired records in batches of Config.SweepBatch every
// Config.SweepInterval until ctx ends; a full batch is followed at once by
// another. It returns nil when ctx ends. A failed sweep is retried at the
// next interval; onError, when not nil, hears of it.
func (s *Store) Run(ctx context.Context, onError func(error)) error {
	return ledger.RunSweeps(ctx, s.cfg.SweepInterval, s.cfg.SweepBatch, s.Sweep, onError)
}

// classify turns what bbolt or the context said into a ledger error, as
// every store does: a call whose context ended is UPSTREAM_TIMEOUT
// (ledger.TimedOut), a closed database or a failed or full disk is
// UNAVAILABLE (ledger.Unavailable), a record that cannot be read is
// INTERNAL.
func (s *Store) classify(op string, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("bolt: %s: %w", op, err)
	switch {
	case errors.Is(err, recordkv.ErrCorrupt):
		return ledger.Wrap(ledger.CodeInternal, err, "the ledger could not read a record")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return ledger.TimedOut(err)
	default:
		return ledger.Unavailable(err)
	}
}
