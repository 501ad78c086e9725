// Package guard is the idempotency algorithm that every adapter runs: the
// gRPC unary interceptor (package grpcguard), the MCP tools/call
// middleware, the net/http middleware and the proxies. An adapter
// translates its transport's call into a Call, its handler into a run
// function, and its result into an Outcome; the guard does the rest, in
// one place:
//
//   - a call without a key runs unprotected when its policy makes the key
//     optional, and fails KEY_MISSING otherwise;
//   - Begin at the ledger, with the call's scope, fingerprint and policy;
//     a ledger that cannot be reached fails the call closed (UNAVAILABLE,
//     retryable) and nothing runs;
//   - a replay returns the stored outcome, and the run function is not
//     called;
//   - a duplicate of an attempt still running waits for its outcome
//     (Wait) or is refused IN_PROGRESS at once (Reject);
//   - on a takeover (attempt > 1) the policy's reconcile function, if any,
//     says whether the earlier attempt's write landed, or its fence (the
//     row a fenced run writes in its write's transaction, module
//     interceptors/fence) says whether an earlier attempt committed, and
//     keeps any earlier attempt from committing after it;
//   - a claim runs the function with the claim in its context
//     (ClaimFromContext), the lease extended every half lease, and the
//     context canceled if another attempt takes the key over;
//   - a fenced run is completed with the outcome its fence holds, and one
//     that failed after it wrote its fence is settled from the fence;
//   - the outcome is completed (stored and replayed to every retry) or,
//     when it is transient, released (the retry runs afresh); a panic
//     leaves the lease to run out. Complete and Release run detached from
//     the caller's context, with their own timeout and retries.
//
// The guard's errors are *errcode.Error values: the adapter encodes them
// in its transport (a gRPC status, an MCP tool error, an HTTP problem).
package guard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// unreachableRetryAfter is the retry-after of the UNAVAILABLE answered
// when the ledger cannot be reached at Begin.
const unreachableRetryAfter = time.Second

// defaultMaxWait bounds how long a duplicate waits, under the Wait
// policy, for the attempt in progress (besides the caller's deadline).
const defaultMaxWait = 10 * time.Second

// Call is one call of a protected method, in the guard's terms. The
// adapter fills Tenant, Fingerprint and FirstAttemptAt only for a call
// with a key: a call without one never reaches the ledger.
type Call struct {
	// Method names the operation: "/pkg.Service/Method" (gRPC),
	// "mcp:tools/<name>" (MCP), "http:<METHOD> <route>" (HTTP).
	Method string
	// Key is the idempotency key the client minted for its intent; "" when
	// the call has none.
	Key string
	// KeySource says where the adapter found the key, for the record's
	// readers: "argument", "parameter", "meta", "host:<_meta key>",
	// "header", "pointer:<JSON Pointer>", "metadata", "field:<name>".
	KeySource string
	// Tenant is the customer account the call acts for.
	Tenant string
	// Fingerprint is the request's versioned digest (package fingerprint).
	Fingerprint string
	// FirstAttemptAt is when the client first tried this intent; zero
	// when the client does not say.
	FirstAttemptAt time.Time
	// Policy is the method's.
	Policy Policy
	// Reconcile, when set, is asked before a takeover (attempt > 1) runs
	// whether the earlier attempt's write landed: the adapter wraps the
	// write service's typed reconcile function in it.
	Reconcile ReconcileFunc
	// Encode turns the result a fenced run hands its fence (what its
	// handler returns: a gRPC response message, an HTTP response, an MCP
	// tool result) into the outcome the adapter stores for it; nil for
	// callers of Do, whose runs hand it an Outcome.
	Encode func(result any) (Outcome, error)
}

// ReconcileFunc asks the write service whether an earlier attempt of the
// claim in ctx (ClaimFromContext: the key, the tenant, the token) applied
// its write, by looking in the service's own database. It returns the
// outcome of that write when it landed, nil when it did not (the run
// function then runs), and an error when it cannot tell (the call fails
// UNAVAILABLE, retryable, and the claim is left to run out).
type ReconcileFunc func(ctx context.Context) (*Outcome, error)

// Outcome is what a run produced: a response or an error, as bytes the
// ledger stores and replays byte for byte, and its class.
type Outcome struct {
	// Response is a result, under a type URL that names its encoding.
	Response *anypb.Any
	// Status is an error result, when Response is nil.
	Status *status.Status
	// Transient says the run applied nothing: the key is released and a
	// retry runs afresh. Response and Status are the caller's answer and
	// are not stored.
	Transient bool
}

