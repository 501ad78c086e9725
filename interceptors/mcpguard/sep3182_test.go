package mcpguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// wireLog records the tools/call params a client posts.
type wireLog struct {
	mu    sync.Mutex
	calls []map[string]json.RawMessage
}

func (l *wireLog) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return nil, err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string                     `json:"method"`
			Params map[string]json.RawMessage `json:"params"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
			l.mu.Lock()
			l.calls = append(l.calls, msg.Params)
			l.mu.Unlock()
		}
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (l *wireLog) last() map[string]json.RawMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[len(l.calls)-1]
}

// sepServer serves a guarded server over Streamable HTTP through
// mcpguard.Handler; advertise says whether it sets IdempotencyCapability.
func sepServer(t *testing.T, ts *tools, advertise bool) string {
	t.Helper()
	opts := &mcp.ServerOptions{}
	if advertise {
		opts.Capabilities = &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{},
			Experimental: map[string]any{mcpguard.IdempotencyCapability: map[string]any{}}}
	}
	s := ts.newServerWith(newGuard(t, ledgerClient(t)), opts)
	srv := httptest.NewServer(mcpguard.Handler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestClientSendsTheParameterWhenAdvertised: ClientMiddleware's key goes
// as SEP-3182's idempotencyKey parameter to a server that advertises
// IdempotencyCapability (through mcpguard.Transport), and in _meta to one
// that does not; both servers read it, and a retry of the intent is the
// replay.
func TestClientSendsTheParameterWhenAdvertised(t *testing.T) {
	t.Parallel()
	for _, advertise := range []bool{true, false} {
		ts := &tools{}
		url := sepServer(t, ts, advertise)
		wire := &wireLog{}
		cs := connect(t, mcpguard.Transport(&mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: wire}}), mcpguard.ClientMiddleware())
		_, has := cs.InitializeResult().Capabilities.Experimental[mcpguard.IdempotencyCapability]
		if has != advertise {
			t.Fatalf("advertise %v: the server's experimental capabilities: %v", advertise, cs.InitializeResult().Capabilities.Experimental)
		}
		ctx := idemclient.WithKey(t.Context(), "sep-intent-1")
		args := &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c1", "amount_cents": 100}}
		first, err := cs.CallTool(ctx, args)
		if err != nil || first.IsError {
			t.Fatalf("advertise %v: %v %+v", advertise, err, first)
		}
		sent := wire.last()
		var meta map[string]any
		_ = json.Unmarshal(sent["_meta"], &meta)
		switch {
		case advertise && (string(sent["idempotencyKey"]) != `"sep-intent-1"` || meta[mcpguard.KeyMeta] != nil):
			t.Fatalf("to a server that advertises it, the key goes as the parameter alone: %s", mustJSON(t, sent))
		case !advertise && (sent["idempotencyKey"] != nil || meta[mcpguard.KeyMeta] != "sep-intent-1"):
			t.Fatalf("to a server that does not, the key stays in _meta: %s", mustJSON(t, sent))
		}
		again, err := cs.CallTool(ctx, args)
		if err != nil || !replayed(again) || withoutReplayed(t, again) != withoutReplayed(t, first) {
			t.Fatalf("advertise %v: the retry %v %+v, want the replay of %+v", advertise, err, again, first)
		}
		if n := ts.runs.Load(); n != 1 {
			t.Fatalf("advertise %v: %d runs, want 1", advertise, n)
		}
	}
}

// TestKeyPrecedence: the key argument wins over SEP-3182's parameter,
// which wins over _meta; a parameter that is not a string is KEY_INVALID.
// The calls are posted as raw JSON-RPC, as any client may send them.
func TestKeyPrecedence(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	url := sepServer(t, ts, true)
	session := rawSession(t, url)
	post := func(params string) map[string]any {
		t.Helper()
		return session(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":` + params + `}`)
	}
	args := `"arguments":{"customer":"c1","amount_cents":100`
	// The parameter alone is the key.
	post(`{"name":"create_invoice",` + args + `},"idempotencyKey":"p-1"}`)
	if r := post(`{"name":"create_invoice",` + args + `},"_meta":{"` + mcpguard.KeyMeta + `":"p-1"}}`); r["_meta"].(map[string]any)[mcpguard.ReplayedMeta] != true {
		t.Fatalf("the parameter's key is not _meta's same key: %v", r)
	}
	// The parameter wins over _meta.
	if r := post(`{"name":"create_invoice",` + args + `},"idempotencyKey":"p-1","_meta":{"` + mcpguard.KeyMeta + `":"m-other"}}`); r["_meta"].(map[string]any)[mcpguard.ReplayedMeta] != true {
		t.Fatalf("_meta won over the parameter: %v", r)
	}
	// The argument wins over the parameter.
	if r := post(`{"name":"create_invoice",` + args + `,"idempotency_key":"p-1"},"idempotencyKey":"a-other"}`); r["_meta"].(map[string]any)[mcpguard.ReplayedMeta] != true {
		t.Fatalf("the parameter won over the argument: %v", r)
	}
	if n := ts.runs.Load(); n != 1 {
		t.Fatalf("%d runs, want 1", n)
	}
	r := post(`{"name":"create_invoice",` + args + `},"idempotencyKey":7}`)
	if info, _ := r["_meta"].(map[string]any)[mcpguard.ErrorMeta].(map[string]any); info["code"] != errcode.KeyInvalid.String() {
		t.Fatalf("a parameter that is not a string: %v", r)
	}
}

