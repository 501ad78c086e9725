package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/nodetest"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

// ledgerAddr starts a LedgerService on the memory store on loopback.
func ledgerAddr(t testing.TB) string {
	t.Helper()
	return ledgerAddrAt(t, nil)
}

// ledgerAddrAt is ledgerAddr on a ledger whose clock is now: a test moves
// leases along by moving its clock.
func ledgerAddrAt(t testing.TB, now func() time.Time) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, servertest.MemoryLedgerAt("tools", now))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// proxy runs idemproxy with cfg and returns its MCP endpoint and admin
// address. It drains when the test ends.
func proxy(t testing.TB, cfg fileConfig) (endpoint, admin string) {
	t.Helper()
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	l1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, flags{drainTimeout: 5 * time.Second}, cfg, &listeners{front: l1, admin: l2}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("idemproxy: %v", err)
		}
	})
	return "http://" + l1.Addr().String() + "/mcp", l2.Addr().String()
}

// config guards create_invoice (key in _meta or the default argument),
// one tenant.
func config(ledger string, up func(*mcpConfig), p policyConfig) fileConfig {
	var c fileConfig
	c.Ledger.Address = ledger
	c.MCP = &mcpConfig{Tenant: tenantConfig{Static: "acme"}, Tools: map[string]toolConfig{"create_invoice": {policyConfig: p}}}
	up(c.MCP)
	return c
}

func byURL(url string) func(*mcpConfig) { return func(c *mcpConfig) { c.Upstream.URL = url } }
func byCommand(argv ...string) func(*mcpConfig) {
	return func(c *mcpConfig) { c.Upstream.Command = argv }
}

// goUpstream is an MCP server with no guard of its own: create_invoice
// writes a row each time it runs (with the claim it was forwarded), echo
// is not guarded by the proxy, wait_for_cancel runs until it is cancelled.
type goUpstream struct {
	mu     sync.Mutex
	rows   []uint64 // the claim token of each write
	echoes atomic.Int64
	// reports counts the runs of big_report.
	reports atomic.Int64
	hangUp  atomic.Bool // the next create_invoice writes, then its connection is cut
	// cancels counts the notifications/cancelled it was sent over HTTP.
	cancels atomic.Int64
	// hold, when set, runs first in every create_invoice, with the claim's
	// attempt: a test holds the write there; false writes nothing.
	hold func(ctx context.Context, attempt uint32) bool
}

func (u *goUpstream) serve(t testing.TB) string {
	t.Helper()
	return u.serveWith(t, nil)
}

// server is the upstream's MCP server. Its tool big_report answers a text
// of the size it is asked for.
func (u *goUpstream) server() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "v1"}, nil)
	type args struct {
		Customer    string `json:"customer"`
		Currency    string `json:"currency"`
		AmountCents int    `json:"amount_cents"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "create_invoice"}, func(ctx context.Context, req *mcp.CallToolRequest, a args) (*mcp.CallToolResult, map[string]any, error) {
		tok, attempt, _ := mcpguard.ClaimFromMeta(req.Params.Meta)
		if u.hold != nil && !u.hold(ctx, attempt) {
			return nil, nil, ctx.Err()
		}
		u.mu.Lock()
		u.rows = append(u.rows, tok)
		n := len(u.rows)
		u.mu.Unlock()
		return nil, map[string]any{"id": fmt.Sprintf("inv_%d", n), "customer": a.Customer}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(context.Context, *mcp.CallToolRequest, map[string]any) (*mcp.CallToolResult, any, error) {
		u.echoes.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo"}}}, nil, nil
	})
	type size struct {
		Bytes int `json:"bytes"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "big_report"}, func(_ context.Context, _ *mcp.CallToolRequest, a size) (*mcp.CallToolResult, any, error) {
		u.reports.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("r", a.Bytes)}}}, nil, nil
	})
	// regional mirrors its arguments region and level into the headers
	// Mcp-Param-Region and Mcp-Param-Level (x-mcp-header): a request of
	// 2026-07-28 must carry them.
	s.AddTool(&mcp.Tool{Name: "regional", InputSchema: map[string]any{"type": "object", "properties": map[string]any{
		"region": map[string]any{"type": "string", "x-mcp-header": "Region"}, "level": map[string]any{"type": "integer", "x-mcp-header": "Level"},
	}}}, func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "region=" + string(req.Params.Arguments)}}}, nil
	})
	// wait_for_cancel reports progress once it runs, then waits until its
	// caller cancels it: a call that runs as long as a test needs.
	mcp.AddTool(s, &mcp.Tool{Name: "wait_for_cancel"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
		_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
		<-ctx.Done()
		return nil, nil, ctx.Err()
	})
	return s
}

