package ledger

import (
	"context"
	"time"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// Store keeps records. Every method is atomic: under any concurrency, and
// across any number of processes sharing the store, each call sees and
// leaves a consistent record. Stores own their clock (a SQL store uses the
// database's), and the rules of each transition are those of the Next*
// functions below, which in-process stores call directly.
//
// Errors are *errcode.Error values: LEASE_LOST and NOT_FOUND for the rules, and
// UNAVAILABLE or CONTENTION (retryable) for a store that could not answer.
type Store interface {
	// Claim claims the scope, takes over an expired lease, or returns the
	// live record unchanged (see NextClaim).
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)
	// Complete stores the outcome of the attempt that holds p.Token (see
	// NextComplete) and returns the record after the call.
	Complete(ctx context.Context, p CompleteParams) (Record, error)
	// Release turns the record of the attempt that holds p.Token into a
	// tombstone that reads as absent (see NextRelease).
	Release(ctx context.Context, p ReleaseParams) error
	// Extend renews the lease of the attempt that holds p.Token (see
	// NextExtend) and returns the record after the call.
	Extend(ctx context.Context, p ExtendParams) (Record, error)
	// Resolve settles a record whose outcome nobody knows (see
	// NextResolve) and returns the record after the call.
	Resolve(ctx context.Context, p ResolveParams) (Record, error)
	// Get returns the record of the scope as of now (Record.AsOf), or
	// NOT_FOUND.
	Get(ctx context.Context, s Scope) (Record, error)
	// GetMany returns the live record of each scope, in order, and a zero
	// Record (StateAbsent) for a scope without one, in one read: the
	// Lookup waiters' shared poller uses it, so that the store's read
	// rate does not grow with the number of waiters.
	GetMany(ctx context.Context, scopes []Scope) ([]Record, error)

	// List returns the stored rows of p's namespace (and tenant, when
	// set) after p.After, in order of tenant and key, at most p.Limit of
	// them, each as it reads at the store's clock (Record.AsOf; rows that
	// read as absent are left out but counted in Scanned). It reads at
	// most p.Limit rows. AdminService lists through it.
	List(ctx context.Context, p ListParams) (ListPage, error)
	// Purge erases the records p names (one key, or up to p.Limit records
	// of a tenant), except those that read as in progress or unknown: an
	// attempt may still complete them.
	Purge(ctx context.Context, p PurgeParams) (PurgeResult, error)
	// CountByState counts the live records by namespace and by the state
	// they read in now: the operators' records-by-state gauge and the
	// console's census. It reads every record.
	CountByState(ctx context.Context) (Census, error)
}

// Census is Store.CountByState's count: records by namespace, then by
// state.
type Census map[string]map[State]int

// Add counts one record of namespace ns in state st.
func (c Census) Add(ns string, st State) {
	m := c[ns]
	if m == nil {
		m = map[State]int{}
		c[ns] = m
	}
	m[st]++
}

// ByState is the census summed over the namespaces.
func (c Census) ByState() map[State]int {
	out := map[State]int{}
	for _, m := range c {
		for st, n := range m {
			out[st] += n
		}
	}
	return out
}

// ClaimParams are the inputs of Store.Claim, validated and with defaults
// applied by Ledger.
type ClaimParams struct {
	Scope          Scope
	Fingerprint    string
	Method         string
	Lease          time.Duration
	Retention      time.Duration
	FirstAttemptAt time.Time // zero when the client did not say
	OnLeaseExpiry  LeaseExpiry
	// TombstoneRetention is how long a completed record stays a tombstone
	// after Retention; 0 keeps none.
	TombstoneRetention time.Duration
	// KeySource says where the caller found the key, kept by a new record.
	KeySource string
}

// ClaimResult is the answer of Store.Claim.
type ClaimResult struct {
	Record  Record    // the record after the call; zero when absent
	Claimed bool      // the caller holds Record.Token and must run the write
	Now     time.Time // the store's clock when it decided
}

// CompleteParams are the inputs of Store.Complete.
type CompleteParams struct {
	Scope   Scope
	Token   uint64
	Outcome *Outcome
}

// ReleaseParams are the inputs of Store.Release.
type ReleaseParams struct {
	Scope Scope
	Token uint64
}