// RunFunc runs the write under the claim in ctx and returns its outcome.
// An error that wraps ErrOutcomeUnknown leaves the claim to run out. Any
// other error means the write ran but its result cannot be put in an
// Outcome: the record is completed with an INTERNAL error that says so,
// and the write never runs again for this key.
type RunFunc func(ctx context.Context) (Outcome, error)

// Result is the guard's answer to a call.
type Result struct {
	// Outcome is the run's outcome, or the stored one.
	Outcome Outcome
	// Replayed says the outcome comes from the ledger, not from a run of
	// this call: a replay, a waited-for replay, or a reconciled write.
	Replayed bool
	// Protected says the call went through the ledger (it had a key).
	Protected bool
	// Fenced says the outcome is the one the run's fence holds: the
	// adapter answers the call from it, as from a replay, rather than
	// from its handler's own result.
	Fenced bool
}

// Option configures a Guard.
type Option func(*options)

type options struct {
	completeTimeout time.Duration
	completeWithin  time.Duration
	maxOutcomeBytes int
	log             *slog.Logger
}

// WithCompletion sets the timeout of each Complete or Release call (5 s),
// and how long one is tried again, while the ledger answers a retryable
// error, from the start of its first try (20 s). A ledger that is down
// (restarting, say) fails each try at once, and tries go on, at most 1 s
// apart, until it is back; a connection that goes silent without closing
// (a ledgerd's node lost) fails them for up to 15 s until the ledger
// client finds it lost (ledgerclient.DialOptions), so keep within above
// 15 s plus a timeout. A fenced run's fence is read under the same bounds.
func WithCompletion(timeout, within time.Duration) Option {
	return func(o *options) { o.completeTimeout, o.completeWithin = timeout, within }
}

// WithMaxOutcomeBytes sets the largest outcome the guard asks the ledger
// to store (1 MiB, the ledger's default; set it to ledgerd's
// --max-outcome-bytes). A larger one is not sent: the caller of that
// attempt gets its answer, and the record is completed with a small
// OUTCOME_TOO_LARGE error that every retry gets, so the write never runs
// twice.
func WithMaxOutcomeBytes(n int) Option { return func(o *options) { o.maxOutcomeBytes = n } }

// WithLogger logs what the caller cannot be told: a Complete or Release
// that failed, a lease lost while the run went on. nil discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

// Guard runs calls under the ledger. It is safe for concurrent use.
type Guard struct {
	ledger ledgerv1.LedgerServiceClient
	opts   options
}

// New returns a Guard that calls the ledger through client (a unary
// client, or a ledgerclient Stream).
func New(client ledgerv1.LedgerServiceClient, opts ...Option) (*Guard, error) {
	o := options{
		completeTimeout: 5 * time.Second,
		completeWithin:  20 * time.Second,
		maxOutcomeBytes: ledger.DefaultMaxOutcomeBytes,
		log:             slog.New(slog.DiscardHandler),
	}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case client == nil:
		return nil, errors.New("guard: no ledger client")
	case o.maxOutcomeBytes <= 0:
		return nil, errors.New("guard: the largest outcome must be positive")
	case o.completeTimeout <= 0 || o.completeWithin <= 0:
		return nil, errors.New("guard: the completion's timeout and time to try must be positive")
	}
	return &Guard{ledger: client, opts: o}, nil
}

// Logger returns the logger the guard was given (WithLogger), for the
// adapters' own lines.
func (g *Guard) Logger() *slog.Logger { return g.opts.log }

// Do runs call under the ledger: run is called at most once, and only
// under a claim (or, for a call without a key whose policy makes the key
// optional, unprotected). Its errors are *errcode.Error.
func (g *Guard) Do(ctx context.Context, call Call, run RunFunc) (Result, error) {
	// The call's span: the ledger's calls and the run go under it. It
	// continues the caller's trace (the adapter's context carries it).
	ctx, span := tracer.Start(ctx, "idemledger.guard "+call.Method, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("idemledger.method", call.Method)))
	res, err := g.do(ctx, call, run)
	endSpan(span, res, err)
	return res, err
}

