package mcpguard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// A guard in front of a server it does not run in process (idemproxy)
// reads and answers tools/call as the JSON the wire carries, so that what
// no SDK type holds passes through as it came: fields of the params it
// does not know (a task augmentation, a round's inputResponses and
// requestState), and every field of the result (resultType, a task the
// call created, fields of revisions newer than the SDK).

// protocolVersionMeta is the _meta key that carries a request's protocol
// revision from 2026-07-28 on (the per-request envelope).
const protocolVersionMeta = "io.modelcontextprotocol/protocolVersion"

// ServeJSON answers one tools/call as its JSON-RPC message carries it: its
// params as they came, and the HTTP request's header (Streamable HTTP) or
// nil. A call that names a protected tool goes through the guard; any
// other, to run alone. run runs a call whose params are the ones it is
// given (the call's own, with the claim in _meta under WithClaimInMeta)
// and returns its result's JSON, or an error: a *jsonrpc.Error the server
// answered, or one that wraps guard.ErrOutcomeUnknown when nobody knows
// whether it ran. ServeJSON returns the result's JSON, or the JSON-RPC
// error to answer with. Like the middleware, it stores the first
// answer and replays it, releases a result that asks for more input
// (resultType "input_required") and one the tool's classifier calls
// transient, and answers every ledger or guard error as a tool result. A
// result that creates a task is stored as it came: a retry gets the same
// task. SEP-3182's idempotencyKey parameter is read here, from the params
// as they came: ServeJSON needs no Handler. It is safe for concurrent use.
func (g *Guard) ServeJSON(ctx context.Context, params json.RawMessage, header http.Header,
	run func(ctx context.Context, params json.RawMessage) (json.RawMessage, error),
) (json.RawMessage, error) {
	p, key, members, err := readCallParams(params)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "the tools/call params: " + err.Error()}
	}
	t, ok := g.opts.tools[p.Name]
	if !ok {
		return run(ctx, params)
	}
	if key != nil {
		if p.Meta == nil {
			p.Meta = mcp.Meta{}
		}
		p.Meta[paramKeyMeta] = key
	}
	modern := isModern(p.Meta)
	req := &mcp.CallToolRequest{Params: &p, Extra: &mcp.RequestExtra{Header: header}}
	ctx = guard.Continue(ctx, metaCarrier(p.Meta))
	c, err := g.prepare(ctx, t, req)
	if err != nil {
		return encodeResult(errorResult(t, err), modern)
	}
	res, live, liveErr, err := do(ctx, g, c,
		func(ctx context.Context, claim *guard.Claim) (json.RawMessage, error) {
			if claim == nil {
				return run(ctx, params)
			}
			return run(ctx, withClaimJSON(params, members, p.Meta, *claim))
		},
		func(live json.RawMessage, err error) (guard.Outcome, error) { return jsonOutcome(t, live, err) })
	switch {
	case err != nil:
		return encodeResult(errorResult(t, err), modern)
	case !res.Protected, !res.Replayed && res.Outcome.Transient:
		return live, liveErr // unprotected, or released: nothing stored
	}
	return fromJSONOutcome(t, res.Outcome, res.Replayed, modern)
}

// readCallParams reads a tools/call's params, and SEP-3182's
// idempotencyKey among them, by their members' exact names, the last of a
// name counting, as the Go SDK (which turns encoding/json's
// case-insensitive match off) and JSON.parse read them: matched
// case-insensitively, a call with both "name" and "NAME" would name one
// tool to the guard and another to the server, which would run a
// protected tool unguarded, and "ARGUMENTS" would give the guard other
// arguments to fingerprint than the tool runs with. members are the
// params' members as they came, for withClaimJSON.
func readCallParams(params json.RawMessage) (p mcp.CallToolParamsRaw, key any, members map[string]json.RawMessage, err error) {
	if err := json.Unmarshal(params, &members); err != nil {
		return p, nil, nil, fmt.Errorf("not an object: %w", err)
	}
	for _, m := range callParamsMembers(&p, &key) {
		raw, ok := members[m.name]
		if !ok {
			continue
		}
		if into, isRaw := m.into.(*json.RawMessage); isRaw {
			*into = raw // valid JSON already, as Unmarshal would copy it
			continue
		}
		if err := json.Unmarshal(raw, m.into); err != nil {
			return p, nil, nil, fmt.Errorf("%s: %w", m.name, err)
		}
	}
	return p, key, members, nil
}

