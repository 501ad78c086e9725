package ledger

import (
	"errors"
	"time"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// StoreRetryAfter is the retry-after of the UNAVAILABLE a store answers
// when it cannot answer.
const StoreRetryAfter = time.Second

// Unavailable is what every store answers when it cannot answer (its disk
// or database failed, is full, or is unreachable): UNAVAILABLE, retryable
// after StoreRetryAfter, with err as the cause, and the metadata
// cause=store, which tells a guard the ledger itself answered. Stores
// use it so that the same kind of failure gets the same answer whatever
// the store.
func Unavailable(err error) *errcode.Error {
	return &errcode.Error{Code: errcode.Unavailable, Message: "the ledger's store is unavailable", RetryAfter: StoreRetryAfter, Err: err,
		Metadata: map[string]string{errcode.MetaCause: errcode.CauseStore}}
}

// ErrMustRestart is in the chain of an error of a store that failed in a
// way it cannot mend while the process runs (the embedded store after a
// failed write of its log): every call is refused until the process
// restarts and opens the store again. ledgerd reports it on /healthz, so
// that its supervisor restarts it.
var ErrMustRestart = errors.New("ledger: the store must be reopened: restart the process")

// TimedOut is what every store answers when a call's context ended, or a
// bound on the call ran out, before the store answered: UPSTREAM_TIMEOUT,
// retryable with the same key, with err as the cause.
func TimedOut(err error) *errcode.Error {
	return errcode.Wrap(errcode.UpstreamTimeout, err, "the ledger's store did not answer in time")
}
