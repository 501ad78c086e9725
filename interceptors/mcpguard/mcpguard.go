// Package mcpguard makes an MCP server's write tools idempotent through
// the idemledger LedgerService: a receiving middleware for the official Go
// SDK (github.com/modelcontextprotocol/go-sdk) that runs every tools/call
// of a protected tool through the guard (package guard), and a sending
// middleware for the agent's side that carries one key per intent across
// retries.
//
// For a tools/call of a protected tool, the middleware takes the key from
// the call's _meta["io.idemledger/idempotency-key"], or from the tool's
// key argument when it declares one (the argument wins), the tenant from
// the tool's TenantFunc, and fingerprints the arguments ("j1:", RFC 8785,
// without the key argument) under the method "mcp:tools/<name>". Then:
//
//   - the first attempt runs the tool, and its CallToolResult is stored;
//     every later attempt gets the same JSON, with
//     _meta["io.idemledger/replayed"] = true;
//   - a result with isError is stored too, unless the tool's classifier
//     (or, for an error a typed tool handler returned, its class) says it
//     is transient: then the key is released and a retry runs afresh; so
//     is a result that asks for more input;
//   - a Go error from the handler is stored and replayed as the same
//     JSON-RPC error, or released when it is transient;
//   - every error of the ledger or of the guard becomes a tool result with
//     isError, one line a model can act on, and
//     _meta["io.idemledger/error"] = {code, retryable, retry_after_ms}.
//
// Tools not named, and every other method, pass through untouched.
package mcpguard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// The _meta keys and the default argument the adapter reads and writes.
const (
	// KeyMeta is the _meta key of the idempotency key on a tools/call.
	KeyMeta = "io.idemledger/idempotency-key"
	// ReplayedMeta is set to true on a replayed result's _meta.
	ReplayedMeta = "io.idemledger/replayed"
	// ErrorMeta carries {code, retryable, retry_after_ms} on an error
	// result of the ledger or the guard.
	ErrorMeta = "io.idemledger/error"
	// ClaimMeta carries {token, attempt} on a call forwarded under a claim
	// (WithClaimInMeta), so that the tool may fence its own write.
	ClaimMeta = "io.idemledger/claim"
	// DefaultKeyArgument is the name of a tool's key argument.
	DefaultKeyArgument = "idempotency_key"
	// MethodPrefix names a tool's method in the ledger: "mcp:tools/<name>".
	MethodPrefix = "mcp:tools/"
)

// Tool is how one tool is protected.
type Tool struct {
	// Policy is the guard's policy.
	Policy guard.Policy
	// KeyArgument names the argument that carries the key, left out of
	// the fingerprint; "" takes the key from _meta only. NewTool sets
	// DefaultKeyArgument.
	KeyArgument string
	// KeyPointer, when set, is an RFC 6901 JSON Pointer into the arguments
	// ("/order/request_id"): a call whose key argument is absent takes its
	// key from there, a string, before the parameter and _meta.
	KeyPointer string
	// HostCallIDs, when set, name the _meta keys of a host's own per-call
	// id ("claudecode/toolUseId"), read in order when the call carries no
	// key of its own: off when empty. A host's call id is stable only
	// across that host's own re-sends of the call.
	HostCallIDs []string
	// FingerprintPointers, when set, name the parts of the arguments that
	// make the call's fingerprint, the rest ignored: a retry that differs
	// elsewhere is the same call (its replay), not KEY_REUSED.
	FingerprintPointers []string
	// Transient, when set, says whether a result with isError applied
	// nothing, so that its key is released rather than its result stored.
	Transient func(*mcp.CallToolResult) bool
	// Reconcile, when set, is asked on a takeover whether the earlier
	// attempt's write landed: its result when it did, nil when it did
	// not, an error when it cannot tell. The claim is in ctx
	// (guard.ClaimFromContext).
	Reconcile func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error)
	// StructuredOutput says the tool declares an output schema: error
	// results then keep their detail out of structuredContent.
	StructuredOutput bool
}

