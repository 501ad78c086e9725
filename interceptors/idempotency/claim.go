package idempotency

import (
	"context"

	"github.com/idemledger/idemledger/interceptors/guard"
)

// Claim is the handler's hold on its key: the ledger's fencing token and
// the attempt number. A handler that writes to its own database should
// store the token with the write and refuse a write whose token is lower
// than the one stored, so an attempt that lost its lease cannot overwrite
// the attempt that took over.
type Claim = guard.Claim

// ClaimFromContext returns the claim of the call whose handler ctx belongs
// to, and false outside a protected call.
func ClaimFromContext(ctx context.Context) (Claim, bool) { return guard.ClaimFromContext(ctx) }
