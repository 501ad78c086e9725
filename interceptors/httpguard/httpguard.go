// Package httpguard makes HTTP write routes idempotent through the
// idemledger LedgerService, as draft-ietf-httpapi-idempotency-key-header
// describes: a net/http middleware on the guard (package guard).
//
// A protected route is named by its ServeMux pattern ("POST /v1/invoices"),
// so the ledger's method is the route, never a path with ids in it
// ("http:POST /v1/invoices"). For a request to it, the middleware takes
// the key from the Idempotency-Key header (a structured-field string, or
// a bare token), the tenant from the route's TenantFunc, reads the body
// once (up to a limit, 413 past it) and fingerprints it ("j1:" for JSON,
// "b1:" for any other body). Then:
//
//   - the first request runs the handler, with the claim in its context
//     (guard.ClaimFromContext); its status, body and an allow-list of
//     headers are stored, and every retry gets them again, byte for byte,
//     with Idempotency-Replayed: true;
//   - a status the route releases (408, 425, 429, 502, 503, 504 by
//     default) is not stored: the retry runs afresh;
//   - every ledger or guard error is an RFC 9457 problem
//     (application/problem+json) with its code, retryable and
//     retry_after_ms: 400 for a missing or malformed key, 422 for a key
//     reused with another request, 409 for a request in progress (with
//     Retry-After) and for OUTCOME_UNKNOWN, KEY_EXPIRED and RETRY_TOO_LATE,
//     503 with Retry-After when the ledger cannot be reached.
//
// The middleware must run inside the ServeMux (wrap a route's handler, or
// use Guard.Mux), where r.Pattern names the route.
package httpguard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/propagation"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/internal/keyheader"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Header names the middleware reads and writes.
const (
	// KeyHeader carries the idempotency key.
	KeyHeader = "Idempotency-Key"
	// FirstAttemptHeader, optional, says when the client first sent this
	// intent (RFC 3339), so that a retry older than the ledger's windows
	// is refused (409 RETRY_TOO_LATE) rather than run a second time.
	FirstAttemptHeader = "Idempotency-First-Attempt-At"
	// ReplayedHeader is "true" on a replayed response.
	ReplayedHeader = "Idempotency-Replayed"

	// MethodPrefix names a route's method in the ledger.
	MethodPrefix = "http:"
	// DefaultMaxBodyBytes is the largest request body read: 1 MiB.
	DefaultMaxBodyBytes = 1 << 20
)

// defaultMethods are the methods a route covers unless it says.
var defaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultStoredHeaders are the response headers stored and replayed,
// besides a route's own.
var DefaultStoredHeaders = []string{"Content-Type", "Location", "ETag", "Cache-Control"}

// DefaultRelease reports whether a status means the handler applied
// nothing and a retry should run afresh: 408, 425, 429, 502, 503, 504.
func DefaultRelease(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// Response is a stored response.
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header,omitempty"`
	Body   []byte      `json:"body,omitempty"`
}

// Route is how one route is protected.
type Route struct {
	// Policy is the guard's policy.
	Policy guard.Policy
	// Methods are the request methods the route covers; nil means POST
	// and PATCH. A pattern that names its method ("POST /v1/invoices")
	// covers that one.
	Methods []string
	// Release says which statuses are released rather than stored; nil
	// means DefaultRelease.
	Release func(status int) bool
	// StoreHeaders are response headers stored and replayed besides
	// DefaultStoredHeaders.
	StoreHeaders []string
	// Reconcile, when set, is asked on a takeover whether the earlier
	// attempt's write landed: the response it answered when it did, nil
	// when it did not, an error when it cannot tell. The claim is in the
	// request's context.
	Reconcile func(r *http.Request) (*Response, error)
	// KeyPointer, when set, is an RFC 6901 JSON Pointer into a JSON body
	// ("/idempotency_key", "/metadata/request_id"): a request without the
	// Idempotency-Key header takes its key from there, a string.
	KeyPointer string
	// FingerprintPointers, when set, name the parts of a JSON body that make
	// the request's fingerprint, the rest ignored: a retry that differs
	// elsewhere is the same request (its replay), not KEY_REUSED.
	FingerprintPointers []string
	// Stripe answers the route by Stripe's conventions as well, for
	// clients written for a Stripe-shaped API (stripe-go and the other
	// Stripe SDKs). A replay carries Idempotent-Replayed beside
	// Idempotency-Replayed, and the handler's Request-Id. Every answer of
	// the guard says Stripe-Should-Retry: false on a replay and on a
	// permanent error, whose body is a Stripe error object (a reused key
	// is 400 idempotency_error); true on a retryable one, whose body stays
	// the problem, so that a Stripe SDK retries it (it never retries a
	// Stripe error object, whatever the header says).
	Stripe bool
}