// NewTool returns a Tool with policy p whose key may also travel in the
// argument DefaultKeyArgument.
func NewTool(p guard.Policy) Tool { return Tool{Policy: p, KeyArgument: DefaultKeyArgument} }

// TenantFunc returns the tenant a tools/call acts for. An error that is
// not a *errcode.Error fails the call with VALIDATION_FAILED.
type TenantFunc func(ctx context.Context, req *mcp.CallToolRequest) (string, error)

// Tenant is a TenantFunc for a server that acts for one tenant.
func Tenant(name string) TenantFunc {
	return func(context.Context, *mcp.CallToolRequest) (string, error) { return name, nil }
}

// TenantFromHeader reads the tenant from an HTTP header of the call
// (Streamable HTTP; guard.HeaderTenant).
func TenantFromHeader(name string) TenantFunc {
	return func(_ context.Context, req *mcp.CallToolRequest) (string, error) {
		var h http.Header
		if req.Extra != nil {
			h = req.Extra.Header
		}
		return guard.HeaderTenant(h, name)
	}
}

// TenantFromToken reads the tenant from the verified OAuth token of the
// call (auth.RequireBearerToken): the string in its Extra[name], or its
// UserID when name is "".
func TenantFromToken(name string) TenantFunc {
	return func(_ context.Context, req *mcp.CallToolRequest) (string, error) {
		var info *auth.TokenInfo
		if req.Extra != nil {
			info = req.Extra.TokenInfo
		}
		if info != nil {
			if name == "" && info.UserID != "" {
				return info.UserID, nil
			}
			if s, ok := info.Extra[name].(string); ok && s != "" {
				return s, nil
			}
		}
		return "", errcode.Errorf(errcode.ValidationFailed, "the call's token names no tenant")
	}
}

// TenantFromArgument reads the tenant from a top-level string argument.
func TenantFromArgument(name string) TenantFunc {
	return func(_ context.Context, req *mcp.CallToolRequest) (string, error) {
		var args map[string]json.RawMessage
		var s string
		if json.Unmarshal(req.Params.Arguments, &args) == nil && json.Unmarshal(args[name], &s) == nil && s != "" {
			return s, nil
		}
		return "", errcode.Errorf(errcode.ValidationFailed, "the call has no %s argument", name)
	}
}

// Option configures a Guard.
type Option func(*options)

type options struct {
	tools       map[string]Tool
	tenant      TenantFunc
	claimInMeta bool
}

// WithTool protects the tool named name.
func WithTool(name string, t Tool) Option { return func(o *options) { o.tools[name] = t } }

// WithTenant sets how the tenant of a call is found. It is required.
func WithTenant(f TenantFunc) Option { return func(o *options) { o.tenant = f } }

// WithClaimInMeta puts the claim ({token, attempt}) in the _meta of the
// call the tool handler receives (ClaimMeta): for a handler that cannot
// read the context, such as an upstream server behind a proxy.
func WithClaimInMeta() Option { return func(o *options) { o.claimInMeta = true } }

// Guard is the receiving middleware's state. It is safe for concurrent
// use.
type Guard struct {
	guard *guard.Guard
	opts  options
}

// New returns a Guard for the tools named with WithTool, running them
// under g.
func New(g *guard.Guard, opts ...Option) (*Guard, error) {
	o := options{tools: map[string]Tool{}}
	for _, opt := range opts {
		opt(&o)
	}
	if g == nil {
		return nil, errors.New("mcpguard: no guard")
	}
	if o.tenant == nil {
		return nil, errors.New("mcpguard: no tenant function (WithTenant)")
	}
	for name, t := range o.tools {
		if err := ledger.ValidateMethod(MethodPrefix + name); err != nil || name == "" {
			return nil, fmt.Errorf("mcpguard: tool %q: not a method name", name)
		}
		if err := t.Policy.Check(); err != nil {
			return nil, fmt.Errorf("mcpguard: tool %q: %w", name, err)
		}
		for _, ptr := range append([]string{t.KeyPointer}, t.FingerprintPointers...) {
			if err := fingerprint.CheckPointer(ptr); err != nil {
				return nil, fmt.Errorf("mcpguard: tool %q: %w", name, err)
			}
		}
	}
	return &Guard{guard: g, opts: o}, nil
}