// ExtendParams are the inputs of Store.Extend.
type ExtendParams struct {
	Scope Scope
	Token uint64
	Lease time.Duration
}

// ResolveParams are the inputs of Store.Resolve: Outcome is the write's
// outcome when it happened (applied), nil when it did not.
type ResolveParams struct {
	Scope   Scope
	Outcome *Outcome
}

// NextClaim is the rule of Claim. cur is the stored row or nil. It returns
// the row to store and whether the caller claimed it:
//   - no record (absent, released, past its retention, forgotten): a new
//     IN_PROGRESS record with attempt 1 and a token above any stored one,
//     unless FirstAttemptAt is older than the retention and tombstone
//     windows together, in which case nothing changes and the result is
//     the zero (absent) record;
//   - IN_PROGRESS of the TAKEOVER policy, lease expired, same fingerprint:
//     a takeover, token and attempt plus one;
//   - anything else (a live lease, OUTCOME_UNKNOWN, completed, a tombstone,
//     another fingerprint): the record unchanged, not claimed.
func NextClaim(cur *Record, p ClaimParams, now time.Time) (Record, bool) {
	switch cur.View(now) {
	case StateAbsent:
		if !p.FirstAttemptAt.IsZero() && p.FirstAttemptAt.Before(now.Add(-p.Retention-p.TombstoneRetention)) {
			return Record{}, false
		}
		var token uint64 = 1
		if cur != nil {
			token = cur.Token + 1
		}
		lease := now.Add(p.Lease)
		expires := later(now.Add(p.Retention), lease)
		return Record{
			Scope:          p.Scope,
			State:          StateInProgress,
			Method:         p.Method,
			Fingerprint:    p.Fingerprint,
			Token:          token,
			Attempt:        1,
			CreatedAt:      now,
			LeaseExpiresAt: lease,
			ExpiresAt:      expires,
			ForgetAt:       expires.Add(p.TombstoneRetention),
			OnLeaseExpiry:  p.OnLeaseExpiry,
			KeySource:      p.KeySource,
		}, true
	case StateInProgress:
		if !now.Before(cur.LeaseExpiresAt) && cur.Fingerprint == p.Fingerprint {
			next := *cur
			next.Token++
			next.Attempt++
			next.extendTo(now.Add(p.Lease))
			return next, true
		}
	}
	return *cur, false
}

// extendTo gives the record a lease until lease, and keeps it (and its
// tombstone window) at least as long.
func (r *Record) extendTo(lease time.Time) {
	r.LeaseExpiresAt = lease
	if lease.After(r.ExpiresAt) {
		r.ForgetAt = r.ForgetAt.Add(lease.Sub(r.ExpiresAt))
		r.ExpiresAt = lease
	}
}

// NextComplete is the rule of Complete. Only the holder of the current token
// may complete, also after its lease ran out as long as nobody took over
// (an OUTCOME_UNKNOWN record included). The same Complete repeated
// succeeds; another outcome for a completed record, a stale token or a
// record that is neither in progress nor completed is LEASE_LOST.
// ExpiresAt does not change. The record's outcome is p.Outcome itself: a
// store that keeps records in memory copies them (the memory store's put
// does); one that encodes them has no use for a copy.
func NextComplete(cur *Record, p CompleteParams, now time.Time) (Record, error) {
	if cur == nil || cur.Token != p.Token {
		return Record{}, leaseLost(p.Token)
	}
	switch cur.View(now) {
	case StateCompleted:
		if cur.Outcome.Equal(p.Outcome) {
			return *cur, nil
		}
		return Record{}, errcode.Errorf(errcode.LeaseLost, "the record is already completed with another outcome")
	case StateInProgress, StateUnknown:
		next := *cur
		next.State = StateCompleted
		next.CompletedAt = now
		next.Outcome = p.Outcome
		return next, nil
	}
	return Record{}, leaseLost(p.Token)
}

