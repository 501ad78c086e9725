package grpcguard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/internal/protofield"
	"github.com/idemledger/idemledger/interceptors/internal/protoutcome"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

type interceptor struct {
	guard   *guard.Guard
	opts    options
	methods map[string]*method
	skip    []protoreflect.Name // left out of the fingerprint: the key field
}

// method is a protected method, resolved at build time.
type method struct {
	policy    guard.Policy
	reconcile ReconcileFunc
	output    protoreflect.MessageType
	print     fingerprint.ProtoOptions // the skip list and the resolver of Anys
}

// UnaryServerInterceptor returns the interceptor that runs the methods
// named with WithMethod under g. Every protected
// method must resolve, in the registry (WithRegistry; the global one by
// default), to a unary method whose response type is registered, or it
// returns an error and no interceptor.
//
// The interceptor is safe for concurrent use. Its errors are statuses typed
// by ledgerstatus: KEY_MISSING, KEY_INVALID and VALIDATION_FAILED for a bad
// call, the ledger's IN_PROGRESS, KEY_REUSED, KEY_EXPIRED,
// OUTCOME_UNKNOWN, RETRY_TOO_LATE and RATE_LIMITED as they come,
// UNAVAILABLE when the ledger cannot be reached.
func UnaryServerInterceptor(g *guard.Guard, opts ...Option) (grpc.UnaryServerInterceptor, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if g == nil {
		return nil, errors.New("grpcguard: no guard")
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	i := &interceptor{guard: g, opts: o, methods: map[string]*method{}}
	if o.keyField != "" {
		i.skip = []protoreflect.Name{o.keyField}
	}
	for name, m := range o.methods {
		in, out, err := o.resolve(name)
		if err != nil {
			return nil, err
		}
		prints := fingerprint.ProtoOptions{Skip: i.skip, Resolve: fingerprint.Related(in.ParentFile())}
		if o.registry {
			prints.Resolve = fingerprint.FromTypes(o.types)
		}
		i.methods[name] = &method{policy: m.Policy, reconcile: m.Reconcile, output: out, print: prints}
	}
	return i.intercept, nil
}

// resolve finds the request's descriptor and the response type of a unary
// method by its full name.
func (o *options) resolve(fullMethod string) (protoreflect.MessageDescriptor, protoreflect.MessageType, error) {
	service, name, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok || !strings.HasPrefix(fullMethod, "/") || name == "" || strings.Contains(name, "/") {
		return nil, nil, fmt.Errorf("grpcguard: %q is not a full method name like /pkg.Service/Method", fullMethod)
	}
	d, err := o.files.FindDescriptorByName(protoreflect.FullName(service))
	if err != nil {
		return nil, nil, fmt.Errorf("grpcguard: %s: service not in the registry: %w", fullMethod, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, nil, fmt.Errorf("grpcguard: %s: %s is not a service", fullMethod, service)
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return nil, nil, fmt.Errorf("grpcguard: %s: no such method", fullMethod)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, nil, fmt.Errorf("grpcguard: %s: only unary methods can be protected", fullMethod)
	}
	out, err := o.types.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil, nil, fmt.Errorf("grpcguard: %s: response type %s not in the registry: %w", fullMethod, md.Output().FullName(), err)
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
		return nil, i.fail(ctx, errcode.Errorf(errcode.Internal, "the request is not a protobuf message"))
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = guard.Continue(ctx, metadataCarrier(md))
	call, err := i.call(ctx, m, info.FullMethod, msg)
	if err != nil {
		return nil, i.fail(ctx, err)
	}
	var ans protoutcome.Answer[any]
	res, err := i.guard.Do(ctx, call, protoutcome.Run(&ans, func(ctx context.Context) (any, error) { return handler(ctx, req) }, typed, outcome))
	switch {
	case err != nil:
		return nil, i.fail(ctx, err)
	case res.Replayed:
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedHeader, "true"))
		return i.answer(ctx, m, res.Outcome)
	case res.Fenced:
		return i.answer(ctx, m, res.Outcome) // the outcome its fence holds
	}
	return ans.Resp, ans.Err
}

// call is the guard's Call of a request msg to fullMethod: its key and
// where it came from, and for a keyed call its tenant, first attempt and
// fingerprint; how a takeover reconciles and how a fence's result is
// encoded.
func (i *interceptor) call(ctx context.Context, m *method, fullMethod string, msg proto.Message) (guard.Call, error) {
	call := guard.Call{Method: fullMethod, Policy: m.policy, Encode: m.encode(fullMethod)}
	call.Key, call.KeySource = i.key(ctx, msg)
	if call.Key != "" {
		tenant, err := i.opts.tenant(ctx, msg)
		if err != nil {
			if le := (*errcode.Error)(nil); !errors.As(err, &le) {
				err = errcode.Errorf(errcode.ValidationFailed, "the call names no tenant")
			}
			return guard.Call{}, err
		}
		if call.FirstAttemptAt, err = firstAttempt(ctx); err != nil {
			return guard.Call{}, err
		}
		call.Tenant = tenant
		call.Fingerprint = fingerprint.Proto(fullMethod, msg, m.print)
	}
	if m.reconcile != nil {
		call.Reconcile = func(ctx context.Context) (*guard.Outcome, error) {
			resp, err := m.reconcile(ctx, msg)
			if err != nil || resp == nil {
				return nil, err
			}
			if got := resp.ProtoReflect().Descriptor().FullName(); got != m.output.Descriptor().FullName() {
				return nil, fmt.Errorf("grpcguard: reconcile returned a %s, want a %s", got, m.output.Descriptor().FullName())
			}
			out, err := outcome(resp, nil)
			return &out, err
		}
	}
	return call, nil
}