// TenantFunc returns the tenant a request acts for. An error that is not
// a *errcode.Error fails the request with VALIDATION_FAILED.
type TenantFunc func(r *http.Request) (string, error)

// Tenant is a TenantFunc for a service that acts for one tenant.
func Tenant(name string) TenantFunc {
	return func(*http.Request) (string, error) { return name, nil }
}

// TenantFromHeader reads the tenant from a request header
// (guard.HeaderTenant).
func TenantFromHeader(name string) TenantFunc {
	return func(r *http.Request) (string, error) { return guard.HeaderTenant(r.Header, name) }
}

// Option configures a Guard.
type Option func(*options)

type options struct {
	routes  map[string]Route
	tenant  TenantFunc
	maxBody int64
	maxResp int64
}

// WithRoute protects the route registered on the ServeMux with pattern.
func WithRoute(pattern string, r Route) Option { return func(o *options) { o.routes[pattern] = r } }

// WithTenant sets how the tenant of a request is found. It is required.
func WithTenant(f TenantFunc) Option { return func(o *options) { o.tenant = f } }

// WithMaxBodyBytes bounds the request bodies read (1 MiB); a larger one is
// answered 413.
func WithMaxBodyBytes(n int64) Option { return func(o *options) { o.maxBody = n } }

// defaultMaxResponseBytes is WithMaxResponseBytes's default.
const defaultMaxResponseBytes = 16 << 20

// WithMaxResponseBytes bounds the response of a protected route that the
// middleware buffers before it is stored and sent (16 MiB). Past it the
// rest is dropped, and the request, which ran, answers 409
// OUTCOME_TOO_LARGE, as does every retry: its answer was not kept.
func WithMaxResponseBytes(n int64) Option { return func(o *options) { o.maxResp = n } }

// Guard is the middleware's state. It is safe for concurrent use.
type Guard struct {
	guard  *guard.Guard
	opts   options
	routes map[string]*route
}

// route is a protected route, resolved at build time.
type route struct {
	Route
	method  string // the ledger's method without the request's HTTP method: "POST /v1/invoices" → "/v1/invoices"
	stored  []string
	release func(int) bool
}

// New returns a Guard for the routes named with WithRoute, running them
// under g.
func New(g *guard.Guard, opts ...Option) (*Guard, error) {
	o := options{routes: map[string]Route{}, maxBody: DefaultMaxBodyBytes, maxResp: defaultMaxResponseBytes}
	for _, opt := range opts {
		opt(&o)
	}
	if o.tenant == nil {
		return nil, errors.New("httpguard: no tenant function (WithTenant)")
	}
	if o.maxResp <= 0 {
		return nil, errors.New("httpguard: the response limit must be positive")
	}
	if o.maxBody <= 0 {
		return nil, errors.New("httpguard: the body limit must be positive")
	}
	if g == nil {
		return nil, errors.New("httpguard: no guard")
	}
	hg := &Guard{guard: g, opts: o, routes: map[string]*route{}}
	for pattern, r := range o.routes {
		rt, err := newRoute(pattern, r)
		if err != nil {
			return nil, fmt.Errorf("httpguard: %q: %w", pattern, err)
		}
		hg.routes[pattern] = rt
	}
	return hg, nil
}

