// Package connectguard is the guard (interceptors/guard) as a connect-go
// interceptor, for the unary procedures of a service built on
// connectrpc.com/connect: its Connect, gRPC and gRPC-Web clients alike.
//
// A protected procedure is named with WithProcedure, which also names its
// response type: the interceptor answers a replay without the handler, so
// it must build the procedure's response itself. The key comes from the
// Idempotency-Key header (an sf-string or the key unquoted, as httpguard
// reads it; over gRPC the metadata of the same name) or a request field
// (WithKeyField). Errors travel as Connect errors with the same details as
// the gRPC adapter's status: ErrorDetail, ErrorInfo and RetryInfo, and
// Retry-After in the error's metadata when retryable. A replay carries
// Idempotency-Replayed: true.
package connectguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/interceptors/internal/keyheader"
	"github.com/idemledger/idemledger/interceptors/internal/protofield"
	"github.com/idemledger/idemledger/interceptors/internal/protoutcome"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// The headers the interceptor reads and writes: httpguard's, since a
// Connect call is an HTTP request.
const (
	// KeyHeader carries the idempotency key.
	KeyHeader = httpguard.KeyHeader
	// FirstAttemptHeader carries when the intent's first attempt was made
	// (RFC 3339), so that the ledger can refuse a retry past its windows.
	FirstAttemptHeader = httpguard.FirstAttemptHeader
	// ReplayedHeader is "true" on a replayed response or error.
	ReplayedHeader = httpguard.ReplayedHeader
)

// Procedure is how one unary procedure is protected.
type Procedure struct {
	// Policy is the guard's policy.
	Policy guard.Policy
}

// TenantFunc returns the tenant a request acts for. An error that is not
// a *errcode.Error fails the request with VALIDATION_FAILED.
type TenantFunc func(ctx context.Context, req connect.AnyRequest) (string, error)

// TenantFromHeader reads the tenant from a request header
// (guard.HeaderTenant).
func TenantFromHeader(name string) TenantFunc {
	return func(_ context.Context, req connect.AnyRequest) (string, error) {
		return guard.HeaderTenant(req.Header(), name)
	}
}

// Option configures an Interceptor.
type Option func(*options)

type options struct {
	procedures map[string]procedure
	tenant     TenantFunc
	keyField   protoreflect.Name
}

// procedure is a protected procedure as WithProcedure names it: its
// policy, and how to answer a stored response as its response type.
type procedure struct {
	Procedure
	output   protoreflect.FullName
	response func(b []byte) (connect.AnyResponse, error)
}

// WithProcedure protects the unary procedure ("/acme.v1.InvoiceService/CreateInvoice",
// the generated ...Procedure constant), whose response message is Res:
// connectguard.WithProcedure[invoicev1.CreateInvoiceResponse](…).
func WithProcedure[Res any, PRes interface {
	*Res
	proto.Message
}](name string, p Procedure) Option {
	return func(o *options) {
		o.procedures[name] = procedure{
			Procedure: p,
			output:    PRes(new(Res)).ProtoReflect().Descriptor().FullName(),
			response: func(b []byte) (connect.AnyResponse, error) {
				msg := new(Res)
				if err := proto.Unmarshal(b, PRes(msg)); err != nil {
					return nil, err
				}
				return connect.NewResponse(msg), nil
			},
		}
	}
}

// WithTenant sets how the tenant of a request is found. It is required.
func WithTenant(f TenantFunc) Option { return func(o *options) { o.tenant = f } }

// WithKeyField takes the key from the named string field of the request
// message when it is set, before the header; the field is left out of the
// fingerprint.
func WithKeyField(name protoreflect.Name) Option { return func(o *options) { o.keyField = name } }

// Interceptor is the guard as a connect.Interceptor. It is safe for
// concurrent use.
type Interceptor struct {
	guard *guard.Guard
	opts  options
	skip  []protoreflect.Name
}

var _ connect.Interceptor = (*Interceptor)(nil)

