// Package idemclient is the client side of idempotent calls: one
// idempotency key per intent, reused by every retry of that intent, and a
// retry interceptor that retries only what the ledger's taxonomy says is
// retryable.
//
// The rule: mint a key when the intent forms (NewKey, or WithIntent), reuse
// it on every retry, mint a new one for a new intent. A call made without a
// key in its context gets a key of its own, shared by the interceptor's
// retries of that call only.
//
// gRPC's own retry policy (the service config's retryPolicy) must stay off
// for these methods: it retries on codes alone, ignores the typed
// retryable flag and the server's retry-after beyond the pushback trailer,
// and stacks with this interceptor's attempts.
package idemclient

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemledger/idemledger/interceptors/internal/grpcmeta"
	"github.com/idemledger/idemledger/interceptors/internal/protofield"
	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// NewKey returns a fresh idempotency key: a UUIDv7 (random, and ordered by
// the time it was minted, which keeps database indexes compact).
func NewKey() string { return uuid.Must(uuid.NewV7()).String() }

type intent struct {
	key   string
	first time.Time
}

type intentKey struct{}

// WithKey returns a context whose calls carry key, and the time of the
// intent's first attempt (now), so that every retry made with it, by this
// interceptor or by the caller, is the same intent.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, intentKey{}, intent{key: key, first: time.Now()})
}

// WithIntent is WithKey(ctx, NewKey()).
func WithIntent(ctx context.Context) context.Context { return WithKey(ctx, NewKey()) }

// KeyFromContext returns the key attached by WithKey.
func KeyFromContext(ctx context.Context) (string, bool) {
	in, ok := ctx.Value(intentKey{}).(intent)
	return in.key, ok
}

// Option configures the interceptor.
type Option func(*options)

type options struct {
	maxAttempts uint
	base, cap   time.Duration
	keyField    protoreflect.Name
	methods     map[string]bool // nil: every method
}

// WithMaxAttempts caps the attempts of one call, the first included: 5.
func WithMaxAttempts(n uint) Option { return func(o *options) { o.maxAttempts = max(n, 1) } }

// WithBackoff shapes the wait between attempts: full jitter over base
// doubled per retry, capped at limit (50 ms, 5 s), and never less than the
// server's retry-after.
func WithBackoff(base, limit time.Duration) Option {
	return func(o *options) { o.base, o.cap = base, limit }
}

// WithKeyField also puts the key in a top-level string field of the request
// (AIP-155: "request_id") when that field is empty, and takes the key from
// it when the caller set it. The request message is modified in place.
func WithKeyField(name protoreflect.Name) Option { return func(o *options) { o.keyField = name } }

// WithMethods limits the interceptor to these full method names; by default
// it handles every method of the connection.
func WithMethods(fullMethods ...string) Option {
	return func(o *options) {
		o.methods = map[string]bool{}
		for _, m := range fullMethods {
			o.methods[m] = true
		}
	}
}

// UnaryClientInterceptor attaches the intent's key (and its first attempt's
// time) to every attempt of a call and retries, on go-grpc-middleware's
// retry interceptor, the errors ledgerstatus types as retryable: typed
// errors by their flag, foreign statuses by their code (UNAVAILABLE,
// RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED). It waits at least the
// server's retry-after, caps the attempts, and stops when the context ends
// (the call then fails with the context's error). A retry-after longer than
// the time left before the context's deadline is not waited out: the call
// returns that typed error at once. It is safe for concurrent use.
func UnaryClientInterceptor(opts ...Option) grpc.UnaryClientInterceptor {
	o := options{maxAttempts: 5, base: 50 * time.Millisecond, cap: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	retrying := retry.UnaryClientInterceptor(retry.WithMax(o.maxAttempts))
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if o.methods != nil && !o.methods[method] {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		in, ok := ctx.Value(intentKey{}).(intent)
		if !ok {
			in = intent{key: NewKey(), first: time.Now()}
		}
		if msg, ok := req.(proto.Message); ok && o.keyField != "" {
			in.key = keyField(msg, o.keyField, in.key)
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(grpcmeta.Key)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, grpcmeta.Key, in.key)
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(grpcmeta.FirstAttempt)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, grpcmeta.FirstAttempt, in.first.UTC().Format(time.RFC3339Nano))
		}
		// Per call: the retry-after of the last error, read by the backoff
		// that follows it.
		var hint time.Duration
		callOpts = append(callOpts,
			retry.WithRetriable(func(err error) bool {
				le := ledgerstatus.FromError(err)
				hint = le.RetryAfter
				if dl, ok := ctx.Deadline(); ok && hint > 0 && hint > time.Until(dl) {
					// The server's hint outlasts the deadline: the typed
					// answer now (IN_PROGRESS, retry after 2 s) tells the
					// caller more than DEADLINE_EXCEEDED would later.
					// Without a hint the backoff runs into the deadline,
					// and the call fails with the context's error, even
					// when the last answer came as the deadline passed.
					return false
				}
				return le.Retryable()
			}),
			retry.WithBackoff(func(_ context.Context, attempt uint) time.Duration {
				return max(hint, backoff.FullJitter(o.base, o.cap, int(attempt)))
			}),
		)
		return retrying(ctx, method, req, reply, cc, invoker, callOpts...)
	}
}

// keyField returns the key in msg's field, or sets the field to key when it
// is empty.
func keyField(msg proto.Message, name protoreflect.Name, key string) string {
	if v := protofield.String(msg, name); v != "" {
		return v
	}
	protofield.SetString(msg, name, key)
	return key
}