// Middleware is the receiving middleware to install with
// mcp.Server.AddReceivingMiddleware.
func (g *Guard) Middleware() mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || method != "tools/call" || call.Params == nil {
				return next(ctx, method, req)
			}
			t, ok := g.opts.tools[call.Params.Name]
			if !ok {
				return next(ctx, method, req)
			}
			return g.call(ctx, t, call, func(ctx context.Context, req *mcp.CallToolRequest) (mcp.Result, error) {
				return next(ctx, method, req)
			})
		}
	}
}

// call runs one tools/call of a protected tool under the guard. A result
// it answers itself (an error, a replay) says resultType "complete" to a
// client of 2026-07-28, as the SDK has a tool handler's result say.
func (g *Guard) call(ctx context.Context, t Tool, req *mcp.CallToolRequest, next func(context.Context, *mcp.CallToolRequest) (mcp.Result, error)) (mcp.Result, error) {
	ctx = guard.Continue(ctx, metaCarrier(req.Params.Meta))
	res, own, err := g.answer(ctx, t, req, next)
	if r, ok := res.(*mcp.CallToolResult); ok && own && isModern(req.Params.Meta) {
		return complete(r), err
	}
	return res, err
}

// answer is call's answer, and whether the guard made it (own) rather than
// the tool's handler.
func (g *Guard) answer(ctx context.Context, t Tool, req *mcp.CallToolRequest, next func(context.Context, *mcp.CallToolRequest) (mcp.Result, error)) (res mcp.Result, own bool, err error) {
	c, err := g.prepare(ctx, t, req)
	if err != nil {
		return errorResult(t, err), true, nil
	}
	out, live, liveErr, err := do(ctx, g, c,
		func(ctx context.Context, claim *guard.Claim) (mcp.Result, error) {
			if claim == nil {
				return next(ctx, req)
			}
			return next(ctx, withClaim(req, *claim))
		},
		func(live mcp.Result, err error) (guard.Outcome, error) { return outcome(t, live, err) })
	switch {
	case err != nil:
		return errorResult(t, err), true, nil
	case !out.Protected, !out.Replayed && out.Outcome.Transient:
		return live, false, liveErr // unprotected, or released: nothing stored
	}
	// The first answer and every replay come from the same stored bytes.
	res, err = fromOutcome(t, out.Outcome, out.Replayed)
	return res, true, err
}

// do runs c under the guard. send runs the call, with claim to put in its
// _meta (nil: as it came); stored is its answer as the guard stores it.
// do returns the guard's result, the call's own answer when it ran (for a
// result the guard does not store), and the guard's error.
func do[R any](ctx context.Context, g *Guard, c guard.Call,
	send func(ctx context.Context, claim *guard.Claim) (R, error),
	stored func(R, error) (guard.Outcome, error),
) (res guard.Result, live R, liveErr, err error) {
	res, err = g.guard.Do(ctx, c, func(ctx context.Context) (guard.Outcome, error) {
		claim, protected := guard.ClaimFromContext(ctx)
		var inMeta *guard.Claim
		if protected && g.opts.claimInMeta {
			inMeta = &claim
		}
		live, liveErr = send(ctx, inMeta)
		if !protected {
			return guard.Outcome{}, nil
		}
		return stored(live, liveErr)
	})
	return res, live, liveErr, err
}