// New returns an Interceptor for the procedures named with WithProcedure,
// running them under g. Give it to the handlers with
// connect.WithInterceptors.
func New(g *guard.Guard, opts ...Option) (*Interceptor, error) {
	o := options{procedures: map[string]procedure{}}
	for _, opt := range opts {
		opt(&o)
	}
	if g == nil {
		return nil, errors.New("connectguard: no guard")
	}
	if o.tenant == nil {
		return nil, errors.New("connectguard: no tenant function (WithTenant)")
	}
	for name, p := range o.procedures {
		if service, method, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/"); !ok || !strings.HasPrefix(name, "/") || service == "" || method == "" {
			return nil, fmt.Errorf("connectguard: %q is not a procedure like /acme.v1.Service/Method", name)
		}
		if err := p.Policy.Check(); err != nil {
			return nil, fmt.Errorf("connectguard: %s: %w", name, err)
		}
	}
	i := &Interceptor{guard: g, opts: o}
	if o.keyField != "" {
		i.skip = []protoreflect.Name{o.keyField}
	}
	return i, nil
}

// WrapUnary protects the named unary procedures of a handler; it leaves
// clients and every other procedure alone.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		p, ok := i.opts.procedures[req.Spec().Procedure]
		if !ok || req.Spec().IsClient {
			return next(ctx, req)
		}
		return i.serve(ctx, p, req, next)
	}
}

// WrapStreamingClient leaves streaming calls alone.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler leaves streaming calls alone: only unary procedures
// can be protected.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func (i *Interceptor) serve(ctx context.Context, p procedure, req connect.AnyRequest, next connect.UnaryFunc) (connect.AnyResponse, error) {
	msg, ok := req.Any().(proto.Message)
	if !ok {
		return nil, connectError(errcode.Errorf(errcode.Internal, "the request is not a protobuf message"))
	}
	ctx = guard.Continue(ctx, propagation.HeaderCarrier(req.Header()))
	call, err := i.call(ctx, p, req, msg)
	if err != nil {
		return nil, connectError(err)
	}
	var ans protoutcome.Answer[connect.AnyResponse]
	res, err := i.guard.Do(ctx, call, protoutcome.Run(&ans, func(ctx context.Context) (connect.AnyResponse, error) { return next(ctx, req) }, typed, outcome))
	switch {
	case err != nil:
		return nil, connectError(err)
	case res.Replayed, res.Fenced:
		return i.answer(ctx, p, res.Outcome, res.Replayed)
	}
	return ans.Resp, ans.Err
}

// call is the guard's Call of req (its message msg) to procedure p: its
// key and where it came from, and for a keyed call its tenant, first
// attempt and fingerprint; how a fence's result is encoded.
func (i *Interceptor) call(ctx context.Context, p procedure, req connect.AnyRequest, msg proto.Message) (guard.Call, error) {
	procedureName := req.Spec().Procedure
	call := guard.Call{Method: procedureName, Policy: p.Policy, Encode: p.encode(procedureName)}
	var err error
	if call.Key, call.KeySource, err = i.key(req, msg); err != nil || call.Key == "" {
		return call, err
	}
	if call.Tenant, err = i.opts.tenant(ctx, req); err != nil {
		if le := (*errcode.Error)(nil); !errors.As(err, &le) {
			err = errcode.Errorf(errcode.ValidationFailed, "the request names no tenant")
		}
		return guard.Call{}, err
	}
	if v := req.Header().Get(FirstAttemptHeader); v != "" {
		if call.FirstAttemptAt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return guard.Call{}, errcode.Errorf(errcode.ValidationFailed, "the %s header is not an RFC 3339 time", FirstAttemptHeader)
		}
	}
	call.Fingerprint = fingerprint.Proto(procedureName, msg, fingerprint.ProtoOptions{
		Skip: i.skip, Resolve: fingerprint.Related(msg.ProtoReflect().Descriptor().ParentFile()),
	})
	return call, nil
}

// encode turns what a fenced handler of procedureName hands its fence
// (its response or its error) into the outcome to store.
func (p procedure) encode(procedureName string) func(any) (guard.Outcome, error) {
	return func(result any) (guard.Outcome, error) {
		switch r := result.(type) {
		case error:
			return outcome(nil, typed(r))
		case connect.AnyResponse:
			result = r.Any()
		}
		msg, ok := result.(proto.Message)
		if !ok || msg.ProtoReflect().Descriptor().FullName() != p.output {
			return guard.Outcome{}, fmt.Errorf("connectguard: a fence of %s holds a %s, not a %T", procedureName, p.output, result)
		}
		return protoutcome.Response(msg)
	}
}