// callParamsMembers are where readCallParams reads each member of a
// tools/call's params, in a fixed order, so that of two bad members the
// same one is named every time.
func callParamsMembers(p *mcp.CallToolParamsRaw, key *any) []struct {
	name string
	into any
} {
	return []struct {
		name string
		into any
	}{{"name", &p.Name}, {"arguments", &p.Arguments}, {"_meta", &p.Meta},
		{"inputResponses", &p.InputResponses}, {"requestState", &p.RequestState}, {"idempotencyKey", key}}
}

// isModern reports whether a request's _meta carries the per-request
// envelope of 2026-07-28 and later.
func isModern(meta mcp.Meta) bool {
	_, ok := meta[protocolVersionMeta].(string)
	return ok
}

// resultShape is what the guard reads of a result's JSON.
type resultShape struct {
	ResultType    string
	IsError       bool
	InputRequests json.RawMessage
}

// readResultShape reads a result's JSON by its members' exact names, as
// the client does: matched case-insensitively, a "RESULTTYPE" beside a
// result the client takes as complete would release its claim, and the
// retry would run the tool again.
func readResultShape(res json.RawMessage) (shape resultShape, err error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(res, &members); err != nil {
		return shape, err
	}
	if members == nil {
		return shape, errors.New("null")
	}
	if raw, ok := members["resultType"]; ok {
		if err := json.Unmarshal(raw, &shape.ResultType); err != nil {
			return shape, err
		}
	}
	if raw, ok := members["isError"]; ok {
		if err := json.Unmarshal(raw, &shape.IsError); err != nil {
			return shape, err
		}
	}
	shape.InputRequests = members["inputRequests"]
	return shape, nil
}

// resultTypeInputRequired is the resultType of a round that asks for more
// input (2026-07-28's multi-round-trip requests).
const resultTypeInputRequired = "input_required"

// jsonOutcome is a run's answer as the guard stores it.
func jsonOutcome(t Tool, res json.RawMessage, err error) (guard.Outcome, error) {
	if err != nil {
		return outcome(t, nil, err)
	}
	shape, err := readResultShape(res)
	if err != nil {
		return guard.Outcome{}, errors.Join(guard.ErrOutcomeUnknown, errors.New("mcpguard: the result is not a JSON object"))
	}
	out := guard.Outcome{Response: &anypb.Any{TypeUrl: resultTypeURL, Value: bytes.TrimSpace(res)}}
	switch {
	case shape.ResultType == resultTypeInputRequired || (len(shape.InputRequests) > 0 && string(shape.InputRequests) != "null"):
		// The call asks for more input and will come back: it applied
		// nothing yet.
		out.Transient = true
	case shape.IsError && t.Transient != nil:
		var r mcp.CallToolResult
		out.Transient = json.Unmarshal(res, &r) == nil && t.Transient(&r)
	}
	return out, nil
}

// fromJSONOutcome is the answer to the caller from a stored outcome: the
// result's JSON (marked replayed when it comes from the ledger), the
// stored JSON-RPC error, or the error result of a status the guard stored.
func fromJSONOutcome(t Tool, out guard.Outcome, replayed, modern bool) (json.RawMessage, error) {
	if out.Response == nil {
		return encodeResult(errorResult(t, ledgerstatus.Decode(out.Status)), modern)
	}
	switch out.Response.GetTypeUrl() {
	case resultTypeURL:
		b := json.RawMessage(out.Response.GetValue())
		if replayed {
			return markReplayed(b)
		}
		return b, nil
	case errorTypeURL:
		var w jsonrpc.Error
		if json.Unmarshal(out.Response.GetValue(), &w) != nil {
			return encodeResult(errorResult(t, errcode.Errorf(errcode.Internal, "the stored error does not decode")), modern)
		}
		return nil, &w
	}
	return encodeResult(errorResult(t, errcode.Errorf(errcode.Internal, "the key holds an outcome of another kind (%s)", out.Response.GetTypeUrl())), modern)
}

