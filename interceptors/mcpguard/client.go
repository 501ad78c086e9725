package mcpguard

import (
	"context"
	"errors"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/internal/backoff"
)

// ClientOption configures ClientMiddleware.
type ClientOption func(*clientOptions)

type clientOptions struct {
	maxAttempts int
	base, limit time.Duration
}

// WithMaxAttempts bounds the attempts of one intent (5; at least 1).
func WithMaxAttempts(n int) ClientOption {
	return func(o *clientOptions) { o.maxAttempts = max(n, 1) }
}

// WithBackoff sets the full-jitter backoff's base and cap (100 ms, 5 s).
func WithBackoff(base, limit time.Duration) ClientOption {
	return func(o *clientOptions) { o.base, o.limit = base, limit }
}

// ClientMiddleware is the sending middleware of an agent's MCP client
// (mcp.Client.AddSendingMiddleware). On every tools/call it sends one key
// per intent in _meta[KeyMeta]: the key in the context
// (idemclient.WithKey, idemclient.WithIntent), or else one it mints for
// this CallTool. It retries the call with the same key, so a re-issue
// after a dropped stream (a new JSON-RPC id) is the same intent:
//
//   - after a transport failure (the call may or may not have arrived);
//   - after an error result whose ErrorMeta says retryable, no sooner
//     than its retry_after_ms;
//
// with full-jitter backoff, at most WithMaxAttempts attempts, and never
// past the context's deadline. JSON-RPC errors from the server and every
// other result are returned as they are.
func ClientMiddleware(opts ...ClientOption) mcp.Middleware {
	o := clientOptions{maxAttempts: 5, base: 100 * time.Millisecond, limit: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			cr, ok := req.(*mcp.ClientRequest[mcp.Params])
			if !ok || method != "tools/call" {
				return next(ctx, method, req)
			}
			params, ok := cr.Params.(*mcp.CallToolParams)
			if !ok || params == nil {
				return next(ctx, method, req)
			}
			key, ok := idemclient.KeyFromContext(ctx)
			if !ok {
				key = idemclient.NewKey()
			}
			keyed := *params
			keyed.Meta = make(mcp.Meta, len(params.Meta)+1)
			for k, v := range params.Meta {
				keyed.Meta[k] = v
			}
			keyed.Meta[KeyMeta] = key
			send := &mcp.ClientRequest[mcp.Params]{Session: cr.Session, Params: &keyed}
			for attempt := 1; ; attempt++ {
				res, err := next(ctx, method, send)
				wait, retry := retryable(res, err)
				if !retry || attempt >= o.maxAttempts || ctx.Err() != nil {
					return res, err
				}
				wait = max(wait, backoff.FullJitter(o.base, o.limit, attempt))
				if d, ok := ctx.Deadline(); ok && time.Until(d) < wait {
					return res, err
				}
				if backoff.Sleep(ctx, wait) != nil {
					return res, err
				}
			}
		}
	}
}

// retryable says whether an attempt's answer may be retried with the
// same key, and the server's hint.
func retryable(res mcp.Result, err error) (time.Duration, bool) {
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return 0, false // the caller gave up
		}
		var w *jsonrpc.Error
		if errors.As(err, &w) && w.Code != codeRejected {
			return 0, false // the server answered
		}
		// The transport failed (the SDK wraps its failures in "rejected by
		// transport"): the call may or may not have arrived, and the same
		// key makes a resend safe.
		return 0, true
	}
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil || !r.IsError {
		return 0, false
	}
	info, ok := ErrorFromResult(r)
	if !ok || !info.Retryable {
		return 0, false
	}
	return time.Duration(info.RetryAfterMS) * time.Millisecond, true
}

// codeRejected is the JSON-RPC code of the SDK's "rejected by transport":
// an HTTP failure, a 4xx or 5xx answer from a gateway, a lost response.
const codeRejected = -32005

// ErrorFromResult returns the ErrorMeta of a result, as a client decodes
// it; false when the result is not an error of the ledger or the guard.
func ErrorFromResult(r *mcp.CallToolResult) (ErrorInfo, bool) {
	switch v := r.Meta[ErrorMeta].(type) {
	case ErrorInfo:
		return v, true
	case map[string]any:
		code, ok := v["code"].(string)
		if !ok {
			return ErrorInfo{}, false
		}
		retryable, _ := v["retryable"].(bool)
		ms, _ := v["retry_after_ms"].(float64)
		return ErrorInfo{Code: code, Retryable: retryable, RetryAfterMS: int64(ms)}, true
	}
	return ErrorInfo{}, false
}