// complete is r saying resultType "complete". The SDK keeps a result's
// type to itself and sets it on what a tool's handler answers; a result
// read from its JSON keeps the type the JSON says.
func complete(r *mcp.CallToolResult) *mcp.CallToolResult {
	b, err := json.Marshal(r)
	if err != nil {
		return r
	}
	b, err = editObject(b, func(m map[string]json.RawMessage) error {
		m["resultType"] = json.RawMessage(`"complete"`)
		return nil
	})
	var out mcp.CallToolResult
	if err != nil || json.Unmarshal(b, &out) != nil {
		return r
	}
	out.StructuredContent = r.StructuredContent // as it was, not as a map
	return &out
}

// prepare is the guard's call for req: its key, tenant and fingerprint
// (none of them for a call without a key, which the policy decides), and
// its reconcile. An error is the ledger's or the guard's, for
// errorResult.
func (g *Guard) prepare(ctx context.Context, t Tool, req *mcp.CallToolRequest) (guard.Call, error) {
	method := MethodPrefix + req.Params.Name
	c := guard.Call{Method: method, Policy: t.Policy, Encode: func(result any) (guard.Outcome, error) {
		switch r := result.(type) {
		case *mcp.CallToolResult:
			return outcome(t, r, nil)
		case json.RawMessage: // a result as ServeJSON's run returns it
			return jsonOutcome(t, r, nil)
		}
		return guard.Outcome{}, fmt.Errorf("mcpguard: a fence of %s holds a *mcp.CallToolResult, not a %T", method, result)
	}}
	key, source, err := callKey(t, req)
	if err != nil {
		return c, err
	}
	c.Key, c.KeySource = key, source
	if key != "" {
		tenant, err := g.opts.tenant(ctx, req)
		if err != nil {
			if le := (*errcode.Error)(nil); !errors.As(err, &le) {
				err = errcode.Errorf(errcode.ValidationFailed, "the call names no tenant")
			}
			return c, err
		}
		fp, err := t.fingerprint(method, req.Params.Arguments)
		if err != nil {
			return c, err
		}
		c.Tenant, c.Fingerprint = tenant, fp
	}
	c.Reconcile = t.reconcile(req)
	return c, nil
}

// fingerprint is the fingerprint of a call's arguments: the parts at
// FingerprintPointers, or all of them but the key argument.
func (t Tool) fingerprint(method string, args json.RawMessage) (string, error) {
	var fp string
	var err error
	if len(t.FingerprintPointers) > 0 {
		fp, err = fingerprint.JSONParts(method, args, t.FingerprintPointers)
	} else if t.KeyArgument != "" {
		fp, err = fingerprint.JSON(method, args, t.KeyArgument)
	} else {
		fp, err = fingerprint.JSON(method, args)
	}
	if err != nil {
		return "", errcode.Errorf(errcode.ValidationFailed, "the arguments are not JSON: %v", err)
	}
	return fp, nil
}

// reconcile is the tool's Reconcile as the guard asks it, for req; nil
// when the tool has none.
func (t Tool) reconcile(req *mcp.CallToolRequest) func(ctx context.Context) (*guard.Outcome, error) {
	if t.Reconcile == nil {
		return nil
	}
	return func(ctx context.Context) (*guard.Outcome, error) {
		res, err := t.Reconcile(ctx, req)
		if err != nil || res == nil {
			return nil, err
		}
		out, err := resultOutcome(res)
		return &out, err
	}
}

// callKey is the call's key, by precedence: the key argument's (or the
// KeyPointer's), else SEP-3182's idempotencyKey parameter (which Handler
// and Transport put in _meta), else _meta's, else the host call ids the
// tool names.
func callKey(t Tool, req *mcp.CallToolRequest) (key, source string, err error) {
	if key, source, err = argumentKey(t, req.Params.Arguments); key != "" || err != nil {
		return key, source, err
	}
	return metaKey(t, req.Params.Meta)
}

