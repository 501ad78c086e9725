package idempotency

import (
	"context"
	"time"
)

// Claim is the handler's hold on its key: the ledger's fencing token and
// the attempt number. A handler that writes to its own database should
// store the token with the write and refuse a write whose token is lower
// than the one stored, so an attempt that lost its lease cannot overwrite
// the attempt that took over.
type Claim struct {
	Tenant         string
	Key            string
	Token          uint64
	Attempt        uint32 // 1 for the first attempt, more after takeovers
	LeaseExpiresAt time.Time
}

type claimKey struct{}

// ClaimFromContext returns the claim of the call whose handler ctx belongs
// to, and false outside a protected call.
func ClaimFromContext(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}

func withClaim(ctx context.Context, c Claim) context.Context {
	return context.WithValue(ctx, claimKey{}, c)
}