// newRoute checks the route r of pattern and fills in its defaults.
func newRoute(pattern string, r Route) (*route, error) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "", pattern
	}
	if !strings.HasPrefix(path, "/") {
		return nil, errors.New("not a ServeMux pattern without a host, such as \"POST /v1/invoices\"")
	}
	if method != "" {
		r.Methods = []string{method}
	}
	if r.Methods == nil {
		r.Methods = defaultMethods
	}
	for _, m := range r.Methods {
		if err := ledger.ValidateMethod(MethodPrefix + m + " " + path); err != nil {
			return nil, err
		}
	}
	if err := r.Policy.Check(); err != nil {
		return nil, err
	}
	for _, ptr := range append([]string{r.KeyPointer}, r.FingerprintPointers...) {
		if err := fingerprint.CheckPointer(ptr); err != nil {
			return nil, err
		}
	}
	rt := &route{Route: r, method: path, release: r.Release, stored: append(slices.Clone(DefaultStoredHeaders), r.StoreHeaders...)}
	if r.Stripe {
		rt.stored = append(rt.stored, stripeRequestIDHeader)
	}
	if rt.release == nil {
		rt.release = DefaultRelease
	}
	return rt, nil
}

// Middleware protects next's requests to the configured routes; it must
// run inside the ServeMux, where r.Pattern is set.
func (g *Guard) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rt, ok := g.routes[r.Pattern]
		if !ok || !slices.Contains(rt.Methods, r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		g.serve(w, r, rt, next)
	})
}

// Mux serves mux with every request to a configured route protected: it
// finds the route as mux would, then lets mux serve the request.
func (g *Guard) Mux(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, pattern := mux.Handler(r)
		rt, ok := g.routes[pattern]
		if !ok || !slices.Contains(rt.Methods, r.Method) {
			mux.ServeHTTP(w, r)
			return
		}
		g.serve(w, r, rt, mux)
	})
}

// serve runs one request to a protected route under the guard.
func (g *Guard) serve(w http.ResponseWriter, r *http.Request, rt *route, next http.Handler) {
	r = r.WithContext(guard.Continue(r.Context(), propagation.HeaderCarrier(r.Header)))
	c, err := g.callOf(r, rt)
	if err != nil {
		rt.fail(w, err)
		return
	}
	var live *recorder
	res, err := g.guard.Do(r.Context(), c, g.run(w, r, next, rt, &live)) //nolint:contextcheck // an unprotected run serves the request on its own context
	switch {
	case err != nil:
		rt.fail(w, err)
	case !res.Protected:
	case res.Fenced:
		rt.answer(w, res.Outcome, false) // the outcome its fence holds
	case !res.Replayed && live != nil && !live.overflow:
		live.writeTo(w) // the first answer, every header of it
	default:
		rt.answer(w, res.Outcome, true)
	}
}

// callOf turns a request into the guard's call: its key (the header, or
// the body at the route's pointer), tenant, first attempt and
// fingerprint, reading the body at most once; a request without a key
// is a call without one (the route's policy decides).
func (g *Guard) callOf(r *http.Request, rt *route) (guard.Call, error) {
	method := MethodPrefix + r.Method + " " + rt.method
	c := guard.Call{Method: method, Policy: rt.Policy, Reconcile: rt.reconcile(r), Encode: rt.encodeFenced}
	key, err := requestKey(r)
	if err != nil {
		return c, err
	}
	if key != "" {
		c.KeySource = "header"
	}
	contentType := r.Header.Get("Content-Type")
	var body []byte
	read := false
	if key == "" && rt.KeyPointer != "" {
		if body, err = readBody(r, g.opts.maxBody); err != nil {
			return c, err
		}
		read = true
		if key, err = bodyKey(contentType, body, rt.KeyPointer); err != nil || key == "" {
			return c, err
		}
		c.KeySource = "pointer:" + rt.KeyPointer
	}
	if c.Key = key; key == "" {
		return c, nil
	}
	if c.Tenant, err = g.opts.tenant(r); err != nil {
		if le := (*errcode.Error)(nil); !errors.As(err, &le) {
			err = errcode.Errorf(errcode.ValidationFailed, "the request names no tenant")
		}
		return c, err
	}
	if v := r.Header.Get(FirstAttemptHeader); v != "" {
		if c.FirstAttemptAt, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return c, errcode.Errorf(errcode.ValidationFailed, "the %s header is not an RFC 3339 time", FirstAttemptHeader)
		}
	}
	if !read {
		if body, err = readBody(r, g.opts.maxBody); err != nil {
			return c, err
		}
	}
	c.Fingerprint, err = rt.print(method, contentType, body)
	return c, err
}

