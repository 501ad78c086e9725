package mcpguard_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) {
	if serveStdio() {
		return
	}
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

type invoiceIn struct {
	Customer    string `json:"customer"`
	AmountCents int    `json:"amount_cents"`
}

type invoiceOut struct {
	ID     string `json:"id"`
	Number int64  `json:"number"`
	Token  uint64 `json:"token,omitempty"`
}

// tools is a tool server's state: how often each tool ran, and what the
// next run of create_invoice does.
type tools struct {
	runs   atomic.Int64
	before func(ctx context.Context, n int64) (*mcp.CallToolResult, error) // nil: write
	// proceed, when set, holds each run of create_invoice until it
	// receives from it: duplicates arrive while the run holds.
	proceed chan struct{}
}

// newServer is an MCP server with create_invoice (typed, key argument
// declared), echo (unprotected) and raw (a low-level handler).
func (ts *tools) newServer(g *mcpguard.Guard, inner ...mcp.Middleware) *mcp.Server {
	return ts.newServerWith(g, nil, inner...)
}

// newServerWith is newServer with the server's options.
func (ts *tools) newServerWith(g *mcpguard.Guard, opts *mcp.ServerOptions, inner ...mcp.Middleware) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "invoices", Version: "v1"}, opts)
	in, err := jsonschema.For[invoiceIn](nil)
	if err != nil {
		panic(err)
	}
	mcp.AddTool(s, &mcp.Tool{Name: "create_invoice", Description: "create an invoice", InputSchema: mcpguard.KeySchema(in, "")},
		func(ctx context.Context, req *mcp.CallToolRequest, args invoiceIn) (*mcp.CallToolResult, invoiceOut, error) {
			n := ts.runs.Add(1)
			if ts.proceed != nil {
				<-ts.proceed
			}
			if ts.before != nil {
				if res, err := ts.before(ctx, n); res != nil || err != nil {
					return res, invoiceOut{}, err
				}
			}
			out := invoiceOut{ID: fmt.Sprintf("inv_%04d", n), Number: n}
			if c, ok := guard.ClaimFromContext(ctx); ok {
				out.Token = c.Token
			}
			return nil, out, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, args map[string]any) (*mcp.CallToolResult, any, error) {
		ts.runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprint(args)}}}, nil, nil
	})
	s.AddTool(&mcp.Tool{Name: "raw", InputSchema: &jsonschema.Schema{Type: "object"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		n := ts.runs.Add(1)
		return nil, &jsonrpc.Error{Code: 4001, Message: fmt.Sprintf("refused (run %d)", n)}
	})
	s.AddReceivingMiddleware(inner...) // each call wraps the handler so far: these run inside the guard
	s.AddReceivingMiddleware(g.Middleware())
	return s
}

// ledgerClient is a real LedgerService on the memory store, over gRPC.
func ledgerClient(t *testing.T) ledgerv1.LedgerServiceClient {
	t.Helper()
	return ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("tools"))).Dial(t))
}

// waitedLedgerClient is ledgerClient with its ledger, whose waiting
// duplicates a test counts (Waiters).
func waitedLedgerClient(t *testing.T) (ledgerv1.LedgerServiceClient, *ledger.Ledger) {
	t.Helper()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	return ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.LedgerServer("tools", l))).Dial(t)), l
}

