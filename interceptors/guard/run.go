package guard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/internal/fencing"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// ErrOutcomeUnknown says, wrapped in a run's error, that nobody knows
// whether the write happened: a call to an upstream that failed after it
// was sent, a timeout of an external API. The guard neither completes nor
// releases: the claim runs out, and the next attempt takes over (and may
// reconcile) or, under Hold, finds the record OUTCOME_UNKNOWN. The caller
// gets UNAVAILABLE, retryable once the lease has run out.
var ErrOutcomeUnknown = errors.New("the outcome of the call is unknown")

// UnknownOutcome is a run's error that wraps ErrOutcomeUnknown and says,
// in words its caller reads, why nobody knows whether the write happened:
// "the upstream MCP server exited before it answered". cause, which may
// be nil, stays out of what the caller reads.
func UnknownOutcome(why string, cause error) error {
	return &unknownOutcome{why: why, cause: cause}
}

type unknownOutcome struct {
	why   string
	cause error
}

func (e *unknownOutcome) Error() string {
	if e.cause == nil {
		return e.why
	}
	return e.why + ": " + e.cause.Error()
}

func (e *unknownOutcome) Unwrap() []error { return []error{ErrOutcomeUnknown, e.cause} }

// errLeaseLost is the cause of a run's context canceled because another
// attempt took over the key.
var errLeaseLost = errors.New("guard: another attempt took over the key")

// errRunTimedOut is the cause of a run's context ended by the policy's
// run timeout.
var errRunTimedOut = errors.New("guard: the run went past its run timeout")

// Claim is the run's hold on its key: the ledger's fencing token and the
// attempt number. A run that writes to its own database should store the
// token with the write and refuse a write whose token is lower than the
// one stored, so an attempt that lost its lease cannot overwrite the
// attempt that took over.
type Claim struct {
	Tenant         string
	Key            string
	Method         string
	Token          uint64
	Attempt        uint32 // 1 for the first attempt, more after takeovers
	LeaseExpiresAt time.Time
}

type claimKey struct{}

// ClaimFromContext returns the claim of the call whose run ctx belongs
// to, and false outside a protected call.
func ClaimFromContext(ctx context.Context) (Claim, bool) {
	c, ok := ctx.Value(claimKey{}).(Claim)
	return c, ok
}

// run runs the call under claim c and records its outcome. The run
// outlives its caller: its context keeps the caller's values but not its
// cancellation, and ends at the policy's run timeout.
func (g *Guard) run(ctx context.Context, call Call, c Claim, claim *ledgerv1.Claim, run RunFunc) (Result, error) {
	trace.SpanFromContext(ctx).SetAttributes(ledger.AttrAttempt.Int64(int64(c.Attempt)))
	bounded, stopTimer := context.WithTimeoutCause(context.WithoutCancel(ctx), call.Policy.runTimeout(), errRunTimedOut)
	defer stopTimer()
	var fenced *fencing.Run
	if call.Policy.Fence != nil {
		fenced = g.fencedRun(call, c, claim)
		bounded = fencing.NewContext(bounded, fenced)
	}
	rctx, cancel := context.WithCancelCause(context.WithValue(bounded, claimKey{}, c))
	defer cancel(nil)
	stop := g.keepAlive(ctx, cancel, call.Policy, c)
	panicked := true
	defer func() {
		stop()
		if panicked {
			// No Complete, no Release: the lease runs out and the next
			// attempt takes over with a higher token (or, under Hold, the
			// record turns OUTCOME_UNKNOWN).
			g.opts.log.WarnContext(ctx, "the run panicked under a claim; its lease will run out", "method", call.Method, "key", c.Key, "token", c.Token)
		}
	}()
	if res, done, err := g.takeover(rctx, ctx, call, c, fenced); done {
		panicked = false
		return res, err
	}
	out, err := run(rctx)
	panicked = false
	stop()
	return g.settle(ctx, rctx, call, c, fenced, out, err)
}

// takeover is what a takeover (attempt 2 or later) asks before it runs:
// the policy's reconcile function, or the fence, whether the earlier
// attempt's write landed. done says the call is answered.
func (g *Guard) takeover(rctx, ctx context.Context, call Call, c Claim, fenced *fencing.Run) (Result, bool, error) {
	if c.Attempt > 1 && call.Reconcile != nil {
		if res, done, err := g.reconcile(rctx, ctx, call, c); done {
			return res, true, err
		}
	}
	if c.Attempt > 1 && fenced != nil {
		if res, done, err := g.reserveFence(rctx, ctx, call, c, fenced); done {
			return res, true, err
		}
	}
	return Result{}, false, nil
}

