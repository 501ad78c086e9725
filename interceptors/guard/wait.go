package guard

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Bounds of a duplicate's wait.
const (
	// deadlineMargin is kept before the caller's deadline, at most, so
	// that IN_PROGRESS reaches the caller before its deadline does.
	deadlineMargin = 250 * time.Millisecond
	// maxLookupWait bounds one Lookup's wait (ledgerd refuses more than a
	// minute).
	maxLookupWait = 30 * time.Second
	// leaseSlack is waited past the end of the first attempt's lease, so
	// that the Begin that follows finds it run out.
	leaseSlack = 5 * time.Millisecond
)

// waitBound is when a duplicate stops waiting: after maxWait, and a
// little before the caller's deadline.
func waitBound(ctx context.Context, maxWait time.Duration) time.Time {
	until := time.Now().Add(maxWait)
	if d, ok := ctx.Deadline(); ok {
		margin := min(deadlineMargin, time.Until(d)/10)
		if d.Add(-margin).Before(until) {
			until = d.Add(-margin)
		}
	}
	return until
}

// wait waits, until at the latest, for the record behind an IN_PROGRESS
// answer to change: its outcome stored, its key released (Lookup with a
// wait wakes on both), or its lease run out (the wait ends then). It
// returns false when the bound is reached or ctx ends first: the
// duplicate then gets IN_PROGRESS. A ledger that is shutting down ends
// the wait with its UNAVAILABLE (stop), which the duplicate gets at once,
// to retry elsewhere. Otherwise the guard Begins again.
func (g *Guard) wait(ctx context.Context, call Call, inProgress *errcode.Error, until time.Time) waitEnd {
	left := time.Until(until)
	if left <= 0 || ctx.Err() != nil {
		return waitEnd{}
	}
	w := min(left, maxLookupWait)
	if end, err := time.Parse(time.RFC3339Nano, inProgress.Metadata["leaseExpiresAt"]); err == nil {
		w = min(w, time.Until(end)+leaseSlack)
	} else if inProgress.RetryAfter > 0 {
		w = min(w, inProgress.RetryAfter)
	}
	if w <= 0 {
		return waitEnd{again: true} // the lease ran out: Begin takes over
	}
	_, err := g.ledger.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: call.Tenant, Key: call.Key, Wait: durationpb.New(w)})
	if le := ledgerstatus.FromError(err); le != nil && le.Code != errcode.NotFound {
		if le.Code == errcode.Unavailable && le.Cause() == errcode.CauseShutdown {
			return waitEnd{stop: &errcode.Error{Code: errcode.Unavailable, Message: "the idempotency ledger instance is shutting down",
				RetryAfter: max(le.RetryAfter, unreachableRetryAfter), Metadata: map[string]string{errcode.MetaCause: errcode.CauseShutdown}, Err: err}}
		}
		// The ledger cannot wait for us (too many waiters, a failure):
		// Begin again after a short pause.
		pause := min(time.Until(until), backoff.FullJitter(20*time.Millisecond, 500*time.Millisecond, 2))
		if backoff.Sleep(ctx, pause) != nil {
			return waitEnd{}
		}
	}
	return waitEnd{again: ctx.Err() == nil && time.Now().Before(until)}
}

// waitEnd is how a wait ended: Begin again, give up (IN_PROGRESS), or
// stop with an error of its own.
type waitEnd struct {
	again bool
	stop  *errcode.Error
}
