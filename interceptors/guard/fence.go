package guard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/fencing"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// A write whose effect lands in the write service's own SQL database can
// be made exact: the run writes a fence in the same transaction as its
// write, a row of the key that holds the claim's token and the outcome,
// and the guard completes the key with that outcome. The row settles
// every question the ledger alone cannot answer:
//
//   - at most one transaction that carries the key's fence commits: an
//     attempt whose lease was taken over fails at its fence, its
//     transaction rolled back (a takeover reserves the fence for its own
//     token before it runs);
//   - a takeover reads the fence before it runs: an earlier attempt that
//     committed and died before Complete left its outcome there, and the
//     guard completes the key with it and replays it, the run not called;
//   - a run that fails after it wrote its fence (its commit failed, or
//     nobody knows whether it did) closes the fence to its own token and
//     reads it: committed, the guard completes with the fenced outcome;
//     not, the write can no longer commit, and the call fails as it
//     would have.
//
// Package fence (module interceptors/fence) has the table for
// database/sql and pgx (Policy.Fence), and writes the fence in a
// transaction; internal/fencing is what the guard shares with it.

// encodeFunc is the fence's encoding of a run's result: the adapter's
// encode (Call.Encode; an Outcome as it is without one), as the ledger
// stores it, within the guard's limit.
func (g *Guard) encodeFunc(encode func(any) (Outcome, error)) func(any) ([]byte, error) {
	return func(result any) ([]byte, error) {
		out, ok := result.(Outcome)
		var err error
		switch {
		case encode != nil:
			out, err = encode(result)
		case !ok:
			err = fmt.Errorf("guard: a fence of guard.Do holds an Outcome, not a %T", result)
		}
		if err != nil {
			return nil, errcode.Wrap(errcode.Internal, err, "the fence's outcome cannot be encoded, so the write does not commit")
		}
		if out.Transient || (out.Response == nil && out.Status == nil) {
			return nil, errcode.Errorf(errcode.Internal, "a fence holds an outcome to store, not a transient or empty one, so the write does not commit")
		}
		// An outcome larger than the limit is replaced, as Complete
		// would replace it, by the error that says the call ran and its
		// answer was not kept.
		wire := out.toWire()
		if size := proto.Size(wire); size > g.opts.maxOutcomeBytes {
			wire = notKept(errcode.OutcomeTooLarge, size, g.opts.maxOutcomeBytes)
		}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(wire)
		if err != nil {
			return nil, errcode.Wrap(errcode.Internal, err, "the fence's outcome cannot be encoded, so the write does not commit")
		}
		return b, nil
	}
}

// fencedRun is the fencing of run c of call.
func (g *Guard) fencedRun(call Call, c Claim, claim *ledgerv1.Claim) *fencing.Run {
	lease := call.Policy.Lease
	if lease <= 0 {
		lease = time.Until(c.LeaseExpiresAt)
	}
	scope := fencing.Scope{Namespace: claim.GetNamespace(), Tenant: c.Tenant, Key: c.Key, Method: c.Method,
		CreatedAt: claim.GetCreatedAt().AsTime(), ExpiresAt: later(claim.GetExpiresAt().AsTime(), c.LeaseExpiresAt)}
	return &fencing.Run{Scope: scope, Token: c.Token, Encode: g.encodeFunc(call.Encode),
		ExpiresAt: func() time.Time { return later(scope.ExpiresAt, time.Now().Add(lease)) }}
}

// fenceFound reads a committed fence's outcome.
func fenceFound(row fencing.Row) (Outcome, error) {
	var wire ledgerv1.Outcome
	if err := proto.Unmarshal(row.Outcome, &wire); err != nil {
		return Outcome{}, fmt.Errorf("guard: the fence's outcome does not decode: %w", err)
	}
	return fromWire(&wire)
}

// fenceVerdict is what a fence row read by Reserve says of claim c.
type fenceVerdict uint8

const (
	fenceOurs      fenceVerdict = iota // c holds it, uncommitted: run
	fenceCommitted                     // c's record committed it: complete with its outcome
	fenceTaken                         // a later attempt or record holds it: c is stale
)

func verdict(row fencing.Row, r *fencing.Run, token uint64) fenceVerdict {
	created := r.Scope.CreatedAt.Truncate(time.Microsecond)
	switch {
	case !row.RecordCreatedAt.Equal(created):
		if row.RecordCreatedAt.After(created) {
			return fenceTaken
		}
		return fenceOurs // Reserve resets an earlier record's fence; not reached
	case row.Outcome != nil:
		return fenceCommitted
	case row.Token == token:
		return fenceOurs
	}
	return fenceTaken
}

