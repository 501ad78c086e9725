package memory

import (
	"cmp"
	"context"
	"slices"

	"github.com/idemledger/idemledger/ledger"
)

// scopeOrder orders scopes by tenant, then key.
func scopeOrder(a, b ledger.Scope) int {
	return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Key, b.Key))
}

// List implements ledger.Store, in order of tenant and key.
func (s *Store) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	if err := ctx.Err(); err != nil {
		return ledger.ListPage{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var scopes []ledger.Scope
	for sc := range s.records {
		if sc.Namespace == p.Namespace && (p.Tenant == "" || sc.Tenant == p.Tenant) &&
			(p.After == (ledger.Scope{}) || scopeOrder(sc, p.After) > 0) {
			scopes = append(scopes, sc)
		}
	}
	slices.SortFunc(scopes, scopeOrder)
	l := ledger.NewLister(p, s.now())
	for _, sc := range scopes {
		if l.Full() {
			break
		}
		l.Add(s.records[sc])
	}
	for i, rec := range l.Page.Records {
		l.Page.Records[i] = copyOf(rec)
	}
	return l.Page, nil
}

// Purge implements ledger.Store.
func (s *Store) Purge(ctx context.Context, p ledger.PurgeParams) (ledger.PurgeResult, error) {
	if err := ctx.Err(); err != nil {
		return ledger.PurgeResult{}, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var res ledger.PurgeResult
	purge := func(sc ledger.Scope, rec *ledger.Record) {
		if !rec.Purgeable(now) {
			res.Skipped++
			return
		}
		if rec.View(now) != ledger.StateAbsent {
			res.Purged++
		}
		delete(s.records, sc)
	}
	if p.Scope.Key != "" {
		if rec, ok := s.records[p.Scope]; ok {
			purge(p.Scope, rec)
		}
		return res, nil
	}
	var scopes []ledger.Scope
	for sc := range s.records {
		if sc.Namespace == p.Scope.Namespace && sc.Tenant == p.Scope.Tenant {
			scopes = append(scopes, sc)
		}
	}
	slices.SortFunc(scopes, scopeOrder)
	for _, sc := range scopes {
		rec := s.records[sc]
		if res.Purged >= p.Limit && rec.Purgeable(now) {
			res.More = true // past the limit: only counting what is held
			continue
		}
		purge(sc, rec)
	}
	return res, nil
}

// CountByState implements ledger.Store.
func (s *Store) CountByState(ctx context.Context) (ledger.Census, error) {
	if err := ctx.Err(); err != nil {
		return nil, ledger.TimedOut(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	counts := ledger.Census{}
	for _, rec := range s.records {
		if v := rec.View(now); v != ledger.StateAbsent {
			counts.Add(rec.Scope.Namespace, v)
		}
	}
	return counts, nil
}
