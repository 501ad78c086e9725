package lincheck_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/lincheck"
	"github.com/idemledger/idemledger/ledger/memory"
)

func TestMemoryIsLinearizable(t *testing.T) {
	for run := range 20 {
		t.Run(fmt.Sprint("history", run), func(t *testing.T) {
			lincheck.Run(t, func(now func() time.Time) ledger.Store { return memory.New(memory.Config{Now: now}) }, lincheck.Config{})
		})
	}
}

// TestCheckThenInsertIsCaught: a store whose Claim reads, yields, then
// writes what it decided from the stale read is not linearizable, and the
// checker says so.
func TestCheckThenInsertIsCaught(t *testing.T) {
	caught := 0
	for seed := uint64(1); seed <= 5; seed++ {
		res, _, _, _ := lincheck.Check(t, func(now func() time.Time) ledger.Store {
			return &checkThenInsert{now: now, recs: map[ledger.Scope]ledger.Record{}}
		}, lincheck.Config{Seed: seed, Keys: 1, Workers: 8})
		if res == porcupine.Illegal {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("the checker passed a check-then-insert store on every seed")
	}
	t.Logf("caught on %d of 5 seeds", caught)
}

type checkThenInsert struct {
	now  func() time.Time
	mu   sync.Mutex
	recs map[ledger.Scope]ledger.Record
}

func (s *checkThenInsert) get(sc ledger.Scope) *ledger.Record {
	if r, ok := s.recs[sc]; ok {
		return &r
	}
	return nil
}

func (s *checkThenInsert) Claim(_ context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	s.mu.Lock()
	cur := s.get(p.Scope)
	s.mu.Unlock()
	time.Sleep(50 * time.Microsecond) // the window a real check-then-insert has
	now := s.now()
	next, claimed := ledger.NextClaim(cur, p, now)
	if claimed {
		s.mu.Lock()
		s.recs[p.Scope] = next
		s.mu.Unlock()
	}
	return ledger.ClaimResult{Record: next, Claimed: claimed, Now: now}, nil
}

func (s *checkThenInsert) Complete(_ context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextComplete(s.get(p.Scope), p, s.now())
	if err == nil {
		s.recs[p.Scope] = next
	}
	return next, err
}

func (s *checkThenInsert) Release(_ context.Context, p ledger.ReleaseParams) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextRelease(s.get(p.Scope), p, s.now())
	if err == nil {
		s.recs[p.Scope] = next
	}
	return err
}

func (s *checkThenInsert) Extend(_ context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextExtend(s.get(p.Scope), p, s.now())
	if err == nil {
		s.recs[p.Scope] = next
	}
	return next, err
}

func (s *checkThenInsert) Resolve(_ context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := ledger.NextResolve(s.get(p.Scope), p, s.now())
	if err == nil {
		s.recs[p.Scope] = next
	}
	return next, err
}

func (s *checkThenInsert) Get(_ context.Context, sc ledger.Scope) (ledger.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.get(sc).AsOf(s.now())
	if !ok {
		return ledger.Record{}, errcode.Errorf(errcode.NotFound, "no record")
	}
	return r, nil
}

func (s *checkThenInsert) GetMany(_ context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs := make([]ledger.Record, len(scopes))
	for i, sc := range scopes {
		recs[i], _ = s.get(sc).AsOf(s.now())
	}
	return recs, nil
}

// The histories make no admin calls: the broken store answers them
// INTERNAL.
func (s *checkThenInsert) List(context.Context, ledger.ListParams) (ledger.ListPage, error) {
	return ledger.ListPage{}, errcode.Errorf(errcode.Internal, "not offered")
}

func (s *checkThenInsert) Purge(context.Context, ledger.PurgeParams) (ledger.PurgeResult, error) {
	return ledger.PurgeResult{}, errcode.Errorf(errcode.Internal, "not offered")
}

func (s *checkThenInsert) CountByState(context.Context) (ledger.Census, error) {
	return nil, errcode.Errorf(errcode.Internal, "not offered")
}
