// Package fencing is what the guard shares with the fence's drivers
// (module interceptors/fence): the fence table's interface, the record a
// fence belongs to, and a fenced run's part in its fence, which the run's
// context carries from the guard to the driver's Write.
package fencing

import (
	"context"
	"sync"
	"time"
)

// Scope is the record a fence belongs to.
type Scope struct {
	Namespace, Tenant, Key, Method string
	// CreatedAt names the record among the key's lives: takeovers keep
	// it; a key claimed again after its record ended starts a new record
	// with a later one.
	CreatedAt time.Time
	// ExpiresAt is the end of the record's retention, or of the claim's
	// lease when that is later: the fence is kept at least as long.
	ExpiresAt time.Time
}

// Row is a key's fence as Table.Reserve reads it.
type Row struct {
	// RecordCreatedAt names the record the fence belongs to (Scope's
	// CreatedAt, to the microsecond).
	RecordCreatedAt time.Time
	// Token is the attempt that holds the fence, or that committed it.
	Token uint64
	// Outcome is the committed outcome (an idemledger.v1.Outcome's
	// encoding); nil while no transaction has committed the fence.
	Outcome []byte
}

// Table is the fence table in the write service's database
// (guard.Policy.Fence): package fence's for database/sql, fencepgx's for
// pgx. The guard calls it outside the run's transaction; the run writes
// the fence itself, in its transaction (the drivers' Write).
type Table interface {
	// Reserve makes token the one attempt of the record that may commit
	// the key's fence, unless an attempt already committed it or a later
	// one holds it: it records token when the fence is the record's,
	// uncommitted and held by a lower token, or belongs to an earlier
	// record of the key, or there is none. It returns the fence as it
	// stands after.
	Reserve(ctx context.Context, s Scope, token uint64) (Row, error)
}

// Run is a fenced run's part in its fence. It is safe for concurrent use.
type Run struct {
	Scope Scope
	Token uint64
	// Encode turns the result a handler hands its fence into the outcome
	// the fence row holds, as the guard would store it.
	Encode func(result any) ([]byte, error)
	// ExpiresAt is how long the fence must be kept, asked when it is
	// written (a lease extended meanwhile moves it on).
	ExpiresAt func() time.Time

	mu        sync.Mutex
	written   []byte
	attempted bool
}

type key struct{}

// NewContext returns ctx carrying r.
func NewContext(ctx context.Context, r *Run) context.Context {
	return context.WithValue(ctx, key{}, r)
}

// FromContext returns the fenced run ctx belongs to; false outside one
// (a method without a fence, a call without a key).
func FromContext(ctx context.Context) (*Run, bool) {
	r, ok := ctx.Value(key{}).(*Run)
	return r, ok
}

// Wrote records that the run's transaction wrote its fence with outcome,
// not yet committed.
func (r *Run) Wrote(outcome []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempted, r.written = true, outcome
}

// Fenced records that the fence refused the run's transaction: another
// attempt holds it or committed it.
func (r *Run) Fenced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempted, r.written = true, nil
}

// State is what the run did with its fence: whether it wrote or was
// refused one, and the outcome of the last one written (nil if refused).
func (r *Run) State() (attempted bool, written []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.attempted, r.written
}