func (g *Guard) do(ctx context.Context, call Call, run RunFunc) (Result, error) {
	if call.Key == "" {
		return g.unkeyed(ctx, call, run)
	}
	if call.Tenant == "" {
		return Result{}, errcode.Errorf(errcode.ValidationFailed, "the call names no tenant")
	}
	req, err := call.begin()
	if err != nil {
		return Result{}, err
	}
	var waitUntil time.Time // set on the first IN_PROGRESS under Wait
	for {
		res, err := g.ledger.Begin(ctx, req)
		if err != nil {
			err = g.beginError(ctx, err)
			if errcode.Of(err) != errcode.InProgress || call.Policy.OnInProgress != Wait {
				return Result{}, err
			}
			if waitUntil.IsZero() {
				waitUntil = waitBound(ctx, call.Policy.maxWait())
			}
			end := g.wait(ctx, call, errcode.As(err), waitUntil)
			if end.stop != nil {
				return Result{}, end.stop
			}
			if !end.again {
				return Result{}, err
			}
			continue
		}
		return g.begun(ctx, call, res, run)
	}
}

// unkeyed is a call without a key: it runs unprotected where the policy
// makes the key optional, and is KEY_MISSING otherwise.
func (g *Guard) unkeyed(ctx context.Context, call Call, run RunFunc) (Result, error) {
	if !call.Policy.KeyOptional {
		return Result{}, errcode.Errorf(errcode.KeyMissing, "the call has no idempotency key")
	}
	out, err := run(ctx)
	if err != nil {
		g.opts.log.ErrorContext(ctx, "an unprotected call's result cannot be encoded", "method", call.Method, "error", err)
		return Result{}, errcode.Errorf(errcode.Internal, "internal error")
	}
	return Result{Outcome: out}, nil
}

// begun answers from Begin's answer: the stored outcome of a replay, or
// the run under a claim.
func (g *Guard) begun(ctx context.Context, call Call, res *ledgerv1.BeginResponse, run RunFunc) (Result, error) {
	switch r := res.GetResult().(type) {
	case *ledgerv1.BeginResponse_Replay:
		out, err := fromWire(r.Replay.GetOutcome())
		if err != nil {
			g.opts.log.ErrorContext(ctx, "the ledger replayed an outcome that does not decode", "method", call.Method, "error", err)
			return Result{}, errcode.Errorf(errcode.Internal, "internal error")
		}
		return Result{Outcome: out, Replayed: true, Protected: true}, nil
	case *ledgerv1.BeginResponse_Claim:
		c := Claim{
			Tenant: call.Tenant, Key: call.Key, Method: call.Method,
			Token: r.Claim.GetToken(), Attempt: r.Claim.GetAttempt(), LeaseExpiresAt: r.Claim.GetLeaseExpiresAt().AsTime(),
		}
		return g.run(ctx, call, c, r.Claim, run)
	}
	return Result{}, errcode.Errorf(errcode.Internal, "the ledger's answer to Begin is neither a claim nor a replay")
}

// begin is the call's BeginRequest.
func (call Call) begin() (*ledgerv1.BeginRequest, error) {
	p := call.Policy
	if err := p.check(); err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "internal error")
	}
	if p.Fence != nil && call.Reconcile != nil {
		return nil, errcode.Errorf(errcode.Internal, "internal error: a fenced method takes no reconcile function, its fence says whether an earlier attempt committed")
	}
	req := &ledgerv1.BeginRequest{
		Tenant:      call.Tenant,
		Key:         call.Key,
		Fingerprint: call.Fingerprint,
		Method:      call.Method,
		KeySource:   call.KeySource,
		Lease:       optionalDuration(p.Lease),
		Retention:   optionalDuration(p.Retention),
	}
	if !call.FirstAttemptAt.IsZero() {
		req.FirstAttemptAt = timestamppb.New(call.FirstAttemptAt)
	}
	if p.OnLeaseExpiry == Hold {
		req.OnLeaseExpiry = ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_HOLD
	}
	switch {
	case p.NoTombstones:
		req.TombstoneRetention = durationpb.New(0)
	case p.TombstoneRetention > 0:
		req.TombstoneRetention = durationpb.New(p.TombstoneRetention)
	}
	return req, nil
}