// settle records what the run returned (out, err; rctx its context) and
// answers the call: the outcome completed, the key released for a
// transient one, or left to run out when nobody knows what happened.
func (g *Guard) settle(ctx, rctx context.Context, call Call, c Claim, fenced *fencing.Run, out Outcome, err error) (Result, error) {
	if errors.Is(context.Cause(rctx), errRunTimedOut) && (err != nil || !out.isResponse()) {
		// Ended by the run timeout: whatever it answered, nobody knows
		// whether its write happened.
		err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, errRunTimedOut)
	}
	if fenced != nil {
		var res *Result
		if res, out, err = g.fenced(ctx, call, c, fenced, out, err); res != nil {
			return *res, err
		}
	}
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
		g.opts.log.WarnContext(ctx, "the call's outcome is unknown: its claim is left to run out", "method", call.Method, "key", c.Key, "token", c.Token, "error", err)
		return Result{}, unknownOutcomeError(call, c, err)
	case err != nil:
		g.opts.log.ErrorContext(ctx, "the run's result cannot be stored: the record says the call ran", "method", call.Method, "key", c.Key, "error", err)
		g.complete(ctx, c, notKept(errcode.Internal, 0, g.opts.maxOutcomeBytes))
		return Result{}, errcode.Errorf(errcode.Internal, "internal error")
	case errors.Is(context.Cause(rctx), errLeaseLost) && !out.isResponse():
		return Result{}, &errcode.Error{Code: errcode.InProgress, Message: "another attempt took over this key", RetryAfter: 100 * time.Millisecond}
	case out.Transient:
		_ = g.record(ctx, "release", c, func(ctx context.Context) error {
			_, err := g.ledger.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: c.Tenant, Key: c.Key, Token: c.Token})
			return err
		})
		return Result{Outcome: out, Protected: true}, nil
	case out.Response == nil && out.Status == nil:
		g.opts.log.ErrorContext(ctx, "the run returned an empty outcome: the record says the call ran", "method", call.Method, "key", c.Key)
		g.complete(ctx, c, notKept(errcode.Internal, 0, g.opts.maxOutcomeBytes))
		return Result{}, errcode.Errorf(errcode.Internal, "internal error")
	}
	g.complete(ctx, c, out.toWire())
	return Result{Outcome: out, Protected: true}, nil
}

// unknownOutcomeError is what the caller hears when nobody knows whether
// the run did its write: UNAVAILABLE, to retry with the same key once the
// lease has run out, saying why.
func unknownOutcomeError(call Call, c Claim, err error) error {
	msg := "the service's handler could not tell whether this call was done: retry with the same key once its lease has run out"
	var why *unknownOutcome
	if errors.As(err, &why) {
		msg = why.why + ", so nobody knows whether this call was done: retry with the same key once its lease has run out"
	}
	if errors.Is(err, errRunTimedOut) {
		msg = fmt.Sprintf("the service's handler did not finish within its run timeout (%s), so nobody knows whether this call was done: retry with the same key once its lease has run out", call.Policy.runTimeout())
	}
	return &errcode.Error{Code: errcode.Unavailable, Message: msg, RetryAfter: max(100*time.Millisecond, time.Until(c.LeaseExpiresAt)), Err: err}
}

// reconcile asks the policy's reconcile function about the earlier
// attempt of a takeover. done says the call is answered: the write had
// landed (completed with its outcome), or nobody can tell (UNAVAILABLE,
// the claim left to run out).
func (g *Guard) reconcile(rctx, ctx context.Context, call Call, c Claim) (res Result, done bool, err error) {
	out, err := call.Reconcile(rctx)
	switch {
	case err != nil:
		g.opts.log.WarnContext(ctx, "reconcile cannot tell whether the earlier attempt applied: the claim is left to run out", "method", call.Method, "key", c.Key, "attempt", c.Attempt, "error", err)
		return Result{}, true, &errcode.Error{Code: errcode.Unavailable, Message: "cannot tell yet whether an earlier attempt of this call applied", RetryAfter: max(100*time.Millisecond, time.Until(c.LeaseExpiresAt)), Err: err}
	case out == nil:
		return Result{}, false, nil
	case out.Transient || (out.Response == nil && out.Status == nil):
		g.opts.log.ErrorContext(ctx, "reconcile returned an outcome that cannot be stored", "method", call.Method, "key", c.Key)
		return Result{}, true, errcode.Errorf(errcode.Internal, "internal error")
	}
	g.opts.log.InfoContext(ctx, "reconciled: the earlier attempt applied; completing with its outcome", "method", call.Method, "key", c.Key, "attempt", c.Attempt)
	g.complete(ctx, c, out.toWire())
	return Result{Outcome: *out, Replayed: true, Protected: true}, true, nil
}

