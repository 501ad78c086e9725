package guard

import (
	"fmt"
	"time"

	"github.com/idemledger/idemledger/internal/fencing"
)

// InProgress is what a duplicate gets while the first attempt runs.
type InProgress uint8

const (
	// Wait (the default, on every transport) holds the duplicate until the first attempt's outcome is
	// stored, and replays it, as a retry after completion would get it. If
	// the first attempt releases the key, the duplicate claims it and
	// runs. The wait is bounded by the caller's deadline and the policy's
	// MaxWait; past the bound, IN_PROGRESS.
	Wait InProgress = iota
	// Reject answers IN_PROGRESS at once, with a retry-after of the time
	// left on the lease, capped.
	Reject
)

func (p InProgress) String() string {
	switch p {
	case Wait:
		return "WAIT"
	case Reject:
		return "REJECT"
	}
	return fmt.Sprintf("InProgress(%d)", uint8(p))
}

// LeaseExpiry is what happens when an attempt's lease runs out with no
// outcome. It is sent with Begin and stored with the record at its first
// claim.
type LeaseExpiry uint8

const (
	// Takeover (the default): the next attempt runs, with a higher token.
	Takeover LeaseExpiry = iota
	// Hold turns the record OUTCOME_UNKNOWN, and nothing runs again until
	// someone resolves it.
	Hold
)

func (e LeaseExpiry) String() string {
	switch e {
	case Takeover:
		return "TAKEOVER"
	case Hold:
		return "HOLD"
	}
	return fmt.Sprintf("LeaseExpiry(%d)", uint8(e))
}

// Policy is how one method is protected.
type Policy struct {
	// Lease is how long an attempt holds the key before another may take
	// over; 0 means the ledger's default (30 s). The guard extends it
	// while the run goes past half of it.
	Lease time.Duration
	// RunTimeout bounds a run, which outlives its caller: a caller that
	// hangs up does not end it, its outcome is recorded, and the retry
	// gets the replay. A run still going at RunTimeout is ended, and its
	// outcome is unknown (the claim runs out; it is not released). 0
	// means one hour, the longest lease the ledger grants.
	RunTimeout time.Duration
	// Retention is how long the outcome is kept for replays; 0 means the
	// ledger's default (24 h).
	Retention time.Duration
	// TombstoneRetention is how long a completed record is kept as a
	// tombstone after Retention (a retry then gets KEY_EXPIRED, never a
	// second run); 0 means the ledger's default (7 days).
	TombstoneRetention time.Duration
	// NoTombstones turns tombstones off: past Retention, the record is
	// gone.
	NoTombstones bool
	// KeyOptional lets calls without a key through, unprotected; by
	// default they fail with KEY_MISSING.
	KeyOptional bool
	// OnInProgress is what a duplicate gets while the first attempt runs:
	// Wait (the zero value) or Reject.
	OnInProgress InProgress
	// MaxWait bounds a duplicate's wait under Wait; 0 means 10 s.
	MaxWait time.Duration
	// OnLeaseExpiry is what happens when an attempt's lease runs out with
	// no outcome: Takeover (the next attempt runs, with a higher
	// token) or Hold (the record turns OUTCOME_UNKNOWN until
	// someone resolves it). It is stored with the record at its first
	// claim.
	OnLeaseExpiry LeaseExpiry
	// Fence, when set, is the fence table in the database the method's
	// write lands in: fence.New(db) for database/sql, fencepgx.New(pool)
	// for pgx (module interceptors/fence). The run writes the fence in
	// its write's transaction, and no crash leaves a second effect or an
	// unknown outcome. A fenced method takes Takeover and no reconcile
	// function.
	Fence fencing.Table
}

// Check reports a policy that cannot be used.
func (p Policy) Check() error { return p.check() }

func (p Policy) check() error {
	switch {
	case p.Lease < 0, p.Retention < 0, p.TombstoneRetention < 0, p.MaxWait < 0, p.RunTimeout < 0:
		return fmt.Errorf("guard: negative lease, retention, wait or run timeout")
	case p.OnInProgress > Reject:
		return fmt.Errorf("guard: unknown in-progress policy %s", p.OnInProgress)
	case p.OnLeaseExpiry > Hold:
		return fmt.Errorf("guard: unknown lease-expiry policy %s", p.OnLeaseExpiry)
	case p.NoTombstones && p.TombstoneRetention > 0:
		return fmt.Errorf("guard: a tombstone retention with tombstones off")
	case p.Fence != nil && p.OnLeaseExpiry == Hold:
		return fmt.Errorf("guard: a fenced method needs no HOLD: its fence makes a takeover exact")
	}
	return nil
}

// defaultRunTimeout bounds a run whose policy sets none: the longest
// lease the ledger grants, so that no run is unbounded.
const defaultRunTimeout = time.Hour

func (p Policy) runTimeout() time.Duration {
	if p.RunTimeout <= 0 {
		return defaultRunTimeout
	}
	return p.RunTimeout
}

func (p Policy) maxWait() time.Duration {
	if p.MaxWait <= 0 {
		return defaultMaxWait
	}
	return p.MaxWait
}