// serveWith serves the upstream over Streamable HTTP with opts.
func (u *goUpstream) serveWith(t testing.TB, opts *mcp.StreamableHTTPOptions) string {
	t.Helper()
	s := u.server()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, opts)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"notifications/cancelled"`)) {
			u.cancels.Add(1)
		}
		if !strings.Contains(string(body), `"create_invoice"`) || !u.hangUp.CompareAndSwap(true, false) {
			h.ServeHTTP(w, r)
			return
		}
		// The call runs to its end, then the connection is cut before
		// the answer leaves.
		h.ServeHTTP(httptest.NewRecorder(), r)
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// countingUpstream serves up over Streamable HTTP with opts and counts the
// connections it accepts.
func countingUpstream(t *testing.T, up *goUpstream, opts *mcp.StreamableHTTPOptions) (string, *atomic.Int64) {
	t.Helper()
	s := up.server()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, opts))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, &conns
}

// TestProxyKeepsItsUpstreamConnections: 32 calls at once on one session,
// ten times over, half guarded and half passed through, reach the upstream
// over no more connections than there were calls at once and the
// session's own listening stream. The upstream answers JSON, which the
// proxy reads to its end before it answers: each round finds the last
// one's connections idle (see TestHTTPModeKeepsItsUpstreamConnections).
func TestProxyKeepsItsUpstreamConnections(t *testing.T) {
	t.Parallel()
	up := &goUpstream{}
	upstream, conns := countingUpstream(t, up, &mcp.StreamableHTTPOptions{JSONResponse: true})
	endpoint, _ := proxy(t, config(ledgerAddr(t), byURL(upstream), policyConfig{}))
	cs := connect(t, endpoint, http.DefaultTransport)
	const atOnce, rounds = 32, 10
	for r := range rounds {
		var wg sync.WaitGroup
		for i := range atOnce {
			wg.Go(func() {
				params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}
				if i%2 == 0 {
					params = &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 4200},
						Meta: mcp.Meta{mcpguard.KeyMeta: fmt.Sprintf("k-%d-%d", r, i)}}
				}
				if res, err := cs.CallTool(t.Context(), params); err != nil || res.IsError {
					t.Errorf("%s: %v %v", params.Name, res, err)
				}
			})
		}
		wg.Wait()
	}
	if n, e := len(up.writes()), up.echoes.Load(); n != atOnce*rounds/2 || e != atOnce*rounds/2 {
		t.Fatalf("%d writes and %d echoes, want %d of each", n, e, atOnce*rounds/2)
	}
	if n := conns.Load(); n > atOnce+1 {
		t.Errorf("the upstream accepted %d connections for %d rounds of %d calls at once, want at most %d", n, rounds, atOnce, atOnce+1)
	}
}

func (u *goUpstream) writes() []uint64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]uint64(nil), u.rows...)
}

func connect(t testing.TB, endpoint string, rt http.RoundTripper, mw ...mcp.Middleware) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	c.AddSendingMiddleware(mw...)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: rt}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func create(ctx context.Context, t testing.TB, cs *mcp.ClientSession, key string) *mcp.CallToolResult {
	t.Helper()
	params := &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 4200}}
	if key != "" {
		params.Meta = mcp.Meta{mcpguard.KeyMeta: key}
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func bare(t testing.TB, r *mcp.CallToolResult) string {
	t.Helper()
	c := *r
	c.Meta = nil
	b, err := json.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestProxyGuardsTheNamedTools(t *testing.T) {
	up := &goUpstream{}
	endpoint, admin := proxy(t, config(ledgerAddr(t), byURL(up.serve(t)), policyConfig{}))
	cs := connect(t, endpoint, http.DefaultTransport)
	first := create(t.Context(), t, cs, "k-1")
	again := create(t.Context(), t, cs, "k-1")
	if first.IsError || again.Meta[mcpguard.ReplayedMeta] != true || bare(t, first) != bare(t, again) {
		t.Fatalf("through the proxy: %s then %s", bare(t, first), bare(t, again))
	}
	if w := up.writes(); len(w) != 1 || w[0] != 1 {
		t.Fatalf("the upstream wrote %v (claim tokens); want one write under token 1", w)
	}
	// Everything else passes through: tools/list, an unguarded tool.
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil || len(list.Tools) != 5 { // create_invoice, echo, big_report, regional, wait_for_cancel
		t.Fatalf("tools/list through the proxy: %v, %v", list, err)
	}
	for range 2 {
		if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil || res.IsError {
			t.Fatalf("echo: %v, %v", res, err)
		}
	}
	if up.echoes.Load() != 2 {
		t.Fatalf("echo ran %d times, want 2 (not guarded)", up.echoes.Load())
	}
	res, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	for _, want := range []string{
		`idemproxy_tool_calls_total{result="ran",tool="create_invoice"} 1`,
		`idemproxy_tool_calls_total{result="replayed",tool="create_invoice"} 1`,
		`idemproxy_tool_calls_total{result="passthrough",tool="(other)"} 2`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for path, code := range map[string]int{"/healthz": 200, "/readyz": 200} {
		res, err := http.Get("http://" + admin + path)
		if err != nil || res.StatusCode != code {
			t.Fatalf("%s: %v, %v", path, res, err)
		}
		_ = res.Body.Close()
	}
}

// TestProxyUnknownOutcome: the upstream's connection is cut after it
// wrote. Nobody knows whether the write happened, so the call's claim is
// left to run out: UNAVAILABLE now; under HOLD, OUTCOME_UNKNOWN after the
// lease, and nothing runs again.
func TestProxyUnknownOutcome(t *testing.T) {
	up := &goUpstream{}
	up.hangUp.Store(true)
	clock := ledgertest.NewClock(time.Now())
	endpoint, _ := proxy(t, config(ledgerAddrAt(t, clock.Now), byURL(up.serve(t)), policyConfig{
		Lease: duration(300 * time.Millisecond), OnLeaseExpiry: "hold", OnInProgress: "reject",
	}))
	cs := connect(t, endpoint, http.DefaultTransport)
	res := create(t.Context(), t, cs, "k")
	if info, ok := mcpguard.ErrorFromResult(res); !ok || info.Code != "UNAVAILABLE" || !info.Retryable {
		t.Fatalf("a cut upstream call: %s", bare(t, res))
	}
	clock.Advance(400 * time.Millisecond)
	res = create(t.Context(), t, cs, "k")
	if info, ok := mcpguard.ErrorFromResult(res); !ok || info.Code != "OUTCOME_UNKNOWN" || info.Retryable {
		t.Fatalf("after the lease, under HOLD: %s", bare(t, res))
	}
	if len(up.writes()) != 1 {
		t.Fatalf("%d writes, want 1", len(up.writes()))
	}
}

// lossy loses the response of every third tools/call it carries (the call
// is delivered), so the agent's middleware re-sends it with a new
// JSON-RPC id and the same key.
type lossy struct{ n atomic.Int64 }

func (l *lossy) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Method != http.MethodPost {
		return http.DefaultTransport.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || !strings.Contains(string(body), `"create_invoice"`) || l.n.Add(1)%3 != 1 {
		return res, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	return nil, fmt.Errorf("connection reset by peer (the response was lost)")
}

// tsServer starts the TypeScript SDK's server (examples/mcp-ts) over
// Streamable HTTP and returns its endpoint; or returns the command that
// runs it over stdio.
func tsServer(t *testing.T, stdio bool) func(*mcpConfig) {
	t.Helper()
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/sdk")
	script := filepath.Join(dir, "server.mjs")
	if stdio {
		return byCommand(node, script, "--stdio", "--delay-ms", "50")
	}
	return byURL(nodetest.Listen(t, exec.Command(node, script, "--delay-ms", "50")) + "/mcp")
}

// TestProxyInFrontOfATypeScriptServer: an MCP server written with the
// official TypeScript SDK, with no idempotency of its own, behind the
// proxy (over Streamable HTTP and over stdio). An agent sends 12 intents,
// each also retried, with a response lost every third send, and 8
// parallel duplicates of one more intent: the server writes once per
// intent, and every answer of an intent is the same result.
func TestProxyInFrontOfATypeScriptServer(t *testing.T) {
	for _, stdio := range []bool{false, true} {
		t.Run(map[bool]string{false: "StreamableHTTP", true: "Stdio"}[stdio], func(t *testing.T) {
			endpoint, _ := proxy(t, config(ledgerAddr(t), tsServer(t, stdio), policyConfig{}))
			cs := connect(t, endpoint, &lossy{}, mcpguard.ClientMiddleware(mcpguard.WithBackoff(5*time.Millisecond, 50*time.Millisecond)))
			const intents = 12
			for i := range intents {
				ctx := idemclient.WithKey(t.Context(), fmt.Sprintf("intent-%d", i))
				first := create(ctx, t, cs, "")
				retry := create(ctx, t, cs, "")
				if first.IsError || bare(t, first) != bare(t, retry) || retry.Meta[mcpguard.ReplayedMeta] != true {
					t.Fatalf("intent %d: %s then %s", i, bare(t, first), bare(t, retry))
				}
			}
			ctx := idemclient.WithKey(t.Context(), "fan-out")
			answers := make([]string, 8)
			var wg sync.WaitGroup
			for i := range answers {
				wg.Go(func() { answers[i] = bare(t, create(ctx, t, cs, "")) })
			}
			wg.Wait()
			for _, a := range answers {
				if a != answers[0] || strings.Contains(a, `"isError":true`) {
					t.Fatalf("fan-out answers differ: %s vs %s", a, answers[0])
				}
			}
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "count_writes", Arguments: map[string]any{}})
			if err != nil || len(res.Content) != 1 {
				t.Fatalf("count_writes: %v, %v", res, err)
			}
			var count struct{ Rows int }
			if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &count); err != nil || count.Rows != intents+1 {
				t.Fatalf("the TypeScript server wrote %d rows for %d intents (%v)", count.Rows, intents+1, err)
			}
		})
	}
}

// TestProxyReadsTheToolsNameAsItsServerDoes: a tools/call of the guarded
// create_invoice whose params also carry "NAME" (which Go's encoding/json
// would read into a struct's Name, and JSON.parse and the SDKs do not)
// is guarded as the call of the tool the server runs: in front of a
// TypeScript server over Streamable HTTP and over stdio, the write runs
// once and its retry is the replay.
func TestProxyReadsTheToolsNameAsItsServerDoes(t *testing.T) {
	for _, stdio := range []bool{false, true} {
		t.Run(map[bool]string{false: "StreamableHTTP", true: "Stdio"}[stdio], func(t *testing.T) {
			endpoint, _ := proxy(t, config(ledgerAddr(t), tsServer(t, stdio), policyConfig{}))
			cs := connect(t, endpoint, rewritePosts{http.DefaultTransport, shadowName})
			// Read as encoding/json reads a struct, the call is a ping that
			// the server answers as a tool call: a bound, so that such a
			// reading fails here rather than hangs.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			first := create(ctx, t, cs, "shadowed")
			retry := create(ctx, t, cs, "shadowed")
			if first.IsError || bare(t, first) != bare(t, retry) || retry.Meta[mcpguard.ReplayedMeta] != true {
				t.Fatalf("a write, then its retry: %s then %s (replayed %v)", bare(t, first), bare(t, retry), retry.Meta[mcpguard.ReplayedMeta])
			}
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "count_writes", Arguments: map[string]any{}})
			if err != nil || len(res.Content) != 1 {
				t.Fatalf("count_writes: %v, %v", res, err)
			}
			var count struct{ Rows int }
			if err := json.Unmarshal([]byte(res.Content[0].(*mcp.TextContent).Text), &count); err != nil || count.Rows != 1 {
				t.Fatalf("the TypeScript server wrote %d rows for one intent (%v)", count.Rows, err)
			}
		})
	}
}

// shadowName adds members that name another tool and method beside the
// name and method of every create_invoice it posts.
func shadowName(body []byte) []byte {
	if !bytes.Contains(body, []byte(`"name":"create_invoice"`)) {
		return body
	}
	body = bytes.Replace(body, []byte(`"name":"create_invoice"`), []byte(`"name":"create_invoice","NAME":"count_writes"`), 1)
	return bytes.Replace(body, []byte(`"method":"tools/call"`), []byte(`"method":"tools/call","METHOD":"ping","PARAMS":{}`), 1)
}

func TestRefusesBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	for name, text := range map[string]string{
		"NoMCP":          "ledger: {address: 127.0.0.1:1}\n",
		"TwoUpstreams":   "mcp: {upstream: {url: http://x, command: [x]}, tenant: {static: a}, tools: {t: {}}}\n",
		"NoTenant":       "mcp: {upstream: {url: http://x}, tools: {t: {}}}\n",
		"NoTools":        "mcp: {upstream: {url: http://x}, tenant: {static: a}}\n",
		"UnknownField":   "mcp: {upstream: {url: http://x}, tenant: {static: a}, tools: {t: {leese: 1s}}}\n",
		"BadDuration":    "mcp: {upstream: {url: http://x}, tenant: {static: a}, tools: {t: {lease: soon}}}\n",
		"BadPolicy":      "mcp: {upstream: {url: http://x}, tenant: {static: a}, tools: {t: {on_in_progress: queue}}}\n",
		"NegativeLease":  "mcp: {upstream: {url: http://x}, tenant: {static: a}, tools: {t: {lease: -1s}}}\n",
		"BadToolName":    "mcp: {upstream: {url: http://x}, tenant: {static: a}, tools: {\"bad\\nname\": {}}}\n",
		"MissingConfig":  "",
		"TwoTenantRules": "mcp: {upstream: {url: http://x}, tenant: {static: a, header: X-T}, tools: {t: {}}}\n",
		"TwoModes":       "mcp: {upstream: {url: http://x}, tenant: {static: a}, tools: {t: {}}}\nhttp: {upstream: http://x, tenant: {static: a}, routes: {\"POST /x\": {}}}\n",
		"HTTPBadURL":     "http: {upstream: x, tenant: {static: a}, routes: {\"POST /x\": {}}}\n",
		"HTTPArgTenant":  "http: {upstream: http://x, tenant: {argument: a}, routes: {\"POST /x\": {}}}\n",
		"HTTPNoRoutes":   "http: {upstream: http://x, tenant: {static: a}}\n",
		"HTTPBadStatus":  "http: {upstream: http://x, tenant: {static: a}, routes: {\"POST /x\": {release: [42]}}}\n",
		"HTTPHostRoute":  "http: {upstream: http://x, tenant: {static: a}, routes: {\"example.com/x\": {}}}\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".yaml")
			if text != "" {
				if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			var stderr bytes.Buffer
			code := cli([]string{"--config", path, "--listen", "127.0.0.1:0", "--admin-listen", ""}, io.Discard, &stderr)
			if code == 0 {
				t.Fatalf("exit 0; stderr:\n%s", stderr.String())
			}
		})
	}
}

// TestDrainFinishesCallsInFlight: when the proxy is told to stop, a call
// already running finishes and is answered; then the proxy exits.
func TestDrainFinishesCallsInFlight(t *testing.T) {
	up := &goUpstream{}
	forward := proxyTo(up.serve(t))
	calling := make(chan struct{}, 1) // the tools/call reached the upstream
	proceed := make(chan struct{})    // and holds until the drain has begun
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"tools/call"`)) {
				calling <- struct{}{}
				<-proceed
			}
		}
		forward.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { slow.CloseClientConnections(); slow.Close() })
	cfg := config(ledgerAddr(t), byURL(slow.URL), policyConfig{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, flags{drainTimeout: 5 * time.Second}, cfg, &listeners{front: l}, slog.New(slog.DiscardHandler))
	}()
	cs := connect(t, "http://"+l.Addr().String()+"/mcp", http.DefaultTransport)
	answered := make(chan *mcp.CallToolResult, 1)
	go func() { answered <- create(context.Background(), t, cs, "k") }()
	<-calling
	cancel()
	// The drain has begun when the proxy's listener takes no more
	// connections; the call in flight is still held upstream.
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	}, "the proxy stops taking connections")
	close(proceed)
	if res := <-answered; res.IsError {
		t.Fatalf("the call in flight: %s", bare(t, res))
	}
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
}

