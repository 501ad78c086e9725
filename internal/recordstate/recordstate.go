// Package recordstate is the one vocabulary of a record's states that
// idemctl, the console, ledgerd's metrics and the docs use:
//
//	in_progress      an attempt holds a lease on the key
//	lease_expired    an attempt's lease ran out and nobody completed it:
//	                 the next Begin takes it over (TAKEOVER)
//	outcome_unknown  the lease ran out under HOLD: settle it with Resolve
//	completed        the outcome is stored and replayed
//	expired          a tombstone: the call ran, its outcome is past its retention
//
// lease_expired is not a stored state: it is an in_progress record read
// after its lease ended.
package recordstate

import (
	"time"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// The names.
const (
	InProgress     = "in_progress"
	LeaseExpired   = "lease_expired"
	OutcomeUnknown = "outcome_unknown"
	Completed      = "completed"
	Expired        = "expired"
)

// Names are the states in the order a person acts on them.
var Names = []string{OutcomeUnknown, LeaseExpired, InProgress, Completed, Expired}

// Stored is the name of a stored state (the census counts by it).
func Stored(s ledgerv1.State) string {
	switch s {
	case ledgerv1.State_STATE_IN_PROGRESS:
		return InProgress
	case ledgerv1.State_STATE_OUTCOME_UNKNOWN:
		return OutcomeUnknown
	case ledgerv1.State_STATE_COMPLETED:
		return Completed
	case ledgerv1.State_STATE_EXPIRED:
		return Expired
	}
	return "unspecified"
}

// Of is the name of rec's state read at now.
func Of(rec *ledgerv1.Record, now time.Time) string {
	if rec.GetState() == ledgerv1.State_STATE_IN_PROGRESS && rec.GetLeaseExpiresAt() != nil && !now.Before(rec.GetLeaseExpiresAt().AsTime()) {
		return LeaseExpired
	}
	return Stored(rec.GetState())
}

// Filter is what a search by name asks the ledger for: the stored state,
// and whether only records whose lease ended (lease_expired), or only
// those whose lease still runs (in_progress), are kept of it. ok is false
// for an unknown name; "" is every state.
func Filter(name string) (state ledgerv1.State, keep func(rec *ledgerv1.Record, now time.Time) bool, ok bool) {
	all := func(*ledgerv1.Record, time.Time) bool { return true }
	switch name {
	case "":
		return ledgerv1.State_STATE_UNSPECIFIED, all, true
	case InProgress, LeaseExpired:
		return ledgerv1.State_STATE_IN_PROGRESS, func(rec *ledgerv1.Record, now time.Time) bool { return Of(rec, now) == name }, true
	case OutcomeUnknown:
		return ledgerv1.State_STATE_OUTCOME_UNKNOWN, all, true
	case Completed:
		return ledgerv1.State_STATE_COMPLETED, all, true
	case Expired:
		return ledgerv1.State_STATE_EXPIRED, all, true
	}
	return ledgerv1.State_STATE_UNSPECIFIED, nil, false
}
