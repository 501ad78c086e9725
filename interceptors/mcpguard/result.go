package mcpguard

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// The type URLs of the outcomes the adapter stores: a CallToolResult's
// JSON, or a JSON-RPC error's.
const (
	resultTypeURL = "type.idemledger.io/mcp.CallToolResult"
	errorTypeURL  = "type.idemledger.io/jsonrpc.Error"
)

// outcome is a handler's answer as the guard stores it.
func outcome(t Tool, res mcp.Result, err error) (guard.Outcome, error) {
	if errors.Is(err, guard.ErrOutcomeUnknown) {
		return guard.Outcome{}, err
	}
	if err != nil {
		b, merr := json.Marshal(wireError(err))
		if merr != nil {
			return guard.Outcome{}, merr
		}
		return guard.Outcome{Response: &anypb.Any{TypeUrl: errorTypeURL, Value: b}, Transient: guard.Transient(err)}, nil
	}
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil {
		return guard.Outcome{}, fmt.Errorf("mcpguard: the handler answered %T, not a CallToolResult", res)
	}
	out, err := resultOutcome(r)
	if err != nil {
		return out, err
	}
	switch {
	case r.NeedsInput() || len(r.InputRequests) > 0:
		// The call asks for more input and will come back: it applied
		// nothing yet.
		out.Transient = true
	case r.IsError:
		out.Transient = (t.Transient != nil && t.Transient(r)) || guard.Transient(r.GetError())
	}
	return out, nil
}

// resultOutcome is a result's JSON under resultTypeURL.
func resultOutcome(r *mcp.CallToolResult) (guard.Outcome, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return guard.Outcome{}, fmt.Errorf("mcpguard: the result does not encode: %w", err)
	}
	return guard.Outcome{Response: &anypb.Any{TypeUrl: resultTypeURL, Value: b}}, nil
}

// wireError is the JSON-RPC error the SDK sends for err.
func wireError(err error) *jsonrpc.Error {
	if w, ok := err.(*jsonrpc.Error); ok { //nolint:errorlint // the error itself, not one it wraps
		return w
	}
	if w := (*jsonrpc.Error)(nil); errors.As(err, &w) {
		return &jsonrpc.Error{Code: w.Code, Message: err.Error(), Data: w.Data}
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}

// fromOutcome is the answer to the caller: the stored result (marked
// replayed when it comes from the ledger), the stored JSON-RPC error, or
// the error result of a status the guard stored.
func fromOutcome(t Tool, out guard.Outcome, replayed bool) (mcp.Result, error) {
	if out.Response == nil {
		return errorResult(t, ledgerstatus.Decode(out.Status)), nil
	}
	switch out.Response.GetTypeUrl() {
	case resultTypeURL:
		return decodeResult(out.Response.GetValue(), replayed)
	case errorTypeURL:
		var w jsonrpc.Error
		if json.Unmarshal(out.Response.GetValue(), &w) != nil {
			return errorResult(t, errcode.Errorf(errcode.Internal, "the stored error does not decode")), nil //nolint:nilerr // the tool result is the answer
		}
		return nil, &w
	}
	return errorResult(t, errcode.Errorf(errcode.Internal, "the key holds an outcome of another kind (%s)", out.Response.GetTypeUrl())), nil
}

// decodeResult is a stored result, its structuredContent kept as the
// bytes it was stored as.
func decodeResult(b []byte, replayed bool) (*mcp.CallToolResult, error) {
	var r mcp.CallToolResult
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the stored result does not decode"}
	}
	var raw struct {
		StructuredContent json.RawMessage `json:"structuredContent"`
	}
	if json.Unmarshal(b, &raw) == nil && len(raw.StructuredContent) > 0 {
		r.StructuredContent = raw.StructuredContent
	}
	if replayed {
		meta := make(mcp.Meta, len(r.Meta)+1)
		for k, v := range r.Meta {
			meta[k] = v
		}
		meta[ReplayedMeta] = true
		r.Meta = meta
	}
	return &r, nil
}

// ErrorInfo is what ErrorMeta carries.
type ErrorInfo struct {
	Code         string `json:"code"`
	Retryable    bool   `json:"retryable"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// errorResult is a ledger or guard error as a tool result a model can act
// on: isError, one line that says what to do, and ErrorMeta.
func errorResult(t Tool, err error) *mcp.CallToolResult {
	le := ledgerstatus.FromError(err)
	info := ErrorInfo{Code: le.Code.String(), Retryable: le.Retryable(), RetryAfterMS: le.RetryAfter.Milliseconds()}
	res := &mcp.CallToolResult{
		IsError: true,
		Content: []mcp.Content{&mcp.TextContent{Text: Advice(le)}},
		Meta:    mcp.Meta{ErrorMeta: info},
	}
	if !t.StructuredOutput {
		res.StructuredContent = map[string]any{"error": info}
	}
	return res
}

// Advice is the one line a model reads for a ledger or guard error: what
// happened, and whether and when to retry.
func Advice(le *errcode.Error) string {
	switch le.Code {
	case errcode.KeyReused:
		return "this idempotency key was used for a different request: do not retry with it; a new intent needs a new key"
	case errcode.KeyMissing:
		return fmt.Sprintf("this tool needs an idempotency key: mint one per intent, send it as _meta[%q] (or the tool's key argument), and reuse it on every retry", KeyMeta)
	case errcode.KeyInvalid:
		return "the idempotency key is not 1 to 255 printable ASCII characters: mint a valid one for this intent"
	case errcode.OutcomeUnknown:
		return "an earlier attempt of this call may have done it, and nobody knows: it will not run again until an operator resolves it; do not retry"
	case errcode.KeyExpired:
		return "this call already ran, and its answer is no longer kept: do not retry it"
	case errcode.RetryTooLate:
		return "this intent is too old to retry safely: do not retry it; check whether it happened"
	case errcode.InProgress:
		return "another attempt of this call is still running: retry with the same key after " + delay(le.RetryAfter)
	case errcode.Unavailable:
		// Whose fault it was is the error's own message: the ledger, its
		// store, or the tool (an upstream that hung up, a run timeout).
		what := "the call cannot be served now"
		if le.Message != "" {
			what = oneLine(le.Message)
		}
		return what + ": retry with the same key after " + delay(le.RetryAfter)
	case errcode.RateLimited:
		return "too many calls: retry with the same key after " + delay(le.RetryAfter)
	case errcode.ValidationFailed:
		return "the call cannot be guarded (" + oneLine(le.Message) + "): fix the call, then send it with the same key"
	case errcode.OutcomeTooLarge, errcode.Internal:
		if le.Applied() {
			return oneLine(le.Message)
		}
	}
	if le.Retryable() {
		return oneLine(le.Message) + ": retry with the same key after " + delay(le.RetryAfter)
	}
	return oneLine(le.Message) + ": do not retry with this key"
}

// delay is a retry-after as a person writes it: "2s", "250ms", at least
// 100ms.
func delay(d time.Duration) string {
	d = max(d, 100*time.Millisecond)
	if d < time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
