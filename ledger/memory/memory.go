// Package memory provides an in-process ledger.Store, for tests and for a
// single process that can afford to forget everything when it stops.
package memory

import (
	"context"
	"sync"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Config configures a Store. The zero value works.
type Config struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// SweepInterval is the pause of Run between sweeps: 1 min.
	SweepInterval time.Duration
	// SweepBatch is how many expired records one sweep deletes: 500.
	SweepBatch int
}

// Store is an in-process ledger.Store. It is safe for concurrent use: one
// mutex serialises every transition, which makes each call atomic. A call
// whose context has ended is UPSTREAM_TIMEOUT, as in every store.
type Store struct {
	cfg     Config
	now     func() time.Time
	mu      sync.Mutex
	records map[ledger.Scope]*ledger.Record
}

var _ ledger.Store = (*Store)(nil)

// New returns an empty Store.
func New(cfg Config) *Store {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Minute
	}
	if cfg.SweepBatch <= 0 {
		cfg.SweepBatch = 500
	}
	return &Store{cfg: cfg, now: cfg.Now, records: make(map[ledger.Scope]*ledger.Record)}
}

// Claim implements ledger.Store.
func (s *Store) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return ledger.ClaimResult{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	next, claimed := ledger.NextClaim(s.records[p.Scope], p, now)
	if claimed {
		s.put(next)
	}
	return ledger.ClaimResult{Record: copyOf(next), Claimed: claimed, Now: now}, nil
}

// Complete implements ledger.Store.
func (s *Store) Complete(ctx context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Record{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextComplete(s.records[p.Scope], p, s.now())
	if err != nil {
		return ledger.Record{}, err
	}
	s.put(next)
	return copyOf(next), nil
}

// Release implements ledger.Store.
func (s *Store) Release(ctx context.Context, p ledger.ReleaseParams) error {
	if err := ctx.Err(); err != nil {
		return ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextRelease(s.records[p.Scope], p, s.now())
	if err != nil {
		return err
	}
	s.put(next)
	return nil
}

// Extend implements ledger.Store.
func (s *Store) Extend(ctx context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Record{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextExtend(s.records[p.Scope], p, s.now())
	if err != nil {
		return ledger.Record{}, err
	}
	s.put(next)
	return copyOf(next), nil
}

// Resolve implements ledger.Store.
func (s *Store) Resolve(ctx context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Record{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	next, err := ledger.NextResolve(s.records[p.Scope], p, now)
	if err != nil {
		return ledger.Record{}, err
	}
	s.put(next)
	rec, _ := next.AsOf(now)
	return copyOf(rec), nil
}

// Get implements ledger.Store.
func (s *Store) Get(ctx context.Context, scope ledger.Scope) (ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return ledger.Record{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.records[scope].AsOf(s.now())
	if !ok {
		return ledger.Record{}, errcode.Errorf(errcode.NotFound, "no record for this key")
	}
	return copyOf(rec), nil
}

// GetMany implements ledger.Store: the live record of each scope, a
// zero Record where there is none.
func (s *Store) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	recs := make([]ledger.Record, len(scopes))
	for i, sc := range scopes {
		if rec, ok := s.records[sc].AsOf(now); ok {
			recs[i] = copyOf(rec)
		}
	}
	return recs, nil
}

// Sweep shrinks up to limit completed records past their retention to
// tombstones (their outcomes dropped) and deletes records past ForgetAt,
// and returns how many it changed.
func (s *Store) Sweep(_ context.Context, limit int) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now, n := s.now(), 0
	for scope, rec := range s.records {
		if n >= limit {
			break
		}
		switch {
		case rec.Forgotten(now):
			delete(s.records, scope)
			n++
		case rec.Shrinkable(now):
			rec.State, rec.Outcome = ledger.StateExpired, nil
			n++
		}
	}
	return n, nil
}

// Run sweeps expired records in batches of Config.SweepBatch every
// Config.SweepInterval until ctx ends, and returns nil then.
func (s *Store) Run(ctx context.Context, onError func(error)) error {
	return ledger.Sweeps{Interval: s.cfg.SweepInterval, Batch: s.cfg.SweepBatch, Sweep: s.Sweep, OnError: onError}.Run(ctx)
}

// Len returns how many records the store holds, expired ones included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// put stores a copy of rec, so callers never share memory with the store.
func (s *Store) put(rec ledger.Record) {
	c := copyOf(rec)
	s.records[rec.Scope] = &c
}

func copyOf(rec ledger.Record) ledger.Record {
	rec.Outcome = rec.Outcome.Clone()
	return rec
}