// beginError is what the caller hears when Begin fails: the ledger's typed
// error as it is, except that an unreachable ledger is UNAVAILABLE (fail
// closed) and the write service's own credential problems are INTERNAL.
func (g *Guard) beginError(ctx context.Context, err error) error {
	// The ledger call carries the caller's deadline: when it runs out, the
	// call may come back DEADLINE_EXCEEDED a moment before ctx says so.
	// Either way the caller's time ran out; the ledger was not at fault.
	if c := status.Code(err); ctx.Err() != nil || (!ledgerstatus.IsTyped(err) && (c == codes.DeadlineExceeded || c == codes.Canceled)) {
		return errcode.Wrap(errcode.UpstreamTimeout, err, "the call ended before the ledger answered")
	}
	le := ledgerstatus.FromError(err)
	if !ledgerstatus.IsTyped(err) || le.Code == errcode.Unavailable {
		// Fail closed, with one answer whatever the path: the connection
		// failed (untyped), the stream client could not reach the ledger,
		// or the ledger could not reach its store.
		// Whose fault, said plainly: the ledger answered (its store is
		// down, or it is shutting down), or it could not be reached.
		msg := "the idempotency ledger cannot be reached"
		switch le.Cause() {
		case errcode.CauseStore:
			msg = "the idempotency ledger is up, but its store is unavailable"
		case errcode.CauseShutdown:
			msg = "the idempotency ledger instance is shutting down"
		}
		g.opts.log.WarnContext(ctx, msg+": failing closed", "error", err)
		return &errcode.Error{Code: errcode.Unavailable, Message: msg, RetryAfter: max(unreachableRetryAfter, le.RetryAfter), Err: err}
	}
	if le.Code == errcode.Unauthenticated {
		g.opts.log.ErrorContext(ctx, "the idempotency ledger refused this service's credentials", "error", err)
		return errcode.Wrap(errcode.Internal, err, "internal error")
	}
	return le
}

// toWire is the outcome as the ledger stores it.
func (o Outcome) toWire() *ledgerv1.Outcome {
	if o.Response != nil {
		return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: o.Response}}
	}
	return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: ledgerstatus.ToStored(o.Status)}}
}

// fromWire is a stored outcome.
func fromWire(o *ledgerv1.Outcome) (Outcome, error) {
	switch r := o.GetResult().(type) {
	case *ledgerv1.Outcome_Response:
		return Outcome{Response: r.Response}, nil
	case *ledgerv1.Outcome_Status:
		return Outcome{Status: ledgerstatus.FromFields(r.Status)}, nil
	}
	return Outcome{}, fmt.Errorf("guard: an empty outcome")
}

// isResponse reports whether the outcome is a result rather than an
// error.
func (o Outcome) isResponse() bool { return !o.Transient && o.Response != nil }

func optionalDuration(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}

// Transient reports whether a handler's Go error means it applied nothing
// and a retry should run afresh: a typed error's retryable flag (an
// *errcode.Error it wraps, or a status that carries one); a gRPC
// status of UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED
// or CANCELED; a context's cancellation or deadline. Every other error is
// permanent: stored and replayed.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	if le := (*errcode.Error)(nil); errors.As(err, &le) {
		return le.Retryable()
	}
	if ledgerstatus.IsTyped(err) {
		return ledgerstatus.FromError(err).Retryable()
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	switch st.Code() {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// tracer makes the guard's spans. Without a tracer provider
// (otel.SetTracerProvider) they cost nothing.
var tracer = otel.Tracer("github.com/idemledger/idemledger/interceptors/guard")

// endSpan ends a call's span with what became of it: replayed, ran,
// released, unprotected, or the error's code.
func endSpan(span trace.Span, res Result, err error) {
	result := "ran"
	switch {
	case err != nil:
		le := errcode.As(err)
		result = strings.ToLower(le.Code.String())
		if le.Code == errcode.Internal || le.Code == errcode.Unavailable {
			span.SetStatus(otelcodes.Error, le.Code.String())
		}
	case !res.Protected:
		result = "unprotected"
	case res.Replayed:
		result = "replayed"
	case res.Outcome.Transient:
		result = "released"
	}
	span.SetAttributes(attribute.String("idemledger.result", result))
	span.End()
}

// Continue returns ctx carrying the caller's trace, extracted from carrier
// (an HTTP request's headers, an MCP call's _meta, a gRPC call's
// metadata), when ctx has no span yet: the adapters call it so that the
// guard's span continues a trace the caller started.
func Continue(ctx context.Context, carrier propagation.TextMapCarrier) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	p := otel.GetTextMapPropagator()
	if len(p.Fields()) == 0 {
		p = propagation.TraceContext{} // no propagator configured: W3C's
	}
	return p.Extract(ctx, carrier)
}