// proxyTo forwards a request to url, flushing as it goes (server-sent
// events).
func proxyTo(target string) http.Handler {
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	return rp
}

// TestExampleConfiguration: the example files in the repository load.
func TestExampleConfiguration(t *testing.T) {
	cfg, err := loadConfig("idemproxy.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.MCP.Tools) != 2 || cfg.MCP.Tenant.Header != "X-Tenant" || cfg.Ledger.Address == "" {
		t.Fatalf("%+v", cfg)
	}
	email, err := cfg.MCP.Tools["send_email"].tool(time.Duration(cfg.MCP.RunTimeout))
	if err != nil || email.Policy.OnLeaseExpiry.String() != "HOLD" || email.KeyArgument != mcpguard.DefaultKeyArgument || email.Policy.RunTimeout != time.Minute {
		t.Fatalf("send_email: %+v, %v; want HOLD, the default key argument and the section's 1m run timeout", email, err)
	}
	cfg, err = loadConfig("idemproxy.http.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	patch, err := cfg.HTTP.Routes["PATCH /v1/invoices/{id}"].route(time.Duration(cfg.HTTP.RunTimeout), cfg.HTTP.Stripe)
	if err != nil || !patch.Release(500) || patch.Release(400) || len(cfg.HTTP.Routes) != 2 {
		t.Fatalf("the HTTP example: %+v, %v", cfg.HTTP, err)
	}
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// TestProxyRunOutlivesTheAgent: an agent that gives up on a call while
// the upstream writes does not cut the upstream call: the cancellation
// its client sends is not forwarded, the call finishes, its result is
// stored, and the re-sent call gets the replay; the upstream wrote once.
// A cancellation of a request that is not a guarded run is forwarded.
func TestProxyRunOutlivesTheAgent(t *testing.T) {
	started, release := make(chan struct{}, 1), make(chan struct{})
	up := &goUpstream{hold: func(_ context.Context, attempt uint32) bool {
		if attempt == 1 {
			started <- struct{}{}
			<-release
		}
		return true
	}}
	endpoint, _ := proxy(t, config(ledgerAddr(t), byURL(up.serve(t)), policyConfig{}))
	let := sync.OnceFunc(func() { close(release) })
	t.Cleanup(let) // before the proxy drains, when the test fails early
	// The client's notifications/cancelled, once the proxy has answered
	// it, and the session it was sent in.
	cancelled, session := make(chan struct{}, 1), make(chan string, 1)
	cs := connect(t, endpoint, roundTripFunc(func(r *http.Request) (*http.Response, error) {
		var body []byte
		if r.Body != nil { // a GET has none
			var err error
			if body, err = io.ReadAll(r.Body); err != nil {
				return nil, err
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		res, err := http.DefaultTransport.RoundTrip(r)
		if err == nil && bytes.Contains(body, []byte(`"notifications/cancelled"`)) {
			session <- r.Header.Get("Mcp-Session-Id")
			cancelled <- struct{}{}
		}
		return res, err
	}))
	ctx, giveUp := context.WithCancel(t.Context())
	go func() { <-started; giveUp() }()
	params := &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 4200}, Meta: mcp.Meta{mcpguard.KeyMeta: "k"}}
	if _, err := cs.CallTool(ctx, params); err == nil {
		t.Fatal("the call its agent gave up on was answered")
	}
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the client sent no notifications/cancelled for the call it gave up on")
	}
	if n := up.cancels.Load(); n != 0 {
		t.Fatalf("the upstream was sent %d cancellations of the guarded run; want none", n)
	}
	let()
	res := create(t.Context(), t, cs, "k")
	if res.IsError || res.Meta[mcpguard.ReplayedMeta] != true || len(up.writes()) != 1 {
		t.Fatalf("the re-sent call = %s, writes %v; want the first write's result, replayed", bare(t, res), up.writes())
	}

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint,
		strings.NewReader(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}`))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2025-11-25", "Mcp-Session-Id": <-session} {
		req.Header.Set(k, v)
	}
	other, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = other.Body.Close()
	if n := up.cancels.Load(); other.StatusCode != http.StatusAccepted || n != 1 {
		t.Fatalf("a cancellation of no guarded run: HTTP %d, the upstream sent %d; want 202, and it forwarded", other.StatusCode, n)
	}
}

// TestProxyRunTimeout: a tool's run timeout ends an upstream call that
// hangs: the agent is told nobody knows whether it was done, the claim
// is not released, and after the lease the re-sent call takes over.
func TestProxyRunTimeout(t *testing.T) {
	up := &goUpstream{hold: func(ctx context.Context, attempt uint32) bool {
		if attempt == 1 {
			// An upstream that never answers, until the proxy gives up on
			// it or the test ends.
			select {
			case <-ctx.Done():
			case <-t.Context().Done():
			}
			return false
		}
		return true
	}}
	clock := ledgertest.NewClock(time.Now())
	endpoint, _ := proxy(t, config(ledgerAddrAt(t, clock.Now), byURL(up.serve(t)), policyConfig{
		Lease: duration(2 * time.Second), RunTimeout: duration(100 * time.Millisecond), OnInProgress: "reject",
	}))
	cs := connect(t, endpoint, http.DefaultTransport)
	res := create(t.Context(), t, cs, "k")
	if info, ok := mcpguard.ErrorFromResult(res); !ok || info.Code != "UNAVAILABLE" || !info.Retryable {
		t.Fatalf("a hung upstream past the run timeout: %s", bare(t, res))
	}
	if info, ok := mcpguard.ErrorFromResult(create(t.Context(), t, cs, "k")); !ok || info.Code != "IN_PROGRESS" {
		t.Fatalf("right after: %+v; want IN_PROGRESS (the claim is not released)", info)
	}
	clock.Advance(3 * time.Second)
	if res := create(t.Context(), t, cs, "k"); res.IsError || len(up.writes()) != 1 || up.writes()[0] != 2 {
		t.Fatalf("after the lease: %s, writes %v; want the takeover's write under token 2", bare(t, res), up.writes())
	}
}

// TestVersionFlag: idemproxy --version prints its build and exits 0.
func TestVersionFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := cli([]string{"--version"}, &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "idemproxy ") || !strings.Contains(stdout.String(), " go1.") {
		t.Fatalf("idemproxy --version: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
}

// TestProxyAdvertisesAndStripsTheKey: the proxy's tools/list adds the key
// argument to a guarded tool's input schema, described for a model; a
// call that carries the key there reaches an upstream whose schema does
// not declare it without it, and its retry is a replay. With
// upstream_declares_key the argument is the upstream's own: advertised as
// it wrote it, and forwarded.
func TestProxyAdvertisesAndStripsTheKey(t *testing.T) {
	up := &goUpstream{}
	upstreamURL := up.serve(t)
	// The upstream's schema is strict: sent the key, it refuses the call.
	direct := connect(t, upstreamURL, http.DefaultTransport)
	if res, err := direct.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{
		"customer": "cus_1", "currency": "EUR", "amount_cents": 1, mcpguard.DefaultKeyArgument: "k",
	}}); err == nil && !res.IsError {
		t.Fatal("the upstream took an argument its schema does not declare: the test proves nothing")
	}
	if len(up.writes()) != 0 {
		t.Fatalf("the refused direct call wrote: %v", up.writes())
	}

	endpoint, _ := proxy(t, config(ledgerAddr(t), byURL(upstreamURL), policyConfig{}))
	cs := connect(t, endpoint, http.DefaultTransport)
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		props, _ := tool.InputSchema.(map[string]any)["properties"].(map[string]any)
		key, advertised := props[mcpguard.DefaultKeyArgument].(map[string]any)
		switch tool.Name {
		case "create_invoice":
			if !advertised || key["type"] != "string" || key["description"] != mcpguard.KeyDescription || props["customer"] == nil {
				t.Fatalf("create_invoice's schema through the proxy: %v", tool.InputSchema)
			}
		default:
			if advertised {
				t.Fatalf("%s is not guarded, yet its schema has the key: %v", tool.Name, tool.InputSchema)
			}
		}
	}
	params := &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{
		"customer": "cus_1", "currency": "EUR", "amount_cents": 4200, mcpguard.DefaultKeyArgument: "arg-key-1",
	}}
	first, err := cs.CallTool(t.Context(), params)
	if err != nil || first.IsError {
		t.Fatalf("a call with the key argument: %v %+v", err, first)
	}
	again, err := cs.CallTool(t.Context(), params)
	if err != nil || again.Meta[mcpguard.ReplayedMeta] != true || bare(t, again) != bare(t, first) {
		t.Fatalf("its retry: %v %+v, want the replay of %+v", err, again, first)
	}
	if w := up.writes(); len(w) != 1 {
		t.Fatalf("%d writes, want 1", len(w))
	}

	// The argument's name spelled with an escape is the same argument:
	// the key is read, and removed before the strict upstream.
	escaped := connect(t, endpoint, rewritePosts{http.DefaultTransport, escapeKeyName})
	params.Arguments.(map[string]any)[mcpguard.DefaultKeyArgument] = "arg-key-escaped"
	for i := range 2 {
		res, err := escaped.CallTool(t.Context(), params)
		if err != nil || res.IsError || (i == 1) != (res.Meta[mcpguard.ReplayedMeta] == true) {
			t.Fatalf("call %d with the escaped key argument: %v %+v", i, err, res)
		}
	}
	if w := up.writes(); len(w) != 2 {
		t.Fatalf("%d writes, want 2", len(w))
	}

	// An upstream that declares the key itself gets it.
	var seen atomic.Value
	own := mcp.NewServer(&mcp.Implementation{Name: "own-key", Version: "v1"}, nil)
	type args struct {
		Customer       string `json:"customer"`
		IdempotencyKey string `json:"idempotency_key" jsonschema:"the upstream's own words"`
	}
	mcp.AddTool(own, &mcp.Tool{Name: "create_invoice"}, func(_ context.Context, _ *mcp.CallToolRequest, a args) (*mcp.CallToolResult, map[string]any, error) {
		seen.Store(a.IdempotencyKey)
		return nil, map[string]any{"id": "inv_own"}, nil
	})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return own }, nil))
	t.Cleanup(srv.Close)
	cfg := config(ledgerAddr(t), byURL(srv.URL), policyConfig{})
	tc := cfg.MCP.Tools["create_invoice"]
	tc.UpstreamDeclaresKey = true
	cfg.MCP.Tools["create_invoice"] = tc
	endpoint, _ = proxy(t, cfg)
	cs = connect(t, endpoint, http.DefaultTransport)
	tools, err = cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := tools.Tools[0].InputSchema.(map[string]any)["properties"].(map[string]any)[mcpguard.DefaultKeyArgument].(map[string]any)
	if key["description"] != "the upstream's own words" {
		t.Fatalf("the upstream's own key argument through the proxy: %v", tools.Tools[0].InputSchema)
	}
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "cus_1", "idempotency_key": "own-1"}}); err != nil || res.IsError {
		t.Fatalf("a call to the upstream that declares the key: %v %+v", err, res)
	}
	if seen.Load() != "own-1" {
		t.Fatalf("the upstream that declares the key got %v", seen.Load())
	}
}

// escapeKeyName spells the default key argument's name with a JSON escape.
func escapeKeyName(body []byte) []byte {
	return bytes.ReplaceAll(body, []byte(`"`+mcpguard.DefaultKeyArgument+`"`), []byte(`"idempotency\u005fkey"`))
}

// rewritePosts rewrites the body of every message a client posts.
type rewritePosts struct {
	base    http.RoundTripper
	rewrite func([]byte) []byte
}

func (r rewritePosts) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil {
		return r.base.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	body = r.rewrite(body)
	req = req.Clone(req.Context())
	req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	req.Header.Del("Content-Length")
	return r.base.RoundTrip(req)
}

// TestProxyReadsSEP3182: the proxy advertises tools.idempotency, and an
// agent whose client sends its key as SEP-3182's idempotencyKey parameter
// (mcpguard.Transport and ClientMiddleware) gets one write and the replay.
func TestProxyReadsSEP3182(t *testing.T) {
	up := &goUpstream{}
	endpoint, _ := proxy(t, config(ledgerAddr(t), byURL(up.serve(t)), policyConfig{}))
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	c.AddSendingMiddleware(mcpguard.ClientMiddleware())
	cs, err := c.Connect(t.Context(), mcpguard.Transport(&mcp.StreamableClientTransport{Endpoint: endpoint}), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	if _, ok := cs.InitializeResult().Capabilities.Experimental[mcpguard.IdempotencyCapability]; !ok {
		t.Fatalf("the proxy's experimental capabilities: %v", cs.InitializeResult().Capabilities.Experimental)
	}
	ctx := idemclient.WithKey(t.Context(), "sep-through-proxy")
	params := &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 4200}}
	first, err := cs.CallTool(ctx, params)
	if err != nil || first.IsError {
		t.Fatalf("%v %+v", err, first)
	}
	again, err := cs.CallTool(ctx, params)
	if err != nil || again.Meta[mcpguard.ReplayedMeta] != true || bare(t, again) != bare(t, first) || len(up.writes()) != 1 {
		t.Fatalf("the retry: %v %+v, %d writes", err, again, len(up.writes()))
	}
}

// TestAdvertiseKeysWithoutProperties: a guarded tool whose schema names no
// properties, or that has no schema, gets the key argument all the same.
func TestAdvertiseKeysWithoutProperties(t *testing.T) {
	f := &front{keys: map[string]string{"a": "idempotency_key", "b": "idempotency_key"}}
	msg := f.advertiseKeys([]byte(`{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a","inputSchema":{"type":"object"}},{"name":"b"}],"nextCursor":"c"}}`))
	var list mcp.ListToolsResult
	var res struct {
		Result *mcp.ListToolsResult `json:"result"`
	}
	res.Result = &list
	if err := json.Unmarshal(msg, &res); err != nil || list.NextCursor != "c" || len(list.Tools) != 2 {
		t.Fatalf("%s: %v", msg, err)
	}
	for _, tool := range list.Tools {
		props, _ := tool.InputSchema.(map[string]any)["properties"].(map[string]any)
		if key, _ := props["idempotency_key"].(map[string]any); key["description"] != mcpguard.KeyDescription {
			t.Errorf("%s: %v", tool.Name, tool.InputSchema)
		}
	}
}
