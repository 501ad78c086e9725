package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/fingerprint"
	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/internal/protofield"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// unreachableRetryAfter is the retry-after of the UNAVAILABLE answered
// when the ledger cannot be reached at Begin.
const unreachableRetryAfter = time.Second

// errLeaseLost is the cause of a handler context canceled because another
// attempt took over the key.
var errLeaseLost = errors.New("idempotency: another attempt took over the key")

type interceptor struct {
	ledger  ledgerv1.LedgerServiceClient
	opts    options
	methods map[string]*method
	skip    []protoreflect.Name // left out of the fingerprint: the key field
}

// method is a protected method, resolved at build time.
type method struct {
	policy Policy
	output protoreflect.MessageType
	print  fingerprint.ProtoOptions // the skip list and the resolver of Anys
	// lease and retention are the policy's, as sent to the ledger (nil
	// for the ledger's default). Read only.
	lease, retention *durationpb.Duration
}

// UnaryServerInterceptor returns the interceptor that protects the methods
// named with WithMethod through the ledger behind client. Every protected
// method must resolve, in the registry (WithRegistry; the global one by
// default), to a unary method whose response type is registered, or it
// returns an error and no interceptor.
//
// The interceptor is safe for concurrent use. Its errors are statuses typed
// by ledgerstatus: KEY_MISSING, KEY_INVALID and VALIDATION_FAILED for a bad
// call, the ledger's IN_PROGRESS, KEY_REUSED, RETRY_TOO_LATE and
// RATE_LIMITED as they come, UNAVAILABLE when the ledger cannot be reached.
func UnaryServerInterceptor(client ledgerv1.LedgerServiceClient, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if client == nil {
		return nil, errors.New("idempotency: no ledger client")
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	i := &interceptor{ledger: client, opts: o, methods: map[string]*method{}}
	if o.keyField != "" {
		i.skip = []protoreflect.Name{o.keyField}
	}
	for name, p := range o.methods {
		in, out, err := o.resolve(name)
		if err != nil {
			return nil, err
		}
		prints := fingerprint.ProtoOptions{Skip: i.skip, Resolve: fingerprint.Related(in.ParentFile())}
		if o.registry {
			prints.Resolve = fingerprint.FromTypes(o.types)
		}
		i.methods[name] = &method{policy: p, output: out, print: prints, lease: optionalDuration(p.Lease), retention: optionalDuration(p.Retention)}
	}
	return i.intercept, nil
}

// resolve finds the request's descriptor and the response type of a unary
// method by its full name.
func (o *options) resolve(fullMethod string) (protoreflect.MessageDescriptor, protoreflect.MessageType, error) {
	service, name, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok || !strings.HasPrefix(fullMethod, "/") || name == "" || strings.Contains(name, "/") {
		return nil, nil, fmt.Errorf("idempotency: %q is not a full method name like /pkg.Service/Method", fullMethod)
	}
	d, err := o.files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency: %s: service not in the registry: %w", fullMethod, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, nil, fmt.Errorf("idempotency: %s: %s is not a service", fullMethod, service)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, nil, fmt.Errorf("idempotency: %s: no such method", fullMethod)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, nil, fmt.Errorf("idempotency: %s: only unary methods can be protected", fullMethod)
	}
	out, err := o.types.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, nil, fmt.Errorf("idempotency: %s: response type %s not in the registry: %w", fullMethod, md.Output().FullName(), err)
	}
	return md.Input(), out, nil
}