// argumentKey is the key in the call's arguments: the key argument's, else
// the one at the KeyPointer.
func argumentKey(t Tool, args json.RawMessage) (key, source string, err error) {
	if len(args) == 0 {
		return "", "", nil
	}
	if t.KeyArgument != "" {
		var all map[string]json.RawMessage
		if json.Unmarshal(args, &all) == nil {
			if raw, ok := all[t.KeyArgument]; ok && string(raw) != "null" {
				if json.Unmarshal(raw, &key) != nil {
					return "", "", errcode.Errorf(errcode.KeyInvalid, "the %s argument is not a string", t.KeyArgument)
				}
				if key != "" {
					return key, "argument", nil
				}
			}
		}
	}
	if t.KeyPointer != "" {
		if raw, ok, err := fingerprint.Pointer(args, t.KeyPointer); err == nil && ok && string(raw) != "null" {
			if json.Unmarshal(raw, &key) != nil {
				return "", "", errcode.Errorf(errcode.KeyInvalid, "the key at %s in the arguments is not a string", t.KeyPointer)
			}
			if key != "" {
				return key, "pointer:" + t.KeyPointer, nil
			}
		}
	}
	return "", "", nil
}

// metaKey is the key in the call's _meta: SEP-3182's idempotencyKey
// parameter (which Handler and Transport put there), else KeyMeta's,
// else the first of the tool's host call ids.
func metaKey(t Tool, meta mcp.Meta) (key, source string, err error) {
	switch v := meta[paramKeyMeta].(type) {
	case nil:
	case string:
		if v != "" {
			return v, "parameter", nil
		}
	default:
		return "", "", errcode.Errorf(errcode.KeyInvalid, "the %s parameter is not a string", paramKey)
	}
	for i, k := range append([]string{KeyMeta}, t.HostCallIDs...) {
		switch v := meta[k].(type) {
		case nil:
		case string:
			if v == "" {
				continue
			}
			if i == 0 {
				return v, "meta", nil
			}
			return v, "host:" + k, nil
		default:
			return "", "", errcode.Errorf(errcode.KeyInvalid, "_meta[%q] is not a string", k)
		}
	}
	return "", "", nil
}

// withClaim is req with the claim in its _meta, for the handler.
func withClaim(req *mcp.CallToolRequest, c guard.Claim) *mcp.CallToolRequest {
	params := *req.Params
	meta := make(mcp.Meta, len(params.Meta)+1)
	for k, v := range params.Meta {
		meta[k] = v
	}
	meta[ClaimMeta] = map[string]any{"token": c.Token, "attempt": c.Attempt}
	params.Meta = meta
	forwarded := *req
	forwarded.Params = &params
	return &forwarded
}

// ClaimFromMeta returns the claim a call carries in its _meta
// (WithClaimInMeta): the token and the attempt.
func ClaimFromMeta(meta mcp.Meta) (token uint64, attempt uint32, ok bool) {
	m, ok := meta[ClaimMeta].(map[string]any)
	if !ok {
		return 0, 0, false
	}
	num := func(v any) (float64, bool) {
		switch n := v.(type) {
		case float64:
			return n, true
		case uint64:
			return float64(n), true
		case uint32:
			return float64(n), true
		case json.Number:
			f, err := n.Float64()
			return f, err == nil
		}
		return 0, false
	}
	tok, ok1 := num(m["token"])
	att, ok2 := num(m["attempt"])
	if !ok1 || !ok2 || tok < 1 || att < 1 {
		return 0, 0, false
	}
	return uint64(tok), uint32(att), true
}

// oneLine is s on one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// metaCarrier reads a trace context (traceparent, tracestate) from a
// call's _meta.
type metaCarrier mcp.Meta

func (m metaCarrier) Get(key string) string {
	s, _ := m[key].(string)
	return s
}

func (m metaCarrier) Set(key, value string) { m[key] = value }

func (m metaCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