// coreGuard is the guard the adapter runs on, over client.
func coreGuard(t testing.TB, client ledgerv1.LedgerServiceClient, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func newGuard(t *testing.T, client ledgerv1.LedgerServiceClient, opts ...mcpguard.Option) *mcpguard.Guard {
	t.Helper()
	g, err := mcpguard.New(coreGuard(t, client), append([]mcpguard.Option{
		mcpguard.WithTenant(mcpguard.Tenant("acme")),
		mcpguard.WithTool("create_invoice", mcpguard.NewTool(guard.Policy{Lease: 2 * time.Second})),
		mcpguard.WithTool("raw", mcpguard.Tool{}),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// serveHTTP serves s over Streamable HTTP on loopback and connects a
// client with the given sending middleware.
func serveHTTP(t *testing.T, s *mcp.Server, rt http.RoundTripper, mw ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	t.Cleanup(srv.Close)
	return connect(t, &mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: &http.Client{Transport: rt}}, mw...)
}

func connect(t *testing.T, transport mcp.Transport, mw ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	c.AddSendingMiddleware(mw...)
	cs, err := c.Connect(t.Context(), transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, key string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	params := &mcp.CallToolParams{Name: "create_invoice", Arguments: args}
	if key != "" {
		params.Meta = mcp.Meta{mcpguard.KeyMeta: key}
	}
	res, err := cs.CallTool(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// withoutReplayed is a result's JSON without the replayed marker.
func withoutReplayed(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	c := *r
	c.Meta = nil
	for k, v := range r.Meta {
		if k != mcpguard.ReplayedMeta {
			if c.Meta == nil {
				c.Meta = mcp.Meta{}
			}
			c.Meta[k] = v
		}
	}
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func wantError(t *testing.T, r *mcp.CallToolResult, code errcode.Code) mcpguard.ErrorInfo {
	t.Helper()
	info, ok := mcpguard.ErrorFromResult(r)
	if !r.IsError || !ok || info.Code != code.String() {
		b, _ := json.Marshal(r)
		t.Fatalf("result %s; want an error result %s", b, code)
	}
	if len(r.Content) != 1 || r.Content[0].(*mcp.TextContent).Text == "" {
		t.Fatalf("error result without its one line: %v", r.Content)
	}
	if sc, ok := r.StructuredContent.(map[string]any); !ok || sc["error"] == nil {
		t.Fatalf("error result without structuredContent: %v", r.StructuredContent)
	}
	return info
}

func replayed(r *mcp.CallToolResult) bool { return r.Meta[mcpguard.ReplayedMeta] == true }

func TestReplayIsTheSameJSON(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerClient(t))), http.DefaultTransport)
	args := map[string]any{"customer": "cus_1", "amount_cents": 4200}
	first := call(t, cs, "k-1", args)
	if first.IsError || replayed(first) {
		t.Fatalf("first = %+v", first)
	}
	again := call(t, cs, "k-1", map[string]any{"amount_cents": 4200.0, "customer": "cus_1"}) // equal under JCS
	if !replayed(again) || withoutReplayed(t, first) != withoutReplayed(t, again) {
		t.Fatalf("replay %s, want %s marked replayed", withoutReplayed(t, again), withoutReplayed(t, first))
	}
	if ts.runs.Load() != 1 {
		t.Fatalf("%d runs", ts.runs.Load())
	}
	// The key argument wins over _meta and is left out of the fingerprint.
	withArg := call(t, cs, "other", map[string]any{"customer": "cus_1", "amount_cents": 4200, mcpguard.DefaultKeyArgument: "k-1"})
	if !replayed(withArg) || ts.runs.Load() != 1 {
		t.Fatalf("key argument: replayed=%v, %d runs", replayed(withArg), ts.runs.Load())
	}
}

func TestErrorsAreToolResults(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	conn := ledgerClient(t)
	g := newGuard(t, conn, mcpguard.WithTool("lax", mcpguard.Tool{Policy: guard.Policy{KeyOptional: true}}))
	s := ts.newServer(g)
	mcp.AddTool(s, &mcp.Tool{Name: "lax"}, func(context.Context, *mcp.CallToolRequest, map[string]any) (*mcp.CallToolResult, any, error) {
		ts.runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	cs := serveHTTP(t, s, http.DefaultTransport)
	args := map[string]any{"customer": "cus_1", "amount_cents": 4200}
	call(t, cs, "k", args)

	changed := map[string]any{"customer": "cus_1", "amount_cents": 4300}
	info := wantError(t, call(t, cs, "k", changed), errcode.KeyReused)
	if info.Retryable {
		t.Fatal("KEY_REUSED is retryable")
	}
	wantError(t, call(t, cs, "", args), errcode.KeyMissing)
	wantError(t, call(t, cs, "bad key", args), errcode.KeyInvalid)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice", Arguments: args, Meta: mcp.Meta{mcpguard.KeyMeta: 42}})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, res, errcode.KeyInvalid)
	if ts.runs.Load() != 1 {
		t.Fatalf("refused calls ran: %d runs", ts.runs.Load())
	}
	// A tool whose key is optional runs without one, unprotected.
	for range 2 {
		if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "lax", Arguments: map[string]any{}}); err != nil || res.IsError {
			t.Fatalf("lax: %v, %v", res, err)
		}
	}
	// Tools not named pass through untouched.
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"x": 1}}); err != nil || res.IsError {
		t.Fatalf("echo: %v, %v", res, err)
	}
	if ts.runs.Load() != 4 {
		t.Fatalf("%d runs, want 4", ts.runs.Load())
	}
}

func TestResultClasses(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	declined := func(ctx context.Context, n int64) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("card declined (run %d)", n)}}}, nil
	}
	g := newGuard(t, ledgerClient(t), mcpguard.WithTool("create_invoice", mcpguard.Tool{
		KeyArgument: mcpguard.DefaultKeyArgument,
		Transient: func(r *mcp.CallToolResult) bool {
			return r.Content[0].(*mcp.TextContent).Text == "busy"
		},
	}))
	cs := serveHTTP(t, ts.newServer(g), http.DefaultTransport)
	args := map[string]any{"customer": "cus_1", "amount_cents": 1}
	try := func(key string, before func(context.Context, int64) (*mcp.CallToolResult, error)) *mcp.CallToolResult {
		ts.before = before
		return call(t, cs, key, args)
	}

	// An isError result is stored and replayed.
	first := try("declined", declined)
	again := try("declined", nil)
	if !replayed(again) || withoutReplayed(t, first) != withoutReplayed(t, again) {
		t.Fatalf("isError replay: %s vs %s", withoutReplayed(t, again), withoutReplayed(t, first))
	}
	// Unless the classifier says transient: released, the retry runs.
	busy := try("busy", func(context.Context, int64) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "busy"}}}, nil
	})
	if !busy.IsError || replayed(busy) {
		t.Fatalf("busy = %+v", busy)
	}
	if res := try("busy", nil); res.IsError || replayed(res) {
		t.Fatalf("after a transient result: %+v; want a fresh run", res)
	}
	// A Go error of a typed handler: UNAVAILABLE is transient, others are
	// stored.
	if res := try("unavailable", func(context.Context, int64) (*mcp.CallToolResult, error) {
		return nil, status.Error(codes.Unavailable, "the invoice database is failing over")
	}); !res.IsError {
		t.Fatalf("unavailable = %+v", res)
	}
	if res := try("unavailable", nil); res.IsError || replayed(res) {
		t.Fatalf("after a transient Go error: %+v", res)
	}
	try("failed", func(context.Context, int64) (*mcp.CallToolResult, error) { return nil, errors.New("invalid customer") })
	if res := try("failed", nil); !res.IsError || !replayed(res) {
		t.Fatalf("a permanent Go error's replay: %+v", res)
	}
	// A result that asks for more input releases the key: the client
	// answers it and sends the call again (same key), which runs and is
	// stored.
	asked := false
	before := ts.runs.Load()
	res := try("input", func(context.Context, int64) (*mcp.CallToolResult, error) {
		if asked {
			return nil, nil
		}
		asked = true
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Message: "confirm the amount?"}}}, nil
	})
	if res.IsError || replayed(res) || ts.runs.Load() != before+2 {
		t.Fatalf("after an input request: %+v, %d runs", res, ts.runs.Load()-before)
	}
	if res := try("input", nil); !replayed(res) {
		t.Fatalf("the completed call's replay: %+v", res)
	}
	// A low-level handler's JSON-RPC error is replayed as the same error.
	_, err1 := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "raw", Arguments: map[string]any{}, Meta: mcp.Meta{mcpguard.KeyMeta: "raw"}})
	_, err2 := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "raw", Arguments: map[string]any{}, Meta: mcp.Meta{mcpguard.KeyMeta: "raw"}})
	var w1, w2 *jsonrpc.Error
	if !errors.As(err1, &w1) || !errors.As(err2, &w2) || w1.Code != w2.Code || w1.Message != w2.Message || w1.Code != 4001 {
		t.Fatalf("raw: %v then %v", err1, err2)
	}
}