// encodeResult is r's JSON; on a 2026-07-28 request it says
// resultType "complete", as every result of that revision does.
func encodeResult(r *mcp.CallToolResult, modern bool) (json.RawMessage, error) {
	b, err := json.Marshal(r)
	if err != nil || !modern {
		return b, err
	}
	return editObject(b, func(m map[string]json.RawMessage) error {
		m["resultType"] = json.RawMessage(`"complete"`)
		return nil
	})
}

// markReplayed is a stored result with _meta[ReplayedMeta] = true.
func markReplayed(res json.RawMessage) (json.RawMessage, error) {
	return editObject(res, func(m map[string]json.RawMessage) error {
		return editMeta(m, func(meta map[string]json.RawMessage) { meta[ReplayedMeta] = json.RawMessage("true") })
	})
}

// withClaimJSON is params with the claim in _meta[ClaimMeta], from their
// members and _meta as readCallParams read them; params as they came when
// they are null (the server refuses them). The claim is written before
// the _meta's other members, which keep their bytes; a claim the caller
// sent is replaced.
func withClaimJSON(params json.RawMessage, members map[string]json.RawMessage, meta mcp.Meta, c guard.Claim) json.RawMessage {
	if members == nil {
		return params
	}
	members = maps.Clone(members)
	claim := fmt.Appendf(nil, `{"attempt":%d,"token":%d}`, c.Attempt, c.Token)
	if _, sent := meta[ClaimMeta]; sent {
		if editMeta(members, func(meta map[string]json.RawMessage) { meta[ClaimMeta] = claim }) != nil {
			return params
		}
	} else {
		members["_meta"] = prependMember(members["_meta"], ClaimMeta, claim)
	}
	out, err := encodeObject(members)
	if err != nil {
		return params
	}
	return out
}

// editObject decodes a JSON object's members, lets edit change them and
// encodes them again. Members keep their values byte for byte; they are
// written in the order of their names.
func editObject(b json.RawMessage, edit func(map[string]json.RawMessage) error) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if m == nil {
		return nil, errors.New("mcpguard: null where an object belongs")
	}
	if err := edit(m); err != nil {
		return nil, err
	}
	return encodeObject(m)
}

// encodeObject is m as a JSON object, its members in the order of their
// names, each value as it is (null when empty): json.Marshal would scan
// every value again to compact it, where each came from json.Unmarshal or
// json.Marshal and is valid already.
func encodeObject(m map[string]json.RawMessage) (json.RawMessage, error) {
	n := 2
	for k, v := range m {
		n += len(k) + len(v) + 4
	}
	out := make([]byte, 0, n)
	out = append(out, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			out = append(out, ',')
		}
		var err error
		if out, err = appendName(out, k); err != nil {
			return nil, err
		}
		out = append(out, ':')
		if v := m[k]; len(v) > 0 {
			out = append(out, v...)
		} else {
			out = append(out, "null"...)
		}
	}
	return append(out, '}'), nil
}

// prependMember is the JSON object obj (empty when absent or null) with
// the member name: value before its own, which keep their bytes. obj does
// not have a member of that name.
func prependMember(obj json.RawMessage, name string, value []byte) json.RawMessage {
	out := make([]byte, 0, len(obj)+len(name)+len(value)+4)
	out, _ = appendName(append(out, '{'), name) // a name of ours: needs no escape
	out = append(append(out, ':'), value...)
	if len(obj) == 0 || string(obj) == "null" {
		return append(out, '}')
	}
	rest := bytes.TrimLeft(obj[1:], " \t\r\n")
	if rest[0] != '}' {
		out = append(out, ',')
	}
	return append(out, rest...)
}

// appendName appends the name k as json.Marshal writes it: between quotes
// as it is when none of its bytes needs an escape (the names servers
// send), through json.Marshal otherwise.
func appendName(out []byte, k string) ([]byte, error) {
	for i := range len(k) {
		if c := k[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			name, err := json.Marshal(k)
			return append(out, name...), err
		}
	}
	out = append(out, '"')
	out = append(out, k...)
	return append(out, '"'), nil
}

// editMeta lets edit change the _meta object of m, made when absent.
func editMeta(m map[string]json.RawMessage, edit func(map[string]json.RawMessage)) error {
	meta := map[string]json.RawMessage{}
	if raw, ok := m["_meta"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &meta); err != nil {
			return err
		}
	}
	edit(meta)
	b, err := encodeObject(meta)
	if err != nil {
		return err
	}
	m["_meta"] = b
	return nil
}
