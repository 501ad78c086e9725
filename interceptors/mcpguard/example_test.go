package mcpguard_test

import (
	"fmt"
	"time"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// The line a model reads in the error result of each code (docs/mcp.md
// shows the same).
func ExampleAdvice() {
	for _, le := range []*errcode.Error{
		{Code: errcode.InProgress, RetryAfter: 2 * time.Second},
		{Code: errcode.Unavailable, Message: "the idempotency ledger cannot be reached", RetryAfter: time.Second},
		{Code: errcode.Unavailable, Message: "the idempotency ledger is up, but its store is unavailable", RetryAfter: time.Second},
		{Code: errcode.RateLimited, RetryAfter: 1500 * time.Millisecond},
		{Code: errcode.KeyReused},
		{Code: errcode.KeyMissing},
		{Code: errcode.KeyInvalid},
		{Code: errcode.OutcomeUnknown},
		{Code: errcode.KeyExpired},
		{Code: errcode.RetryTooLate},
		{Code: errcode.ValidationFailed, Message: "the arguments are not JSON"},
		{Code: errcode.UpstreamTimeout, Message: "the call ended before the ledger answered"},
		{Code: errcode.Internal, Message: "internal error"},
	} {
		fmt.Printf("%s: %s\n", le.Code, mcpguard.Advice(le))
	}
	// Output:
	// IN_PROGRESS: another attempt of this call is still running: retry with the same key after 2s
	// UNAVAILABLE: the idempotency ledger cannot be reached: retry with the same key after 1s
	// UNAVAILABLE: the idempotency ledger is up, but its store is unavailable: retry with the same key after 1s
	// RATE_LIMITED: too many calls: retry with the same key after 1.5s
	// KEY_REUSED: this idempotency key was used for a different request: do not retry with it; a new intent needs a new key
	// KEY_MISSING: this tool needs an idempotency key: mint one per intent, send it as _meta["io.idemledger/idempotency-key"] (or the tool's key argument), and reuse it on every retry
	// KEY_INVALID: the idempotency key is not 1 to 255 printable ASCII characters: mint a valid one for this intent
	// OUTCOME_UNKNOWN: an earlier attempt of this call may have done it, and nobody knows: it will not run again until an operator resolves it; do not retry
	// KEY_EXPIRED: this call already ran, and its answer is no longer kept: do not retry it
	// RETRY_TOO_LATE: this intent is too old to retry safely: do not retry it; check whether it happened
	// VALIDATION_FAILED: the call cannot be guarded (the arguments are not JSON): fix the call, then send it with the same key
	// UPSTREAM_TIMEOUT: the call ended before the ledger answered: retry with the same key after 100ms
	// INTERNAL: internal error: do not retry with this key
}