// reconcile is the route's Reconcile as the guard asks it, for request
// r; nil when the route has none.
func (rt *route) reconcile(r *http.Request) func(ctx context.Context) (*guard.Outcome, error) {
	if rt.Reconcile == nil {
		return nil
	}
	return func(ctx context.Context) (*guard.Outcome, error) {
		res, err := rt.Reconcile(r.WithContext(ctx))
		if err != nil || res == nil {
			return nil, err
		}
		out, err := encode(rt, res)
		return &out, err
	}
}

// encodeFenced is the outcome of what a fenced handler hands its fence: a
// Response.
func (rt *route) encodeFenced(result any) (guard.Outcome, error) {
	switch res := result.(type) {
	case *Response:
		return encode(rt, res)
	case Response:
		return encode(rt, &res)
	}
	return guard.Outcome{}, fmt.Errorf("httpguard: a fence holds a *httpguard.Response, not a %T", result)
}

// run is the guarded run of next for request r: unprotected and
// unbuffered without a claim; with one, next answers into a recorder
// (*live) up to the response limit, and the run's outcome is what it
// recorded.
func (g *Guard) run(w http.ResponseWriter, r *http.Request, next http.Handler, rt *route, live **recorder) guard.RunFunc {
	return func(ctx context.Context) (guard.Outcome, error) {
		if _, protected := guard.ClaimFromContext(ctx); !protected {
			next.ServeHTTP(w, r) // no key, key optional: unprotected, unbuffered
			return guard.Outcome{}, nil
		}
		rec := newRecorder(g.opts.maxResp)
		*live = rec
		unknown := new(atomic.Bool)
		next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, unknownKey{}, unknown)))
		if unknown.Load() {
			return guard.Outcome{}, guard.ErrOutcomeUnknown
		}
		if rec.overflow {
			le := &errcode.Error{Code: errcode.OutcomeTooLarge, Metadata: map[string]string{errcode.MetaApplied: "true", "limitBytes": strconv.FormatInt(g.opts.maxResp, 10)},
				Message: fmt.Sprintf("the request ran, but its response is larger than the %d bytes relayed, so it was neither sent nor kept: do not retry this intent", g.opts.maxResp)}
			return guard.Outcome{Status: ledgerstatus.Encode(le)}, nil
		}
		out, err := encode(rt, rec.response())
		if err == nil && rt.release(rec.status) {
			out.Transient = true
		}
		return out, err
	}
}

type unknownKey struct{}

// MarkOutcomeUnknown says, from a protected route's handler, that nobody
// knows whether the request's write happened (a proxy whose upstream
// hung up after the request was sent): the response is neither stored
// nor released, the claim runs out, and the client gets 503 with
// Retry-After. Outside a protected request it does nothing.
func MarkOutcomeUnknown(r *http.Request) {
	if b, ok := r.Context().Value(unknownKey{}).(*atomic.Bool); ok {
		b.Store(true)
	}
}

// requestKey is the request's key (keyheader.Parse): "" for none.
func requestKey(r *http.Request) (string, error) {
	return keyheader.Parse(KeyHeader, r.Header.Values(KeyHeader))
}

// readBody reads the body once, up to limit, and puts it back for the
// handler.
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	_ = r.Body.Close()
	if err != nil {
		return nil, errcode.Wrap(errcode.ValidationFailed, err, "the request body could not be read")
	}
	if int64(len(body)) > limit {
		return nil, &tooLarge{limit: limit}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return body, nil
}

// tooLarge is the error of a body over the limit: 413.
type tooLarge struct{ limit int64 }

func (e *tooLarge) Error() string {
	return fmt.Sprintf("the request body is larger than %d bytes", e.limit)
}