func (i *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m, ok := i.methods[info.FullMethod]
	if !ok {
		return handler(ctx, req)
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, i.fail(ctx, ledger.Errorf(ledger.CodeInternal, "the request is not a protobuf message"))
	}
	key := i.key(ctx, msg)
	if key == "" {
		if m.policy.KeyOptional {
			return handler(ctx, req)
		}
		return nil, i.fail(ctx, ledger.Errorf(ledger.CodeKeyMissing, "the call has no idempotency key"))
	}
	tenant, err := i.opts.tenant(ctx, msg)
	if err != nil {
		if le := (*ledger.Error)(nil); !errors.As(err, &le) {
			err = ledger.Errorf(ledger.CodeValidationFailed, "the call names no tenant")
		}
		return nil, i.fail(ctx, err)
	}
	first, err := firstAttempt(ctx)
	if err != nil {
		return nil, i.fail(ctx, err)
	}
	res, err := i.ledger.Begin(ctx, &ledgerv1.BeginRequest{
		Tenant:         tenant,
		Key:            key,
		Fingerprint:    fingerprint.Proto(info.FullMethod, msg, m.print),
		Method:         info.FullMethod,
		Lease:          m.lease,
		Retention:      m.retention,
		FirstAttemptAt: first,
	})
	if err != nil {
		return nil, i.fail(ctx, i.beginError(ctx, err))
	}
	switch r := res.GetResult().(type) {
	case *ledgerv1.BeginResponse_Replay:
		return i.replay(ctx, m, r.Replay)
	case *ledgerv1.BeginResponse_Claim:
		c := Claim{Tenant: tenant, Key: key, Token: r.Claim.GetToken(), Attempt: r.Claim.GetAttempt(), LeaseExpiresAt: r.Claim.GetLeaseExpiresAt().AsTime()}
		return i.run(ctx, m, c, req, handler)
	}
	return nil, i.fail(ctx, ledger.Errorf(ledger.CodeInternal, "the ledger's answer to Begin is neither a claim nor a replay"))
}

// key is the request field's key (WithKeyField) or the header's.
func (i *interceptor) key(ctx context.Context, msg proto.Message) string {
	if i.opts.keyField != "" {
		if k := protofield.String(msg, i.opts.keyField); k != "" {
			return k
		}
	}
	if v := metadata.ValueFromIncomingContext(ctx, KeyHeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

func firstAttempt(ctx context.Context) (*timestamppb.Timestamp, error) {
	v := metadata.ValueFromIncomingContext(ctx, FirstAttemptHeader)
	if len(v) == 0 || v[0] == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v[0])
	if err != nil {
		return nil, ledger.Errorf(ledger.CodeValidationFailed, "the %s header is not an RFC 3339 time", FirstAttemptHeader)
	}
	return timestamppb.New(t), nil
}

// beginError is what the caller hears when Begin fails: the ledger's typed
// error as it is, except that an unreachable ledger is UNAVAILABLE (fail
// closed) and the write service's own credential problems are INTERNAL.
func (i *interceptor) beginError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ledger.Wrap(ledger.CodeUpstreamTimeout, err, "the call ended before the ledger answered")
	}
	le := ledgerstatus.FromError(err)
	if !ledgerstatus.IsTyped(err) || le.Code == ledger.CodeUnavailable {
		// Fail closed, with one answer whatever the path: the connection
		// failed (untyped), the stream client could not reach the ledger,
		// or the ledger could not reach its store.
		i.opts.log.WarnContext(ctx, "idempotency ledger unreachable: failing closed", "error", err)
		return &ledger.Error{Code: ledger.CodeUnavailable, Message: "the idempotency ledger is unreachable", RetryAfter: max(unreachableRetryAfter, le.RetryAfter), Err: err}
	}
	if le.Code == ledger.CodeUnauthenticated {
		i.opts.log.ErrorContext(ctx, "the idempotency ledger refused this service's credentials", "error", err)
		return ledger.Wrap(ledger.CodeInternal, err, "internal error")
	}
	return le
}

func (i *interceptor) fail(ctx context.Context, err error) error {
	le := ledger.AsError(err)
	ledgerstatus.SetPushback(ctx, le)
	return ledgerstatus.Err(le)
}

