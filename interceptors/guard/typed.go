package guard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// jsonTypeURL names the encoding of the results Do stores: JSON.
const jsonTypeURL = "application/json"

// Do runs fn under g for call, in process, in the caller's own types: the
// entry point for code that is not a handler (a job, a queue consumer, a
// workflow step), as Restate's ctx.run or a DBOS step. fn runs at most
// once per key, under a claim in its context (ClaimFromContext); its
// result is stored as JSON and every later Do with the key decodes it
// into a fresh T, without running fn.
//
// fn's error is classified as a handler's (Transient): a transient one
// releases the key, so a later Do runs fn afresh; a permanent one is
// stored as a status and every later Do returns it, as a gRPC status
// error (a *errcode.Error for the ledger's own codes). An error that wraps
// ErrOutcomeUnknown leaves the claim to run out. Do's own errors are
// *errcode.Error, as Guard.Do's.
func Do[T any](ctx context.Context, g *Guard, call Call, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	var live T
	var liveErr error
	res, err := g.Do(ctx, call, func(ctx context.Context) (Outcome, error) {
		live, liveErr = fn(ctx)
		return typedOutcome(live, liveErr)
	})
	switch {
	case err != nil:
		return zero, err
	case !res.Replayed:
		return live, liveErr
	case res.Outcome.Response == nil:
		if stored := res.Outcome.Status.Err(); ledgerstatus.IsTyped(stored) {
			return zero, ledgerstatus.Decode(res.Outcome.Status)
		}
		return zero, res.Outcome.Status.Err()
	case res.Outcome.Response.GetTypeUrl() != jsonTypeURL:
		return zero, errcode.Errorf(errcode.Internal, "the key holds a result of another encoding (%s)", res.Outcome.Response.GetTypeUrl())
	}
	var out T
	if err := json.Unmarshal(res.Outcome.Response.GetValue(), &out); err != nil {
		g.opts.log.ErrorContext(ctx, "a stored result does not decode", "method", call.Method, "error", err)
		return zero, errcode.Errorf(errcode.Internal, "internal error")
	}
	return out, nil
}

// typedOutcome is what Do stores of fn's answer: its result as JSON, or
// its error as a status, transient or not; an error that wraps
// ErrOutcomeUnknown leaves the claim to run out.
func typedOutcome[T any](v T, fnErr error) (Outcome, error) {
	if errors.Is(fnErr, ErrOutcomeUnknown) {
		return Outcome{}, fnErr
	}
	if fnErr != nil {
		st := errorStatus(fnErr)
		return Outcome{Status: st, Transient: Transient(fnErr)}, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return Outcome{}, fmt.Errorf("guard: encode the result: %w", err)
	}
	return Outcome{Response: &anypb.Any{TypeUrl: jsonTypeURL, Value: b}}, nil
}

// errorStatus is the status an error of fn is stored as: a typed error
// with its details, a gRPC status as it is, anything else UNKNOWN with its
// message.
func errorStatus(err error) *status.Status {
	if le := (*errcode.Error)(nil); errors.As(err, &le) {
		return ledgerstatus.Encode(le)
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}
