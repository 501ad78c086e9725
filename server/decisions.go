package server

// Decision is what the ledger decided for a call. Config.Observe hears each
// one; ledgerd counts them as idemledger_decisions_total.
type Decision string

// The decisions, named as in the contract's flow.
const (
	DecisionClaimed     Decision = "claimed"         // Begin: a fresh claim, attempt 1
	DecisionTakenOver   Decision = "taken_over"      // Begin: a claim over an expired lease
	DecisionReplayed    Decision = "replayed"        // Begin: the stored outcome came back
	DecisionInProgress  Decision = "in_progress"     // Begin: another attempt holds the lease
	DecisionKeyReused   Decision = "key_reused"      // Begin: the key came with another payload
	DecisionTooLate     Decision = "too_late"        // Begin: the first attempt is older than retention
	DecisionCompleted   Decision = "completed"       // Complete stored the outcome
	DecisionReleased    Decision = "released"        // Release turned the claim into a tombstone
	DecisionExtended    Decision = "extended"        // Extend renewed the lease
	DecisionLeaseLost   Decision = "lease_lost"      // Complete, Release or Extend without the current token
	DecisionRateLimited Decision = "rate_limited"    // the namespace was over its rate limit
	DecisionUnknown     Decision = "outcome_unknown" // Begin: a HOLD lease ran out, the outcome is unknown
	DecisionExpired     Decision = "key_expired"     // Begin: only a tombstone is left
	DecisionResolved    Decision = "resolved"        // Resolve settled a record
)