// key is the request field's key (WithKeyField) or the header's.
// key is the request's key, from its key field or its Idempotency-Key
// header, and where it came from.
func (i *Interceptor) key(req connect.AnyRequest, msg proto.Message) (key, source string, err error) {
	if i.opts.keyField != "" {
		if k := protofield.String(msg, i.opts.keyField); k != "" {
			return k, "field:" + string(i.opts.keyField), nil
		}
	}
	key, err = keyheader.Parse(KeyHeader, req.Header().Values(KeyHeader))
	if key != "" {
		source = "header"
	}
	return key, source, err
}

// answer answers a stored outcome (a replay's, a fenced run's) as the
// procedure's response or error.
func (i *Interceptor) answer(ctx context.Context, p procedure, out guard.Outcome, replayed bool) (connect.AnyResponse, error) {
	if out.Response == nil {
		ce := statusError(out.Status)
		if replayed {
			ce.Meta().Set(ReplayedHeader, "true")
		}
		return nil, ce
	}
	if got := out.Response.GetTypeUrl(); got[strings.LastIndexByte(got, '/')+1:] != string(p.output) {
		i.guard.Logger().ErrorContext(ctx, "stored response of another type", "stored", got, "want", p.output)
		return nil, connectError(errcode.Errorf(errcode.Internal, "internal error"))
	}
	resp, err := p.response(out.Response.GetValue())
	if err != nil {
		i.guard.Logger().ErrorContext(ctx, "stored response does not parse", "error", err)
		return nil, connectError(errcode.Errorf(errcode.Internal, "internal error"))
	}
	if replayed {
		resp.Header().Set(ReplayedHeader, "true")
	}
	return resp, nil
}

// outcome is a handler's result as the guard stores it: a response as its
// deterministic encoding, an error as its gRPC status, transient or not;
// an error that wraps guard.ErrOutcomeUnknown leaves the claim to run out.
func outcome(resp connect.AnyResponse, herr error) (guard.Outcome, error) {
	if errors.Is(herr, guard.ErrOutcomeUnknown) {
		return guard.Outcome{}, herr
	}
	if herr != nil {
		st := toStatus(herr)
		return guard.Outcome{Status: st, Transient: guard.Transient(st.Err())}, nil
	}
	msg, ok := resp.Any().(proto.Message)
	if !ok {
		return guard.Outcome{}, fmt.Errorf("connectguard: the response %T is not a protobuf message", resp.Any())
	}
	return protoutcome.Response(msg)
}

// toStatus is a handler's error as a gRPC status: a Connect error's code,
// message and details; a context error's code; else UNKNOWN.
func toStatus(err error) *status.Status {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		if st, ok := status.FromError(err); ok {
			return st
		}
		return status.FromContextError(err)
	}
	st := status.New(codes.Code(ce.Code()), ce.Message()) //nolint:gosec // Connect's codes are gRPC's, 1 to 16
	details := make([]*anypb.Any, 0, len(ce.Details()))
	for _, d := range ce.Details() {
		details = append(details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
	}
	if len(details) > 0 {
		p := st.Proto()
		p.Details = details
		st = status.FromProto(p)
	}
	return st
}

// connectError is a ledger or guard error as a Connect error, with the
// same details as its gRPC status, and Retry-After when retryable.
// typed is a handler's error as Connect sends it: a typed error it wraps
// (a fence's, the guard's), not a Connect error itself, as a Connect error
// with the taxonomy's details.
func typed(err error) error {
	if ce := (*connect.Error)(nil); err == nil || errors.As(err, &ce) || errors.Is(err, guard.ErrOutcomeUnknown) {
		return err
	}
	if le := (*errcode.Error)(nil); errors.As(err, &le) {
		return connectError(le)
	}
	return err
}

func connectError(err error) *connect.Error {
	le := errcode.As(err)
	ce := statusError(ledgerstatus.Encode(le))
	if le.Retryable() && le.RetryAfter > 0 {
		ce.Meta().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(le.RetryAfter.Seconds())), 10))
	}
	return ce
}

// statusError is a gRPC status as a Connect error: its code, message and
// details.
func statusError(st *status.Status) *connect.Error {
	ce := connect.NewError(connect.Code(st.Code()), errors.New(st.Message())) //nolint:gosec // gRPC's codes are Connect's
	for _, a := range st.Proto().GetDetails() {
		msg, err := a.UnmarshalNew()
		if err != nil {
			continue // a detail of a type this binary does not know
		}
		if d, err := connect.NewErrorDetail(msg); err == nil {
			ce.AddDetail(d)
		}
	}
	return ce
}
