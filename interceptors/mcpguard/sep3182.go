package mcpguard

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MCP SEP-3182 (Request Idempotency) puts the key of a tools/call in its
// params, beside name and arguments: {"name": …, "idempotencyKey": "…"}.
// The Go SDK decodes the params it knows and drops the rest, so the key is
// read where the message is still JSON: Handler for Streamable HTTP,
// Transport for the other transports. Both move it into the call's _meta
// under paramKeyMeta, where the middleware finds it. ServeJSON, given the
// params as JSON, reads it there.

// IdempotencyCapability is the experimental server capability that says
// the server reads SEP-3182's idempotencyKey parameter: a server guarded
// by this package sets it in its ServerOptions, as
// Capabilities.Experimental[IdempotencyCapability] = map[string]any{}, and
// ClientMiddleware sends the parameter to a server that sets it.
const IdempotencyCapability = "tools.idempotency"

const (
	// paramKey is SEP-3182's parameter of tools/call.
	paramKey = "idempotencyKey"
	// paramKeyMeta is where Handler and Transport put the parameter.
	paramKeyMeta = "io.idemledger/idempotency-key-param"
	// maxBodyBytes bounds the Streamable HTTP body Handler reads.
	maxBodyBytes = 16 << 20
)

// Handler reads SEP-3182's idempotencyKey parameter of the tools/call
// messages posted to h, a Streamable HTTP handler (mcp.NewStreamableHTTPHandler),
// for the guard's middleware. Every other message reaches h as it came.
func Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
		_ = r.Body.Close()
		if err != nil {
			http.Error(w, "the request body could not be read", http.StatusBadRequest)
			return
		}
		if len(body) > maxBodyBytes {
			http.Error(w, "the request body is too large", http.StatusRequestEntityTooLarge)
			return
		}
		if out, ok := paramsToMeta(body); ok {
			body = out
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	})
}

// paramsToMeta rewrites a posted JSON-RPC message that is a tools/call
// with an idempotencyKey parameter, the parameter copied into its _meta.
// Anything else is left as it came: a message without the parameter's
// name in it (the common case, decoded no further), and a batch, which
// MCP has not had since 2025-06-18 (its calls' keys then come from the
// argument or _meta, or are missing: typed either way).
func paramsToMeta(body []byte) ([]byte, bool) {
	if !bytes.Contains(body, []byte(`"`+paramKey+`"`)) {
		return nil, false
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil || string(msg["method"]) != `"tools/call"` {
		return nil, false
	}
	params, ok := keyToMeta(msg["params"])
	if !ok {
		return nil, false
	}
	msg["params"] = params
	out, err := json.Marshal(msg)
	return out, err == nil
}

// keyToMeta is tools/call params with idempotencyKey copied into _meta
// (paramKeyMeta), as it came: a key that is not a string is KEY_INVALID.
func keyToMeta(raw json.RawMessage) (json.RawMessage, bool) {
	return editParams(raw, func(params, meta map[string]json.RawMessage) bool {
		key, ok := params[paramKey]
		if ok {
			meta[paramKeyMeta] = key
		}
		return ok
	})
}

// metaToParam is tools/call params with _meta's key (KeyMeta) sent as
// SEP-3182's idempotencyKey parameter instead.
func metaToParam(raw json.RawMessage) (json.RawMessage, bool) {
	return editParams(raw, func(params, meta map[string]json.RawMessage) bool {
		key, ok := meta[KeyMeta]
		if ok {
			delete(meta, KeyMeta)
			params[paramKey] = key
		}
		return ok
	})
}

// editParams decodes tools/call params and their _meta, lets edit change
// them, and encodes them again when edit says it did. A _meta left empty
// is dropped; params or a _meta that are not objects are left alone (the
// SDK refuses such a call).
func editParams(raw json.RawMessage, edit func(params, meta map[string]json.RawMessage) bool) (json.RawMessage, bool) {
	var params map[string]json.RawMessage
	if json.Unmarshal(raw, &params) != nil || params == nil {
		return nil, false
	}
	meta := map[string]json.RawMessage{}
	if m, ok := params["_meta"]; ok && json.Unmarshal(m, &meta) != nil {
		return nil, false
	}
	if meta == nil { // "_meta": null
		meta = map[string]json.RawMessage{}
	}
	if !edit(params, meta) {
		return nil, false
	}
	delete(params, "_meta")
	if len(meta) > 0 {
		b, err := encodeObject(meta)
		if err != nil {
			return nil, false
		}
		params["_meta"] = b
	}
	out, err := encodeObject(params)
	return out, err == nil
}

// Transport wraps an MCP transport for SEP-3182's idempotencyKey parameter
// of tools/call. On a server's transport (stdio, in-memory) it reads the
// parameter for the guard's middleware, as Handler does for Streamable
// HTTP. On a client's transport it sends the key that ClientMiddleware
// put in _meta as the parameter instead, once the server's initialize (or
// server/discover) result advertised IdempotencyCapability; to any other
// server the key stays in _meta.
func Transport(t mcp.Transport) mcp.Transport { return &sepTransport{base: t} }

type sepTransport struct{ base mcp.Transport }

func (t *sepTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &sepConn{Connection: c}, nil
}

// sepConn is a connection whose tools/call messages carry the key as
// SEP-3182 says, each way.
type sepConn struct {
	mcp.Connection
	mu         sync.Mutex
	initialize any // the id of the initialize (or server/discover) request this side sent
	advertised atomic.Bool
}

func (c *sepConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := c.Connection.Read(ctx)
	if err != nil {
		return m, err
	}
	switch m := m.(type) {
	case *jsonrpc.Request:
		if m.Method == "tools/call" && bytes.Contains(m.Params, []byte(`"`+paramKey+`"`)) {
			if params, ok := keyToMeta(m.Params); ok {
				m.Params = params
			}
		}
	case *jsonrpc.Response:
		c.mu.Lock()
		isInit := c.initialize != nil && m.ID.Raw() == c.initialize
		c.mu.Unlock()
		if isInit && m.Error == nil {
			var res struct {
				Capabilities struct {
					Experimental map[string]json.RawMessage `json:"experimental"`
				} `json:"capabilities"`
			}
			if json.Unmarshal(m.Result, &res) == nil {
				_, ok := res.Capabilities.Experimental[IdempotencyCapability]
				c.advertised.Store(ok)
			}
		}
	}
	return m, nil
}

func (c *sepConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if r, ok := m.(*jsonrpc.Request); ok {
		switch {
		case r.Method == "initialize" || r.Method == "server/discover": // the latter from protocol 2026-07-28 on
			c.mu.Lock()
			c.initialize = r.ID.Raw()
			c.mu.Unlock()
		case r.Method == "tools/call" && c.advertised.Load():
			if params, ok := metaToParam(r.Params); ok {
				sent := *r
				sent.Params = params
				m = &sent
			}
		}
	}
	return c.Connection.Write(ctx, m)
}