// NextRelease is the rule of Release: the holder of the current token of a
// record in progress (or OUTCOME_UNKNOWN) turns it into a tombstone that
// reads as absent. Releasing again with the same token succeeds; anything
// else is LEASE_LOST.
func NextRelease(cur *Record, p ReleaseParams, now time.Time) (Record, error) {
	if cur != nil && cur.State == StateReleased && cur.Token == p.Token && now.Before(cur.ExpiresAt) {
		return *cur, nil
	}
	if v := cur.View(now); cur == nil || cur.Token != p.Token || (v != StateInProgress && v != StateUnknown) {
		return Record{}, leaseLost(p.Token)
	}
	next := *cur
	next.State = StateReleased
	return next, nil
}

// NextExtend is the rule of Extend: the holder of the current token of a
// record in progress (or OUTCOME_UNKNOWN: its holder is back) gets a lease
// of p.Lease from now; the record is kept at least as long as the lease.
// Anything else is LEASE_LOST.
func NextExtend(cur *Record, p ExtendParams, now time.Time) (Record, error) {
	if v := cur.View(now); cur == nil || cur.Token != p.Token || (v != StateInProgress && v != StateUnknown) {
		return Record{}, leaseLost(p.Token)
	}
	next := *cur
	next.extendTo(now.Add(p.Lease))
	return next, nil
}

// NextResolve is the rule of Resolve. It settles an OUTCOME_UNKNOWN record,
// or an IN_PROGRESS record whose lease ran out: with an outcome (applied)
// the record is completed with it; without (not applied) it becomes a
// released tombstone that reads as absent, so the next Begin claims it
// afresh with a higher token. A live lease is IN_PROGRESS; a completed
// record or a tombstone is VALIDATION_FAILED (its outcome is known); no
// record is NOT_FOUND. As with NextComplete, the outcome is p.Outcome
// itself.
func NextResolve(cur *Record, p ResolveParams, now time.Time) (Record, error) {
	switch cur.View(now) {
	case StateAbsent:
		return Record{}, errcode.Errorf(errcode.NotFound, "no record for this key")
	case StateCompleted, StateExpired:
		return Record{}, errcode.Errorf(errcode.ValidationFailed, "the record is completed: its outcome is known, there is nothing to resolve")
	case StateInProgress:
		if now.Before(cur.LeaseExpiresAt) {
			return Record{}, &errcode.Error{Code: errcode.InProgress, Message: "an attempt holds a live lease on the key; resolve it once the lease has run out",
				RetryAfter: max(cur.LeaseExpiresAt.Sub(now), minRetryAfter)}
		}
	}
	next := *cur
	if p.Outcome == nil {
		next.State = StateReleased
		return next, nil
	}
	next.State = StateCompleted
	next.CompletedAt = now
	next.Outcome = p.Outcome
	return next, nil
}

func leaseLost(token uint64) *errcode.Error {
	return errcode.Errorf(errcode.LeaseLost, "token %d does not hold the key", token)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Sweeps is how a store sweeps its expired records: Sweep(ctx, Batch)
// deletes up to a batch and says how many it handled. Stores build their
// Run methods on it.
type Sweeps struct {
	Interval time.Duration
	Batch    int
	// Share is the most of the time the sweeps take while a backlog
	// lasts (0.25: each full batch is followed by a rest three times as
	// long as it took); 0 or 1 and above sweep without resting.
	Share   float64
	Sweep   func(ctx context.Context, limit int) (int, error)
	OnError func(error) // hears of a failed sweep, when not nil
}

// Run sweeps the backlog every Interval until ctx ends, and returns nil
// then. A failed sweep is tried again at the next interval.
func (w Sweeps) Run(ctx context.Context) error {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		w.Backlog(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Backlog calls Sweep until it handles less than a full batch, fails,
// or ctx ends, resting after each full batch as Share says, and returns
// how many records it handled.
func (w Sweeps) Backlog(ctx context.Context) int {
	total := 0
	for ctx.Err() == nil {
		start := time.Now()
		n, err := w.Sweep(ctx, w.Batch)
		total += n
		if err != nil && ctx.Err() == nil && w.OnError != nil {
			w.OnError(err)
		}
		if err != nil || n < w.Batch {
			break
		}
		if w.Share > 0 && w.Share < 1 {
			rest := time.Duration(float64(time.Since(start)) * (1/w.Share - 1))
			select {
			case <-ctx.Done():
			case <-time.After(rest):
			}
		}
	}
	return total
}