// complete stores the attempt's outcome. An outcome the ledger cannot keep
// (larger than the limit, or refused for good) is replaced by a small
// stored error that says the call ran and its answer was not kept: every
// retry gets that error, permanent, and the write never runs twice.
func (g *Guard) complete(ctx context.Context, c Claim, out *ledgerv1.Outcome) {
	send := func(out *ledgerv1.Outcome) error {
		return g.record(ctx, "complete", c, func(ctx context.Context) error {
			_, err := g.ledger.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: c.Tenant, Key: c.Key, Token: c.Token, Outcome: out})
			return err
		})
	}
	size := proto.Size(out)
	if size > g.opts.maxOutcomeBytes {
		_ = send(notKept(errcode.OutcomeTooLarge, size, g.opts.maxOutcomeBytes))
		return
	}
	err := send(out)
	le := ledgerstatus.FromError(err)
	if err == nil || le.Retryable() || le.Code == errcode.LeaseLost {
		return
	}
	code := errcode.Internal
	if le.Code == errcode.OutcomeTooLarge {
		code = errcode.OutcomeTooLarge
	}
	_ = send(notKept(code, size, g.opts.maxOutcomeBytes))
}

// notKept is the outcome stored in place of one the ledger cannot keep.
func notKept(code errcode.Code, size, limit int) *ledgerv1.Outcome {
	msg := fmt.Sprintf("the call ran, but its answer (%d bytes) could not be stored, so it cannot be replayed: do not retry this intent", size)
	if code == errcode.OutcomeTooLarge {
		msg = fmt.Sprintf("the call ran, but its answer (%d bytes) is larger than the idempotency ledger keeps (%d bytes), so it cannot be replayed: do not retry this intent", size, limit)
	}
	st := ledgerstatus.Encode(&errcode.Error{Code: code, Message: msg, Metadata: map[string]string{
		errcode.MetaApplied: "true", "sizeBytes": strconv.Itoa(size), "limitBytes": strconv.Itoa(limit),
	}})
	return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: ledgerstatus.ToStored(st)}}
}

// record runs a Complete or Release detached from the caller's context,
// retried on retryable answers (persist). Failures are logged (the caller
// already has its answer) and returned.
func (g *Guard) record(ctx context.Context, what string, c Claim, call func(context.Context) error) error {
	ctx = context.WithoutCancel(ctx)
	err := g.persist(ctx, call, func(err error) (bool, time.Duration) {
		le := ledgerstatus.FromError(err)
		return le.Retryable(), le.RetryAfter
	})
	if err != nil {
		le := ledgerstatus.FromError(err)
		msg := "idempotency " + what + " failed: the record stays in progress until its lease runs out"
		if le.Code == errcode.LeaseLost {
			msg = "idempotency " + what + " fenced: another attempt took over while the handler ran"
		}
		g.opts.log.ErrorContext(ctx, msg, "method", c.Method, "key", c.Key, "tenant", c.Tenant, "token", c.Token, "code", le.Code.String(), "error", err)
	}
	return err
}

// persist calls try, each time with the completion's timeout, until it
// succeeds, fails for good (again says whether an error is worth another
// try, and the least wait before it), or the completion's time to try
// (from the first try's start) would pass before the next try: tries that
// fail at once (a ledger that is down) go on, at most 1 s apart, until
// it is back.
func (g *Guard) persist(ctx context.Context, try func(context.Context) error, again func(error) (bool, time.Duration)) error {
	until := time.Now().Add(g.opts.completeWithin)
	for n := 1; ; n++ {
		tctx, cancel := context.WithTimeout(ctx, g.opts.completeTimeout)
		err := try(tctx)
		cancel()
		if err == nil {
			return nil
		}
		retry, after := again(err)
		pause := max(after, backoff.FullJitter(20*time.Millisecond, time.Second, n+1))
		if !retry || time.Until(until) < pause {
			return err
		}
		time.Sleep(pause)
	}
}

// keepAlive extends the lease every half lease while the run goes on; if
// another attempt took over, it cancels the run's context with
// errLeaseLost. stop ends it and waits for it.
func (g *Guard) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, p Policy, c Claim) (stop func()) {
	lease := p.Lease
	if lease <= 0 {
		lease = time.Until(c.LeaseExpiresAt)
	}
	if lease <= 0 {
		return func() {}
	}
	ctx = context.WithoutCancel(ctx) // a caller who hangs up does not end the run's lease
	req := &ledgerv1.ExtendRequest{Tenant: c.Tenant, Key: c.Key, Token: c.Token}
	if p.Lease > 0 {
		req.Lease = durationpb.New(p.Lease)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(lease / 2)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			ectx, cancelCall := context.WithTimeout(ctx, max(lease/2, time.Second))
			_, err := g.ledger.Extend(ectx, req)
			cancelCall()
			if err == nil {
				continue
			}
			if ledgerstatus.FromError(err).Code == errcode.LeaseLost {
				g.opts.log.WarnContext(ctx, "lease lost while the run went on: canceling it", "method", c.Method, "key", c.Key, "token", c.Token)
				cancel(errLeaseLost)
				return
			}
			g.opts.log.WarnContext(ctx, "lease extension failed; trying again", "method", c.Method, "key", c.Key, "error", err)
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}