func TestLedgerDownFailsClosed(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ts := &tools{}
	cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerv1.NewLedgerServiceClient(conn))), http.DefaultTransport)
	res := call(t, cs, "k", map[string]any{"customer": "c", "amount_cents": 1})
	if info := wantError(t, res, errcode.Unavailable); !info.Retryable || info.RetryAfterMS < 1000 {
		t.Fatalf("UNAVAILABLE: %+v", info)
	}
	if ts.runs.Load() != 0 {
		t.Fatal("the tool ran with the ledger down")
	}
}

// TestParallelDuplicatesWait: fan-out of one intent: the tool runs once,
// every duplicate waits for its result (WAIT, the default) and gets it.
func TestParallelDuplicatesWait(t *testing.T) {
	t.Parallel()
	ts := &tools{proceed: make(chan struct{})}
	client, l := waitedLedgerClient(t)
	cs := serveHTTP(t, ts.newServer(newGuard(t, client)), http.DefaultTransport)
	args := map[string]any{"customer": "cus_1", "amount_cents": 4200}
	results := make([]*mcp.CallToolResult, 8)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() { results[i] = call(t, cs, "fan-out", args) })
	}
	ledgertest.Eventually(t, 10*time.Second, func() bool { return l.Waiters() == len(results)-1 }, "every duplicate waits in the ledger")
	close(ts.proceed)
	wg.Wait()
	n := 0
	for _, r := range results {
		if r.IsError || withoutReplayed(t, r) != withoutReplayed(t, results[0]) {
			t.Fatalf("answers differ: %s vs %s", withoutReplayed(t, r), withoutReplayed(t, results[0]))
		}
		if !replayed(r) {
			n++
		}
	}
	if n != 1 || ts.runs.Load() != 1 {
		t.Fatalf("%d first answers, %d runs; want 1, 1", n, ts.runs.Load())
	}
}

