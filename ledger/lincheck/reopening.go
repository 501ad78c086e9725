package lincheck

import (
	"context"
	"sync/atomic"

	"github.com/idemledger/idemledger/ledger"
)

// Closer is a store that can be closed, as the embedded stores are.
type Closer interface {
	ledger.Store
	Close() error
}

// Reopening is a store that a fault closes and opens again while a
// history runs (Config.Fault calls Reopen): calls that meet the closed
// store fail (UNAVAILABLE), and what was committed must still be there.
type Reopening struct {
	open     func() (Closer, error)
	cur      atomic.Pointer[Closer]
	restarts atomic.Int64
}

var _ ledger.Store = (*Reopening)(nil)

// NewReopening opens a store with open, and reopens it with open on each
// Reopen.
func NewReopening(open func() (Closer, error)) (*Reopening, error) {
	r := &Reopening{open: open}
	s, err := open()
	if err != nil {
		return nil, err
	}
	r.cur.Store(&s)
	return r, nil
}

// Reopen closes the store and opens it again.
func (r *Reopening) Reopen() error {
	_ = (*r.cur.Load()).Close()
	s, err := r.open()
	if err != nil {
		return err
	}
	r.cur.Store(&s)
	r.restarts.Add(1)
	return nil
}

// Restarts is how many times Reopen opened the store again.
func (r *Reopening) Restarts() int64 { return r.restarts.Load() }

// Close closes the store.
func (r *Reopening) Close() error { return (*r.cur.Load()).Close() }

func (r *Reopening) store() ledger.Store { return *r.cur.Load() }

// Claim implements ledger.Store on the store open now.
func (r *Reopening) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	return r.store().Claim(ctx, p)
}

// Complete implements ledger.Store on the store open now.
func (r *Reopening) Complete(ctx context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	return r.store().Complete(ctx, p)
}

// Release implements ledger.Store on the store open now.
func (r *Reopening) Release(ctx context.Context, p ledger.ReleaseParams) error {
	return r.store().Release(ctx, p)
}

// Extend implements ledger.Store on the store open now.
func (r *Reopening) Extend(ctx context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	return r.store().Extend(ctx, p)
}

// Resolve implements ledger.Store on the store open now.
func (r *Reopening) Resolve(ctx context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	return r.store().Resolve(ctx, p)
}

// Get implements ledger.Store on the store open now.
func (r *Reopening) Get(ctx context.Context, sc ledger.Scope) (ledger.Record, error) {
	return r.store().Get(ctx, sc)
}

// GetMany implements ledger.Store on the store open now.
func (r *Reopening) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	return r.store().GetMany(ctx, scopes)
}

// List implements ledger.Store on the store open now.
func (r *Reopening) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	return r.store().List(ctx, p)
}

// Purge implements ledger.Store on the store open now.
func (r *Reopening) Purge(ctx context.Context, p ledger.PurgeParams) (ledger.PurgeResult, error) {
	return r.store().Purge(ctx, p)
}

// CountByState implements ledger.Store on the store open now.
func (r *Reopening) CountByState(ctx context.Context) (ledger.Census, error) {
	return r.store().CountByState(ctx)
}