// reserveFence reserves the fence for a takeover before it runs. done
// says the call is answered: an earlier attempt committed (completed with
// its outcome and replayed), a later one holds the fence, or the fence
// cannot be read (UNAVAILABLE, the claim left to run out).
func (g *Guard) reserveFence(rctx, ctx context.Context, call Call, c Claim, r *fencing.Run) (res Result, done bool, err error) {
	row, err := call.Policy.Fence.Reserve(rctx, r.Scope, c.Token)
	if err != nil {
		g.opts.log.WarnContext(ctx, "the fence cannot be read: the claim is left to run out", "method", call.Method, "key", c.Key, "attempt", c.Attempt, "error", err)
		return Result{}, true, &errcode.Error{Code: errcode.Unavailable, Message: "cannot tell yet whether an earlier attempt of this call committed",
			RetryAfter: max(100*time.Millisecond, time.Until(c.LeaseExpiresAt)), Err: err}
	}
	switch verdict(row, r, c.Token) {
	case fenceOurs:
		return Result{}, false, nil
	case fenceCommitted:
		out, err := fenceFound(row)
		if err != nil {
			g.opts.log.ErrorContext(ctx, "the fence holds an outcome that does not decode", "method", call.Method, "key", c.Key, "error", err)
			return Result{}, true, errcode.Errorf(errcode.Internal, "internal error")
		}
		g.opts.log.InfoContext(ctx, "the fence says an earlier attempt committed: completing with its outcome", "method", call.Method, "key", c.Key, "attempt", c.Attempt)
		g.complete(ctx, c, out.toWire())
		return Result{Outcome: out, Replayed: true, Protected: true}, true, nil
	}
	return Result{}, true, takenOver()
}

// takenOver is the answer of an attempt another one took over.
func takenOver() error {
	return &errcode.Error{Code: errcode.InProgress, Message: "another attempt took over this key", RetryAfter: 100 * time.Millisecond}
}

// settleFence decides a fenced run that did not end in a response after
// it wrote its fence: its transaction may have committed, or may still.
// It closes the fence to the run's token (a reservation for the next
// token: a commit of this attempt still on its way then fails) and reads
// it. committed says the fence holds this record's outcome: the call is
// answered with it. Otherwise the write did not commit and cannot: res
// and err are the run's to answer as it would have, except that an
// unknown outcome is now known not applied. An error reading the fence
// leaves the outcome unknown.
func (g *Guard) settleFence(ctx context.Context, call Call, c Claim, r *fencing.Run) (out Outcome, committed bool, err error) {
	var row fencing.Row
	err = g.persist(context.WithoutCancel(ctx), func(ctx context.Context) (err error) {
		row, err = call.Policy.Fence.Reserve(ctx, r.Scope, c.Token+1)
		return err
	}, func(error) (bool, time.Duration) { return true, 0 })
	if err != nil {
		return Outcome{}, false, fmt.Errorf("%w: the fence cannot be read after the run failed: %w", ErrOutcomeUnknown, err)
	}
	if verdict(row, r, c.Token+1) != fenceCommitted {
		return Outcome{}, false, nil
	}
	out, err = fenceFound(row)
	if err != nil {
		return Outcome{}, false, fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return out, true, nil
}

// fenced decides a fenced run's answer from what its fence says. A
// run that wrote its fence and answered a response committed it: the key
// is completed with the fenced outcome, which answers the call. Any other
// run that wrote one is settled (settleFence): a fence that says it
// committed answers the call; otherwise its own answer stands, except
// that an unknown outcome is now known not applied (the key is released
// and the caller told to retry), and a run whose fence was refused lost
// its key to another attempt. A non-nil res is the call's answer, with
// the error returned; nil, the run's own answer, out and err, goes on to
// be recorded.
func (g *Guard) fenced(ctx context.Context, call Call, c Claim, r *fencing.Run, out Outcome, err error) (res *Result, _ Outcome, _ error) {
	attempted, written := r.State()
	if !attempted {
		return nil, out, err
	}
	if err == nil && out.isResponse() && written != nil {
		fenced, derr := fenceFound(fencing.Row{Outcome: written})
		if derr != nil {
			return nil, out, derr
		}
		g.complete(ctx, c, fenced.toWire())
		return &Result{Outcome: fenced, Protected: true, Fenced: true}, out, nil
	}
	fenced, committed, serr := g.settleFence(ctx, call, c, r)
	switch {
	case serr != nil:
		g.opts.log.WarnContext(ctx, "the fence cannot say whether the run's write committed", "method", call.Method, "key", c.Key, "token", c.Token, "error", serr)
		return nil, out, serr
	case committed:
		g.opts.log.InfoContext(ctx, "the run failed after its write committed: completing with its fenced outcome", "method", call.Method, "key", c.Key, "token", c.Token, "error", err)
		g.complete(ctx, c, fenced.toWire())
		return &Result{Outcome: fenced, Protected: true, Fenced: true}, out, nil
	case written == nil:
		return &Result{}, out, takenOver()
	case errors.Is(err, ErrOutcomeUnknown):
		st := ledgerstatus.Encode(&errcode.Error{Code: errcode.Unavailable, RetryAfter: 100 * time.Millisecond,
			Message: "the write did not commit, and its fence now keeps it from committing: retry with the same key"})
		return nil, Outcome{Status: st, Transient: true}, nil
	}
	return nil, out, err
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