// TestClaimInMeta: a handler that cannot read the context finds the
// claim in the call's _meta.
func TestClaimInMeta(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	var seen atomic.Uint64
	g := newGuard(t, ledgerClient(t), mcpguard.WithClaimInMeta())
	s := ts.newServer(g, func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if c, ok := req.(*mcp.CallToolRequest); ok {
				if tok, att, ok := mcpguard.ClaimFromMeta(c.Params.Meta); ok && att == 1 {
					seen.Store(tok)
				}
			}
			return next(ctx, method, req)
		}
	})
	cs := serveHTTP(t, s, http.DefaultTransport)
	call(t, cs, "k", map[string]any{"customer": "c", "amount_cents": 1})
	if seen.Load() != 1 {
		t.Fatalf("the handler saw token %d in _meta, want 1", seen.Load())
	}
}

// TestKeySchema: tools/list shows the key argument, described for a
// model.
func TestKeySchema(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerClient(t))), http.DefaultTransport)
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if tool.Name != "create_invoice" {
			continue
		}
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Properties map[string]struct {
				Type        string `json:"type"`
				Description string `json:"description"`
			} `json:"properties"`
			Required []string `json:"required"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		p := schema.Properties[mcpguard.DefaultKeyArgument]
		if p.Type != "string" || p.Description != mcpguard.KeyDescription || len(schema.Properties) != 3 {
			t.Fatalf("input schema %s", b)
		}
		return
	}
	t.Fatal("create_invoice not listed")
}

func TestRefusesToBuild(t *testing.T) {
	t.Parallel()
	client := ledgerClient(t)
	for name, opts := range map[string][]mcpguard.Option{
		"NoTenant":  {mcpguard.WithTool("x", mcpguard.Tool{})},
		"BadName":   {mcpguard.WithTenant(mcpguard.Tenant("a")), mcpguard.WithTool("bad\nname", mcpguard.Tool{})},
		"BadPolicy": {mcpguard.WithTenant(mcpguard.Tenant("a")), mcpguard.WithTool("x", mcpguard.Tool{Policy: guard.Policy{Lease: -1}})},
	} {
		if _, err := mcpguard.New(coreGuard(t, client), opts...); err == nil {
			t.Errorf("%s: built", name)
		}
	}
	if _, err := mcpguard.New(nil, mcpguard.WithTenant(mcpguard.Tenant("a"))); err == nil {
		t.Error("built without a guard")
	}
}

// unmarshalStructured decodes a result's structuredContent.
func unmarshalStructured(r *mcp.CallToolResult, v any) error {
	b, err := json.Marshal(r.StructuredContent)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// TestRunOutlivesItsCaller: an agent that gives up on a call mid-run (its
// context ends, and the client sends notifications/cancelled) does not
// end the tool's run: it finishes under its claim, its result is stored,
// and the re-sent call gets the replay; the write ran once.
func TestRunOutlivesItsCaller(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	finished := make(chan error, 1)
	ts := &tools{before: func(ctx context.Context, n int64) (*mcp.CallToolResult, error) {
		if n == 1 {
			close(started)
			<-release
			finished <- ctx.Err()
		}
		return nil, nil
	}}
	cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerClient(t))), http.DefaultTransport)
	args := map[string]any{"customer": "c", "amount_cents": 100}
	ctx, hangUp := context.WithCancel(t.Context())
	go func() { <-started; hangUp() }()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_invoice", Arguments: args, Meta: mcp.Meta{mcpguard.KeyMeta: "k"}}); err == nil {
		t.Fatal("the call its agent gave up on was answered")
	}
	close(release)
	if err := <-finished; err != nil {
		t.Fatalf("the tool's context ended with its caller: %v", err)
	}
	res := call(t, cs, "k", args)
	var out invoiceOut
	if err := unmarshalStructured(res, &out); err != nil || out.Number != 1 || res.Meta[mcpguard.ReplayedMeta] != true || ts.runs.Load() != 1 {
		t.Fatalf("the re-sent call = %+v (%v), %d runs; want the first run's result, replayed", res, err, ts.runs.Load())
	}
}

// TestModernResultsSayComplete: on 2026-07-28 every result says its
// resultType. The SDK sets it on what a tool's handler answers; the
// answers the guard makes itself (an error result, a replay of a result
// stored by a 2025 call) say "complete" too, to a client of 2026-07-28
// only.
func TestModernResultsSayComplete(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	s := ts.newServer(newGuard(t, ledgerClient(t)))
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true}))
	t.Cleanup(srv.Close)
	post := func(version, key string) map[string]json.RawMessage {
		t.Helper()
		meta := map[string]any{mcpguard.KeyMeta: key}
		if version != "" {
			meta["io.modelcontextprotocol/protocolVersion"] = version
			meta["io.modelcontextprotocol/clientCapabilities"] = map[string]any{}
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": map[string]any{"name": "create_invoice", "arguments": map[string]any{"customer": "c", "amount_cents": 1}, "_meta": meta}})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "create_invoice")
		req.Header.Set("MCP-Protocol-Version", cmp.Or(version, "2025-06-18"))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if _, data, ok := bytes.Cut(b, []byte("data: ")); ok {
			b = data
		}
		var msg struct {
			Result map[string]json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal(b, &msg); err != nil || msg.Result == nil {
			t.Fatalf("the answer %s: %v", b, err)
		}
		return msg.Result
	}
	for _, c := range []struct{ name, version, key, want string }{
		{"a run on 2025", "", "k1", ""},
		{"its replay on 2026-07-28", "2026-07-28", "k1", `"complete"`},
		{"KEY_MISSING on 2026-07-28", "2026-07-28", "", `"complete"`},
		{"KEY_MISSING on 2025", "", "", ""},
	} {
		if got := string(post(c.version, c.key)["resultType"]); got != c.want {
			t.Errorf("%s: resultType %s, want %s", c.name, got, c.want)
		}
	}
}

// TestKeySourceIsRecorded: the record says where the guard found its key:
// the tool's key argument, SEP-3182's parameter (as Handler puts it in
// _meta), _meta, or a host's call id the tool names.
func TestKeySourceIsRecorded(t *testing.T) {
	t.Parallel()
	client := ledgerClient(t)
	host := mcpguard.NewTool(guard.Policy{})
	host.HostCallIDs = []string{"claudecode/toolUseId"}
	cs := serveHTTP(t, (&tools{}).newServer(newGuard(t, client, mcpguard.WithTool("create_invoice", host))), http.DefaultTransport)
	args := func(extra map[string]any) map[string]any {
		a := map[string]any{"customer": "c", "amount_cents": 1}
		maps.Copy(a, extra)
		return a
	}
	for _, c := range []struct {
		key, want string
		params    *mcp.CallToolParams
	}{
		{"k-arg", "argument", &mcp.CallToolParams{Arguments: args(map[string]any{mcpguard.DefaultKeyArgument: "k-arg"})}},
		{"k-meta", "meta", &mcp.CallToolParams{Arguments: args(nil), Meta: mcp.Meta{mcpguard.KeyMeta: "k-meta"}}},
		{"toolu_1", "host:claudecode/toolUseId", &mcp.CallToolParams{Arguments: args(nil), Meta: mcp.Meta{"claudecode/toolUseId": "toolu_1"}}},
	} {
		c.params.Name = "create_invoice"
		if res, err := cs.CallTool(t.Context(), c.params); err != nil || res.IsError {
			t.Fatalf("%s: %v, %v", c.key, res, err)
		}
		got, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: c.key})
		if err != nil || got.GetRecord().GetKeySource() != c.want {
			t.Errorf("%s: the record says the key came from %q (%v); want %q", c.key, got.GetRecord().GetKeySource(), err, c.want)
		}
	}
}

// TestServeJSONReadsMembersByTheirExactNames: ServeJSON reads a call's
// name, arguments and _meta by their exact names, as the server runs it:
// a "NAME" beside "name" does not take a protected call out of the guard,
// and "ARGUMENTS" beside "arguments" is not what is fingerprinted.
func TestServeJSONReadsMembersByTheirExactNames(t *testing.T) {
	t.Parallel()
	g := newGuard(t, ledgerClient(t))
	var runs atomic.Int32
	run := func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.RawMessage(fmt.Sprintf(`{"content":[{"type":"text","text":"run %d"}]}`, runs.Add(1))), nil
	}
	serve := func(params string) *mcp.CallToolResult {
		t.Helper()
		out, err := g.ServeJSON(t.Context(), json.RawMessage(params), nil, run)
		if err != nil {
			t.Fatalf("ServeJSON(%s): %v", params, err)
		}
		var r mcp.CallToolResult
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("ServeJSON(%s) = %s: %v", params, out, err)
		}
		return &r
	}
	const meta = `"_meta":{"` + mcpguard.KeyMeta + `":"exact"}`
	shadowed := `{"name":"create_invoice","NAME":"unprotected","arguments":{"amount":1},"ARGUMENTS":{"amount":2},` + meta + `}`
	first, retry := serve(shadowed), serve(shadowed)
	if n := runs.Load(); n != 1 || replayed(first) || !replayed(retry) || withoutReplayed(t, first) != withoutReplayed(t, retry) {
		t.Fatalf("a call and its retry ran %d times: %s then %s; want one run, then its replay", n, withoutReplayed(t, first), withoutReplayed(t, retry))
	}
	wantError(t, serve(`{"name":"create_invoice","arguments":{"amount":2},`+meta+`}`), errcode.KeyReused)
	if _, err := g.ServeJSON(t.Context(), json.RawMessage(`{"name":7}`), nil, run); err == nil {
		t.Fatal(`ServeJSON({"name":7}): no error; want invalid params`)
	}
}

// TestServeJSONReadsAResultByItsExactNames: ServeJSON reads a result's
// resultType and inputRequests by their exact names, as the client does.
// A result whose "RESULTTYPE" asks for input is complete to the client:
// stored, and its retry replayed, not run again. One whose resultType
// asks for input is released: its retry runs.
func TestServeJSONReadsAResultByItsExactNames(t *testing.T) {
	t.Parallel()
	g := newGuard(t, ledgerClient(t))
	for _, tc := range []struct {
		name, shape string
		runs        int32 // 1: stored and replayed; 2: released, and run again
	}{
		{"other-case", `"RESULTTYPE":"input_required","INPUTREQUESTS":{"q":{"method":"elicitation/create"}}`, 1},
		{"exact", `"resultType":"input_required","inputRequests":{"q":{"method":"elicitation/create"}}`, 2},
	} {
		var runs atomic.Int32
		run := func(context.Context, json.RawMessage) (json.RawMessage, error) {
			return json.RawMessage(fmt.Sprintf(`{"content":[{"type":"text","text":"run %d"}],%s}`, runs.Add(1), tc.shape)), nil
		}
		params := json.RawMessage(`{"name":"create_invoice","arguments":{"amount":1},"_meta":{"` + mcpguard.KeyMeta + `":"` + tc.name + `"}}`)
		var answers []string
		for range 2 {
			out, err := g.ServeJSON(t.Context(), params, nil, run)
			if err != nil {
				t.Fatalf("%s: ServeJSON: %v", tc.name, err)
			}
			answers = append(answers, string(out))
		}
		if runs.Load() != tc.runs {
			t.Errorf("%s: a call and its retry ran %d times (%s); want %d", tc.name, runs.Load(), answers, tc.runs)
		}
	}
}