// rawSession initializes a Streamable HTTP session at url with plain
// HTTP, and returns a function that posts one request in it and returns
// its result.
func rawSession(t *testing.T, url string) func(body string) map[string]any {
	t.Helper()
	var session string
	post := func(body string) (*http.Response, []byte) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, b
	}
	res, _ := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	session = res.Header.Get("Mcp-Session-Id")
	t.Cleanup(func() { // end the session, and the server's goroutines for it
		req, err := http.NewRequest(http.MethodDelete, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Mcp-Session-Id", session)
		if res, err := http.DefaultClient.Do(req); err == nil {
			_ = res.Body.Close()
		}
	})
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return func(body string) map[string]any {
		t.Helper()
		_, b := post(body)
		// The answer is JSON, or one server-sent event whose data is.
		if i := bytes.Index(b, []byte("data: ")); i >= 0 {
			b = b[i+len("data: "):]
			if j := bytes.IndexByte(b, '\n'); j >= 0 {
				b = b[:j]
			}
		}
		var msg struct {
			Result map[string]any `json:"result"`
			Error  any            `json:"error"`
		}
		if err := json.Unmarshal(b, &msg); err != nil || msg.Result == nil {
			t.Fatalf("%s: %v %s", body, err, b)
		}
		if msg.Result["_meta"] == nil {
			msg.Result["_meta"] = map[string]any{}
		}
		return msg.Result
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTransportCarriesTheParameter: over a transport of another kind (in
// memory here; stdio alike), mcpguard.Transport on both sides sends the
// key as SEP-3182's parameter and reads it for the guard.
func TestTransportCarriesTheParameter(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	s := ts.newServerWith(newGuard(t, ledgerClient(t)), &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{
		Tools: &mcp.ToolCapabilities{}, Experimental: map[string]any{mcpguard.IdempotencyCapability: map[string]any{}},
	}})
	serverT, clientT := mcp.NewInMemoryTransports()
	ss, err := s.Connect(t.Context(), mcpguard.Transport(serverT), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	seen := &paramSeen{Transport: clientT}
	cs := connect(t, mcpguard.Transport(seen), mcpguard.ClientMiddleware())
	ctx := idemclient.WithKey(t.Context(), "mem-intent-1")
	args := &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c1", "amount_cents": 100}}
	first, err := cs.CallTool(ctx, args)
	if err != nil || first.IsError {
		t.Fatalf("%v %+v", err, first)
	}
	again, err := cs.CallTool(ctx, args)
	if err != nil || !replayed(again) || ts.runs.Load() != 1 {
		t.Fatalf("the retry: %v %+v, %d runs", err, again, ts.runs.Load())
	}
	if got := seen.keys(); len(got) != 2 || got[0] != `"mem-intent-1"` || got[1] != got[0] {
		t.Fatalf("the idempotencyKey parameters written: %v", got)
	}
}

// paramSeen is a client transport that records the idempotencyKey
// parameter of each tools/call written on it (under mcpguard.Transport).
type paramSeen struct {
	mcp.Transport
	mu   sync.Mutex
	sent []string
}

func (p *paramSeen) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := p.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &paramSeenConn{Connection: c, p: p}, nil
}

func (p *paramSeen) keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.sent...)
}

type paramSeenConn struct {
	mcp.Connection
	p *paramSeen
}

func (c *paramSeenConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if r, ok := m.(*jsonrpc.Request); ok && r.Method == "tools/call" {
		var params map[string]json.RawMessage
		_ = json.Unmarshal(r.Params, &params)
		c.p.mu.Lock()
		c.p.sent = append(c.p.sent, string(params["idempotencyKey"]))
		c.p.mu.Unlock()
	}
	return c.Connection.Write(ctx, m)
}

// TestKeyAndFingerprintFromTheArguments: a tool (echo, whose schema takes
// any arguments) that names its key by a JSON Pointer into the arguments,
// and the parts that make the fingerprint: a retry that differs only
// outside them is the replay, one that differs in them KEY_REUSED.
func TestKeyAndFingerprintFromTheArguments(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	g := newGuard(t, ledgerClient(t), mcpguard.WithTool("echo", mcpguard.Tool{
		KeyPointer: "/order/request_id", FingerprintPointers: []string{"/customer", "/amount_cents"},
	}))
	cs := serveHTTP(t, ts.newServer(g), http.DefaultTransport)
	echo := func(args map[string]any) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	args := func(id any, amount int, note string) map[string]any {
		return map[string]any{"customer": "c1", "amount_cents": amount, "order": map[string]any{"request_id": id, "note": note}}
	}
	first := echo(args("o-1", 100, "first"))
	if first.IsError || ts.runs.Load() != 1 {
		t.Fatalf("a key in the arguments: %+v", first)
	}
	if again := echo(args("o-1", 100, "second")); !replayed(again) || withoutReplayed(t, again) != withoutReplayed(t, first) {
		t.Fatalf("a change outside the fingerprint's parts: %+v, want the replay", again)
	}
	wantError(t, echo(args("o-1", 200, "first")), errcode.KeyReused)
	wantError(t, echo(args(7, 100, "first")), errcode.KeyInvalid)
	if ts.runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", ts.runs.Load())
	}
	if _, err := mcpguard.New(coreGuard(t, ledgerClient(t)), mcpguard.WithTenant(mcpguard.Tenant("acme")),
		mcpguard.WithTool("create_invoice", mcpguard.Tool{FingerprintPointers: []string{"customer"}})); err == nil {
		t.Fatal("a fingerprint pointer that is not RFC 6901 was taken")
	}
}
