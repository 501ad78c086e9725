package errcode

// The keys of Error.Metadata that change what a caller does, and their
// values. The rest of the metadata (a method, a limit, a size) only
// informs.
const (
	// MetaCause says where an UNAVAILABLE comes from: CauseStore (the
	// ledger answered; its store is down) or CauseShutdown (the instance
	// is shutting down: retry on another). Absent: the ledger was not
	// reached.
	MetaCause = "cause"
	// MetaApplied, "true", says that the write ran although the call
	// failed (its answer could not be kept or sent): sent again, it would
	// run again.
	MetaApplied = "applied"

	CauseStore    = "store"
	CauseShutdown = "shutdown"
)

// Applied reports whether e says its write ran although the call failed
// (MetaApplied).
func (e *Error) Applied() bool { return e != nil && e.Metadata[MetaApplied] == "true" }

// Cause is e's MetaCause: CauseStore, CauseShutdown, or "".
func (e *Error) Cause() string {
	if e == nil {
		return ""
	}
	return e.Metadata[MetaCause]
}