// encode turns what a fenced handler of fullMethod hands its fence (its
// response or its error) into the outcome to store.
func (m *method) encode(fullMethod string) func(any) (guard.Outcome, error) {
	return func(result any) (guard.Outcome, error) {
		if err, ok := result.(error); ok {
			return outcome(nil, typed(err))
		}
		if msg, ok := result.(proto.Message); ok && msg.ProtoReflect().Descriptor().FullName() != m.output.Descriptor().FullName() {
			return guard.Outcome{}, fmt.Errorf("grpcguard: a fence of %s holds a %s, not a %s", fullMethod, m.output.Descriptor().FullName(), msg.ProtoReflect().Descriptor().FullName())
		}
		return outcome(result, nil)
	}
}

// key is the request field's key (WithKeyField) or the header's.
// key is the call's key, from the request's key field or its metadata,
// and where it came from.
func (i *interceptor) key(ctx context.Context, msg proto.Message) (key, source string) {
	if i.opts.keyField != "" {
		if k := protofield.String(msg, i.opts.keyField); k != "" {
			return k, "field:" + string(i.opts.keyField)
		}
	}
	if v := metadata.ValueFromIncomingContext(ctx, KeyHeader); len(v) > 0 {
		return v[0], "metadata"
	}
	return "", ""
}

func firstAttempt(ctx context.Context) (time.Time, error) {
	v := metadata.ValueFromIncomingContext(ctx, FirstAttemptHeader)
	if len(v) == 0 || v[0] == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v[0])
	if err != nil {
		return time.Time{}, errcode.Errorf(errcode.ValidationFailed, "the %s header is not an RFC 3339 time", FirstAttemptHeader)
	}
	return t, nil
}

func (i *interceptor) fail(ctx context.Context, err error) error {
	le := errcode.As(err)
	ledgerstatus.SetPushback(ctx, le)
	return ledgerstatus.Err(le)
}

// answer returns a stored outcome (a replay's, a fenced run's) as the
// method's response or error.
func (i *interceptor) answer(ctx context.Context, m *method, out guard.Outcome) (any, error) {
	if out.Response == nil {
		err := out.Status.Err()
		ledgerstatus.SetPushback(ctx, ledgerstatus.FromError(err))
		return nil, err
	}
	want := m.output.Descriptor().FullName()
	if got := out.Response.GetTypeUrl(); got[strings.LastIndexByte(got, '/')+1:] != string(want) {
		i.guard.Logger().ErrorContext(ctx, "stored response of another type", "stored", got, "want", want)
		return nil, i.fail(ctx, errcode.Errorf(errcode.Internal, "internal error"))
	}
	resp := m.output.New().Interface()
	if err := proto.Unmarshal(out.Response.GetValue(), resp); err != nil {
		i.guard.Logger().ErrorContext(ctx, "stored response does not parse", "error", err)
		return nil, i.fail(ctx, errcode.Errorf(errcode.Internal, "internal error"))
	}
	return resp, nil
}

// outcome is a handler's result as the guard stores it: a response as its
// deterministic encoding, an error as its status, transient or not; an
// error that wraps guard.ErrOutcomeUnknown leaves the claim to run out.
func outcome(resp any, herr error) (guard.Outcome, error) {
	if errors.Is(herr, guard.ErrOutcomeUnknown) {
		return guard.Outcome{}, herr
	}
	if herr != nil {
		st := toStatus(herr)
		return guard.Outcome{Status: st, Transient: guard.Transient(herr)}, nil
	}
	msg, ok := resp.(proto.Message)
	if !ok {
		return guard.Outcome{}, fmt.Errorf("grpcguard: the response %T is not a protobuf message", resp)
	}
	return protoutcome.Response(msg)
}

// typed is a handler's error as gRPC sends it: a typed error it wraps
// (a fence's, the guard's) as its status with the taxonomy's details.
func typed(err error) error {
	if _, ok := status.FromError(err); ok || err == nil || errors.Is(err, guard.ErrOutcomeUnknown) {
		return err
	}
	if le := (*errcode.Error)(nil); errors.As(err, &le) {
		return ledgerstatus.Err(le)
	}
	return err
}

// toStatus is the status gRPC sends for a handler's error.
func toStatus(err error) *status.Status {
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// metadataCarrier reads a trace context from incoming gRPC metadata.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
