package grpcguard

import (
	"context"
	"fmt"

	"github.com/idemledger/idemledger/interceptors/internal/grpcmeta"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/internal/protofield"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Header names the interceptor reads and writes.
const (
	// KeyHeader carries the idempotency key.
	KeyHeader = grpcmeta.Key
	// FirstAttemptHeader carries when the intent's first attempt was made
	// (RFC 3339), so that a retry older than the retention window is
	// refused (RETRY_TOO_LATE) rather than run a second time.
	FirstAttemptHeader = grpcmeta.FirstAttempt
	// ReplayedHeader is set to "true" on replayed responses.
	ReplayedHeader = grpcmeta.Replayed
)

// Method is how one gRPC method is protected: the guard's policy, and
// the method's own reconcile function.
type Method struct {
	// Policy is the guard's policy for the method.
	Policy guard.Policy
	// Reconcile, when set, is asked before a takeover (attempt > 1) runs
	// the handler whether the earlier attempt's write landed.
	Reconcile ReconcileFunc
}

// ReconcileFunc says whether an earlier attempt of the claim in ctx
// (guard.ClaimFromContext) applied its write, by looking in the service's
// own database by key or token: the response that write answered when it
// landed, nil when it did not (the handler then runs), or an error when
// it cannot tell (the call fails UNAVAILABLE, retryable, and the claim is
// left to run out). req is the call's request.
type ReconcileFunc func(ctx context.Context, req proto.Message) (proto.Message, error)

// TenantFunc returns the tenant a call acts for. An error that is not a
// *errcode.Error fails the call with VALIDATION_FAILED.
type TenantFunc func(ctx context.Context, req proto.Message) (string, error)

// TenantFromField reads the tenant from a top-level string field of the
// request.
func TenantFromField(name protoreflect.Name) TenantFunc {
	return func(_ context.Context, req proto.Message) (string, error) {
		if s := protofield.String(req, name); s != "" {
			return s, nil
		}
		return "", errcode.Errorf(errcode.ValidationFailed, "the request has no %s", name)
	}
}

// TenantFromHeader reads the tenant from an incoming metadata header.
func TenantFromHeader(name string) TenantFunc {
	return func(ctx context.Context, _ proto.Message) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", errcode.Errorf(errcode.ValidationFailed, "the call has no %s header", name)
	}
}

// Option configures the interceptor.
type Option func(*options)

type options struct {
	methods  map[string]Method
	tenant   TenantFunc
	keyField protoreflect.Name
	files    *protoregistry.Files
	types    *protoregistry.Types
	registry bool // WithRegistry was given: it also resolves the Anys of requests
}

func defaultOptions() options {
	return options{
		methods: map[string]Method{},
		tenant:  TenantFromField("tenant"),
		files:   protoregistry.GlobalFiles,
		types:   protoregistry.GlobalTypes,
	}
}

// WithMethod protects the method named by its full gRPC name
// ("/billing.v1.InvoiceService/CreateInvoice") as m says. Methods not
// named pass through untouched.
func WithMethod(fullMethod string, m Method) Option {
	return func(o *options) { o.methods[fullMethod] = m }
}

// WithTenant sets how the tenant is found; by default it is the request's
// top-level "tenant" field.
func WithTenant(f TenantFunc) Option { return func(o *options) { o.tenant = f } }

// WithKeyField takes the key from a top-level string field of the request
// (AIP-155: "request_id") when it is set, and from the idempotency-key
// header otherwise. The field is left out of the fingerprint. By default
// the key comes from the header only.
func WithKeyField(name protoreflect.Name) Option { return func(o *options) { o.keyField = name } }

// WithRegistry resolves methods and response types in files and types
// instead of the global registries, and the Anys of requests, for the
// fingerprint, in types. Without it, a request's Anys are resolved among
// the messages of the request's own file and its imports, so that the
// fingerprint never depends on which unrelated types a binary links.
func WithRegistry(files *protoregistry.Files, types *protoregistry.Types) Option {
	return func(o *options) { o.files, o.types, o.registry = files, types, true }
}

func (o *options) check() error {
	if o.tenant == nil {
		return fmt.Errorf("grpcguard: no tenant function")
	}
	for name, m := range o.methods {
		if err := m.Policy.Check(); err != nil {
			return fmt.Errorf("grpcguard: %s: %w", name, err)
		}
	}
	return nil
}