// replay returns the stored outcome as the method's response or error.
func (i *interceptor) replay(ctx context.Context, m *method, r *ledgerv1.Replay) (any, error) {
	_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
	switch o := r.GetOutcome().GetResult().(type) {
	case *ledgerv1.Outcome_Response:
		want := m.output.Descriptor().FullName()
		if got := o.Response.GetTypeUrl(); got[strings.LastIndexByte(got, '/')+1:] != string(want) {
			i.opts.log.ErrorContext(ctx, "stored response of another type", "stored", got, "want", want)
			return nil, i.fail(ctx, ledger.Errorf(ledger.CodeInternal, "internal error"))
		}
		resp := m.output.New().Interface()
		if err := proto.Unmarshal(o.Response.GetValue(), resp); err != nil {
			i.opts.log.ErrorContext(ctx, "stored response does not parse", "error", err)
			return nil, i.fail(ctx, ledger.Errorf(ledger.CodeInternal, "internal error"))
		}
		return resp, nil
	case *ledgerv1.Outcome_Status:
		s := o.Status
		err := ledgerstatus.FromFields(s).Err()
		ledgerstatus.SetPushback(ctx, ledgerstatus.FromError(err))
		return nil, err
	}
	return nil, i.fail(ctx, ledger.Errorf(ledger.CodeInternal, "the ledger replayed an empty outcome"))
}

// run runs the handler under the claim and records its outcome.
func (i *interceptor) run(ctx context.Context, m *method, c Claim, req any, handler grpc.UnaryHandler) (any, error) {
	hctx, cancel := context.WithCancelCause(withClaim(ctx, c))
	defer cancel(nil)
	stop := i.keepAlive(ctx, cancel, m, c)
	panicked := true
	defer func() {
		stop()
		if panicked {
			// No Complete, no Release: the lease runs out and the next
			// attempt takes over with a higher token.
			i.opts.log.WarnContext(ctx, "handler panicked under a claim; its lease will run out", "key", c.Key, "token", c.Token)
		}
	}()
	resp, herr := handler(hctx, req)
	panicked = false
	stop()
	lost := errors.Is(context.Cause(hctx), errLeaseLost)
	if herr == nil {
		out, err := responseOutcome(resp)
		if err != nil {
			i.opts.log.ErrorContext(ctx, "the handler's response cannot be stored; its lease will run out", "error", err)
			return nil, i.fail(ctx, ledger.Errorf(ledger.CodeInternal, "internal error"))
		}
		i.complete(ctx, c, out)
		return resp, nil
	}
	if lost {
		return nil, i.fail(ctx, &ledger.Error{Code: ledger.CodeInProgress, Message: "another attempt took over this key", RetryAfter: 100 * time.Millisecond})
	}
	st := toStatus(herr)
	if transient(herr, st) {
		_ = i.record(ctx, "release", c, func(ctx context.Context) error {
			_, err := i.ledger.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: c.Tenant, Key: c.Key, Token: c.Token})
			return err
		})
		return nil, herr
	}
	i.complete(ctx, c, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: ledgerstatus.ToStored(st)}})
	return nil, herr
}

// complete stores the attempt's outcome. An outcome the ledger cannot keep
// (larger than the limit, or refused for good) is replaced by a small
// stored error that says the call ran and its answer was not kept: every
// retry gets that error, permanent, and the write never runs twice.
func (i *interceptor) complete(ctx context.Context, c Claim, out *ledgerv1.Outcome) {
	send := func(out *ledgerv1.Outcome) error {
		return i.record(ctx, "complete", c, func(ctx context.Context) error {
			_, err := i.ledger.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: c.Tenant, Key: c.Key, Token: c.Token, Outcome: out})
			return err
		})
	}
	size := proto.Size(out)
	if size > i.opts.maxOutcomeBytes {
		_ = send(notKept(ledger.CodeOutcomeTooLarge, size, i.opts.maxOutcomeBytes))
		return
	}
	err := send(out)
	le := ledgerstatus.FromError(err)
	if err == nil || le.Retryable() || le.Code == ledger.CodeLeaseLost {
		return
	}
	code := ledger.CodeInternal
	if le.Code == ledger.CodeOutcomeTooLarge {
		code = ledger.CodeOutcomeTooLarge
	}
	_ = send(notKept(code, size, i.opts.maxOutcomeBytes))
}

