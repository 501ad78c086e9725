package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/protofield"
	"github.com/idemledger/idemledger/ledger"
)

// Header names the interceptor reads and writes.
const (
	// KeyHeader carries the idempotency key.
	KeyHeader = "idempotency-key"
	// FirstAttemptHeader carries when the intent's first attempt was made
	// (RFC 3339), so that a retry older than the retention window is
	// refused (RETRY_TOO_LATE) rather than run a second time.
	FirstAttemptHeader = "idempotency-first-attempt-at"
	// ReplayedHeader is set to "true" on replayed responses.
	ReplayedHeader = "idempotency-replayed"
)

// Policy is how one method is protected.
type Policy struct {
	// Lease is how long an attempt holds the key before another may take
	// over; 0 means the ledger's default (30 s). The interceptor extends it
	// while the handler runs past half of it.
	Lease time.Duration
	// Retention is how long the outcome is kept for replays; 0 means the
	// ledger's default (24 h).
	Retention time.Duration
	// TombstoneRetention is how long a completed record is kept as a
	// tombstone after Retention (a retry then gets KEY_EXPIRED, never a
	// second run); 0 means the ledger's default (7 days).
	TombstoneRetention time.Duration
	// NoTombstones turns tombstones off for the method.
	NoTombstones bool
	// KeyOptional lets calls without a key through, unprotected; by default
	// they fail with KEY_MISSING.
	KeyOptional bool
	// OnInProgress is what a duplicate gets while the first attempt runs:
	// Reject (this interceptor's default: IN_PROGRESS at once, with a
	// retry-after) or Wait (the first attempt's outcome, replayed).
	OnInProgress InProgress
	// MaxWait bounds a duplicate's wait under Wait, besides the caller's
	// deadline; 0 means 10 s.
	MaxWait time.Duration
	// OnLeaseExpiry is what happens when an attempt's lease runs out with
	// no outcome: Takeover (the default: the next attempt runs with a
	// higher token) or Hold (the record turns OUTCOME_UNKNOWN and nothing
	// runs again until someone resolves it).
	OnLeaseExpiry LeaseExpiry
	// Reconcile, when set, is asked before a takeover (attempt > 1) runs
	// the handler whether the earlier attempt's write landed.
	Reconcile ReconcileFunc
}

// InProgress is what a duplicate gets while the first attempt runs.
type InProgress = guard.InProgress

// The in-progress policies.
const (
	Wait   = guard.Wait
	Reject = guard.Reject
)

// LeaseExpiry is what happens when an attempt's lease runs out.
type LeaseExpiry = ledger.LeaseExpiry

// The lease-expiry policies.
const (
	Takeover = ledger.Takeover
	Hold     = ledger.Hold
)

// ReconcileFunc says whether an earlier attempt of the claim in ctx
// (ClaimFromContext) applied its write, by looking in the service's own
// database by key or token: the response that write answered when it
// landed, nil when it did not (the handler then runs), or an error when
// it cannot tell (the call fails UNAVAILABLE, retryable, and the claim is
// left to run out). req is the call's request.
type ReconcileFunc func(ctx context.Context, req proto.Message) (proto.Message, error)

// guardPolicy is the policy as the guard runs it, with this adapter's
// default: Reject.
func (p Policy) guardPolicy() guard.Policy {
	g := guard.Policy{
		Lease: p.Lease, Retention: p.Retention,
		TombstoneRetention: p.TombstoneRetention, NoTombstones: p.NoTombstones,
		KeyOptional: p.KeyOptional, OnInProgress: p.OnInProgress, MaxWait: p.MaxWait,
		OnLeaseExpiry: p.OnLeaseExpiry,
	}
	if g.OnInProgress == guard.DefaultInProgress {
		g.OnInProgress = guard.Reject
	}
	return g
}

// TenantFunc returns the tenant a call acts for. An error that is not a
// *ledger.Error fails the call with VALIDATION_FAILED.
type TenantFunc func(ctx context.Context, req proto.Message) (string, error)

// TenantFromField reads the tenant from a top-level string field of the
// request.
func TenantFromField(name protoreflect.Name) TenantFunc {
	return func(_ context.Context, req proto.Message) (string, error) {
		if s := protofield.String(req, name); s != "" {
			return s, nil
		}
		return "", ledger.Errorf(ledger.CodeValidationFailed, "the request has no %s", name)
	}
}

// TenantFromHeader reads the tenant from an incoming metadata header.
func TenantFromHeader(name string) TenantFunc {
	return func(ctx context.Context, _ proto.Message) (string, error) {
		if v := metadata.ValueFromIncomingContext(ctx, name); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", ledger.Errorf(ledger.CodeValidationFailed, "the call has no %s header", name)
	}
}

// Option configures the interceptor.
type Option func(*options)

type options struct {
	methods         map[string]Policy
	tenant          TenantFunc
	keyField        protoreflect.Name
	files           *protoregistry.Files
	types           *protoregistry.Types
	registry        bool // WithRegistry was given: it also resolves the Anys of requests
	completeTimeout time.Duration
	completeTries   int
	maxOutcomeBytes int
	log             *slog.Logger
}

func defaultOptions() options {
	return options{
		methods:         map[string]Policy{},
		tenant:          TenantFromField("tenant"),
		files:           protoregistry.GlobalFiles,
		types:           protoregistry.GlobalTypes,
		completeTimeout: 5 * time.Second,
		completeTries:   3,
		maxOutcomeBytes: ledger.DefaultMaxOutcomeBytes,
		log:             slog.New(slog.DiscardHandler),
	}
}

// WithMethod protects the method named by its full gRPC name
// ("/billing.v1.InvoiceService/CreateInvoice") with policy p. Methods not
// named pass through untouched.
func WithMethod(fullMethod string, p Policy) Option {
	return func(o *options) { o.methods[fullMethod] = p }
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

// WithCompletion sets the timeout of each Complete or Release call (5 s)
// and how many times one is tried (3) when the ledger answers a retryable
// error.
func WithCompletion(timeout time.Duration, tries int) Option {
	return func(o *options) { o.completeTimeout, o.completeTries = timeout, tries }
}

// WithMaxOutcomeBytes sets the largest outcome the interceptor asks the
// ledger to store (1 MiB, the ledger's default; set it to ledgerd's
// --max-outcome-bytes). A larger one is not sent: the caller of that
// attempt gets its answer, and the record is completed with a small
// OUTCOME_TOO_LARGE error that every retry gets, so the write never runs
// twice.
func WithMaxOutcomeBytes(n int) Option { return func(o *options) { o.maxOutcomeBytes = n } }

// WithLogger logs what the caller cannot be told: a Complete or Release
// that failed, a lease lost while the handler ran. nil discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.log = l
		}
	}
}

func (o *options) check() error {
	if o.tenant == nil {
		return fmt.Errorf("idempotency: no tenant function")
	}
	if o.maxOutcomeBytes <= 0 {
		return fmt.Errorf("idempotency: the largest outcome must be positive")
	}
	if o.completeTimeout <= 0 || o.completeTries <= 0 {
		return fmt.Errorf("idempotency: the completion timeout and tries must be positive")
	}
	for m, p := range o.methods {
		if err := p.guardPolicy().Check(); err != nil {
			return fmt.Errorf("idempotency: %s: %w", m, err)
		}
	}
	return nil
}