// print is the request's fingerprint: of the route's FingerprintPointers
// in a JSON body when it names them, else of the whole body.
func (rt *route) print(method, contentType string, body []byte) (string, error) {
	if len(rt.FingerprintPointers) == 0 {
		return requestPrint(method, contentType, body)
	}
	if !isJSON(contentType) {
		return "", errcode.Errorf(errcode.ValidationFailed, "the route fingerprints parts of a JSON body; the body is %q", contentType)
	}
	fp, err := fingerprint.JSONParts(method, body, rt.FingerprintPointers)
	if err != nil {
		return "", errcode.Errorf(errcode.ValidationFailed, "the body says it is JSON but is not: %v", err)
	}
	return fp, nil
}

// bodyKey is the key at the pointer in a JSON body: "" for none (KEY_MISSING
// where one is required), KEY_INVALID for a value that is not a string.
func bodyKey(contentType string, body []byte, ptr string) (string, error) {
	if !isJSON(contentType) {
		return "", nil
	}
	v, ok, err := fingerprint.Pointer(body, ptr)
	switch {
	case err != nil:
		return "", errcode.Errorf(errcode.ValidationFailed, "the body says it is JSON but is not: %v", err)
	case !ok || string(v) == "null":
		return "", nil
	}
	var key string
	if json.Unmarshal(v, &key) != nil {
		return "", errcode.Errorf(errcode.KeyInvalid, "the key at %s in the body is not a string", ptr)
	}
	return key, nil
}

// isJSON reports whether a Content-Type is JSON: application/json or +json.
func isJSON(contentType string) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// requestPrint is the fingerprint of a body: j1 for JSON, b1 otherwise.
func requestPrint(method, contentType string, body []byte) (string, error) {
	if isJSON(contentType) {
		fp, err := fingerprint.JSON(method, body)
		if err != nil {
			return "", errcode.Errorf(errcode.ValidationFailed, "the body says it is JSON but is not: %v", err)
		}
		return fp, nil
	}
	return fingerprint.Bytes(method, contentType, body), nil
}

// responseTypeURL is the type URL of a stored HTTP response.
const responseTypeURL = "type.idemledger.io/http.Response"

// encode is a response as the guard stores it: its status, its body and
// the route's allow-listed headers, as JSON.
func encode(rt *route, res *Response) (guard.Outcome, error) {
	kept := Response{Status: res.Status, Body: res.Body, Header: http.Header{}}
	for _, h := range rt.stored {
		if v := res.Header.Values(h); len(v) > 0 {
			kept.Header[http.CanonicalHeaderKey(h)] = v
		}
	}
	b, err := json.Marshal(kept)
	if err != nil {
		return guard.Outcome{}, err
	}
	return guard.Outcome{Response: anyOf(b)}, nil
}

// answer writes a stored outcome: a replay's, or a fenced run's.
func (rt *route) answer(w http.ResponseWriter, out guard.Outcome, replayed bool) {
	if out.Response == nil || out.Response.GetTypeUrl() != responseTypeURL {
		rt.fail(w, storedError(out))
		return
	}
	var res Response
	if err := json.Unmarshal(out.Response.GetValue(), &res); err != nil || res.Status < 100 {
		rt.fail(w, errcode.Errorf(errcode.Internal, "the stored response does not decode"))
		return
	}
	for k, v := range res.Header {
		w.Header()[k] = v
	}
	if replayed {
		w.Header().Set(ReplayedHeader, "true")
	}
	if rt.Stripe {
		if replayed {
			w.Header().Set(stripeReplayedHeader, "true")
		}
		w.Header().Set(stripeShouldRetryHeader, "false") // a retry gets this same answer
	}
	w.WriteHeader(res.Status)
	_, _ = w.Write(res.Body)
}

// fail answers err: a problem, or on a Stripe route a Stripe error object
// where err is permanent.
func (rt *route) fail(w http.ResponseWriter, err error) {
	if rt.Stripe {
		writeStripeError(w, err)
		return
	}
	writeProblem(w, err)
}