// notKept is the outcome stored in place of one the ledger cannot keep.
func notKept(code ledger.Code, size, limit int) *ledgerv1.Outcome {
	msg := fmt.Sprintf("the call ran, but its answer (%d bytes) could not be stored, so it cannot be replayed: do not retry this intent", size)
	if code == ledger.CodeOutcomeTooLarge {
		msg = fmt.Sprintf("the call ran, but its answer (%d bytes) is larger than the idempotency ledger keeps (%d bytes), so it cannot be replayed: do not retry this intent", size, limit)
	}
	st := ledgerstatus.Encode(&ledger.Error{Code: code, Message: msg, Metadata: map[string]string{
		"applied": "true", "sizeBytes": strconv.Itoa(size), "limitBytes": strconv.Itoa(limit),
	}})
	return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: ledgerstatus.ToStored(st)}}
}

// record runs a Complete or Release detached from the caller's context,
// with its own timeout, retried on retryable answers. Failures are logged
// (the caller already has its answer) and returned.
func (i *interceptor) record(ctx context.Context, what string, c Claim, call func(context.Context) error) error {
	ctx = context.WithoutCancel(ctx)
	for try := 1; ; try++ {
		cctx, cancel := context.WithTimeout(ctx, i.opts.completeTimeout)
		err := call(cctx)
		cancel()
		if err == nil {
			return nil
		}
		le := ledgerstatus.FromError(err)
		if !le.Retryable() || try >= i.opts.completeTries {
			msg := "idempotency " + what + " failed: the record stays in progress until its lease runs out"
			if le.Code == ledger.CodeLeaseLost {
				msg = "idempotency " + what + " fenced: another attempt took over while the handler ran"
			}
			i.opts.log.ErrorContext(ctx, msg, "key", c.Key, "tenant", c.Tenant, "token", c.Token, "code", le.Code.String(), "error", err)
			return err
		}
		time.Sleep(max(le.RetryAfter, backoff.FullJitter(20*time.Millisecond, time.Second, try+1)))
	}
}

// keepAlive extends the lease every half lease while the handler runs; if
// another attempt took over, it cancels the handler's context with
// errLeaseLost. stop ends it and waits for it.
func (i *interceptor) keepAlive(ctx context.Context, cancel context.CancelCauseFunc, m *method, c Claim) (stop func()) {
	lease := m.policy.Lease
	if lease <= 0 {
		lease = time.Until(c.LeaseExpiresAt)
	}
	if lease <= 0 {
		return func() {}
	}
	ctx = context.WithoutCancel(ctx) // a caller who hangs up does not end the handler's lease
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
			_, err := i.ledger.Extend(ectx, &ledgerv1.ExtendRequest{Tenant: c.Tenant, Key: c.Key, Token: c.Token, Lease: m.lease})
			cancelCall()
			if err == nil {
				continue
			}
			if ledgerstatus.FromError(err).Code == ledger.CodeLeaseLost {
				i.opts.log.WarnContext(ctx, "lease lost while the handler ran: canceling it", "key", c.Key, "token", c.Token)
				cancel(errLeaseLost)
				return
			}
			i.opts.log.WarnContext(ctx, "lease extension failed; trying again", "key", c.Key, "error", err)
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

// responseOutcome stores a response as its deterministic encoding.
func responseOutcome(resp any) (*ledgerv1.Outcome, error) {
	msg, ok := resp.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("idempotency: the response %T is not a protobuf message", resp)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, err
	}
	packed := &anypb.Any{TypeUrl: "type.googleapis.com/" + string(msg.ProtoReflect().Descriptor().FullName()), Value: b}
	return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: packed}}, nil
}

// toStatus is the status gRPC sends for a handler's error.
func toStatus(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// transient reports whether a handler's error means it applied nothing and
// a retry should run afresh: a typed error's retryable flag, or, untyped,
// UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED and CANCELED.
// Every other error is permanent and replayed.
func transient(err error, st *status.Status) bool {
	if ledgerstatus.IsTyped(err) {
		return ledgerstatus.FromError(err).Retryable()
	}
	switch st.Code() {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

func optionalDuration(d time.Duration) *durationpb.Duration {
	if d <= 0 {
		return nil
	}
	return durationpb.New(d)
}
