package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/nodetest"
)

// The official MCP conformance suite (@modelcontextprotocol/conformance,
// pinned in examples/mcp-ts) in two versions: 0.1.16 against a server on
// the TypeScript SDK's v1 (examples/mcp-ts/everything.mjs), and
// 0.2.0-alpha.12 against one on its v2 packages, which serves 2026-07-28
// beside the 2025 revisions (everything-v2.mjs). Each runs directly, and
// through idemproxy in front of the server over Streamable HTTP and over
// stdio, with the tools that log, report progress, sample, elicit and ask
// for input in rounds guarded. Each run must pass the same scenarios with
// the same counts.

// everything starts script (everything.mjs or everything-v2.mjs) over
// Streamable HTTP and returns its endpoint.
func everything(t *testing.T, node, dir, script string) string {
	t.Helper()
	return nodetest.Listen(t, exec.Command(node, filepath.Join(dir, script))) + "/mcp"
}

// everythingUpstreams are script as an upstream over Streamable HTTP and as
// a stdio child.
func everythingUpstreams(t *testing.T, node, dir, script string) []struct {
	name string
	up   func(*mcpConfig)
} {
	t.Helper()
	return []struct {
		name string
		up   func(*mcpConfig)
	}{
		{"StreamableHTTP", byURL(everything(t, node, dir, script))},
		{"Stdio", byCommand(node, filepath.Join(dir, script), "--stdio")},
	}
}

// guardEverything guards the fixtures that talk to the client while they
// run, or ask for input in rounds. The suite sends no key, so the calls
// run unprotected: through the guard and its relay all the same. Not
// test_reconnection, whose stream the server closes mid-call for the
// suite to see the client resume it: the proxy resumes a guarded call's
// stream itself and answers in one piece, which the suite reads as a
// server without resumption.
func guardEverything(ledger string, up func(*mcpConfig)) fileConfig {
	c := config(ledger, up, policyConfig{})
	for _, name := range []string{"test_simple_text", "test_tool_with_logging", "test_tool_with_progress",
		"test_sampling", "test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums",
		"test_error_handling", "test_x_mcp_header", "test_missing_capability",
		"test_input_required_result_elicitation", "test_input_required_result_request_state",
		"test_input_required_result_multi_round", "test_input_required_result_tampered_state",
		"test_input_required_result_capabilities"} {
		c.MCP.Tools[name] = toolConfig{policyConfig: policyConfig{KeyOptional: true}}
	}
	return c
}

func TestConformanceThroughTheProxy(t *testing.T) {
	for _, c := range []struct {
		name, script string
		suite        nodetest.Suite
		// unmet are the scenarios the server fails directly: the tasks
		// extension, which the TypeScript SDK's v2 does not implement.
		unmet string
	}{
		{"2025", "everything.mjs", nodetest.Suite2025, ""},
		{"2026", "everything-v2.mjs", nodetest.Suite2026, "tasks-"},
	} {
		t.Run(c.name, func(t *testing.T) {
			node, dir := nodetest.Node(t, "../../examples/mcp-ts", c.suite.Package)
			direct := nodetest.Conformance(t, c.suite, everything(t, node, dir, c.script))
			for name, s := range direct {
				if s.Failed > 0 && (c.unmet == "" || !strings.HasPrefix(name, c.unmet)) {
					t.Errorf("directly, %s failed %d checks: %s lacks a fixture", name, s.Failed, c.script)
				}
			}
			ledger := ledgerAddr(t)
			for _, u := range everythingUpstreams(t, node, dir, c.script) {
				t.Run(u.name, func(t *testing.T) {
					endpoint, _ := proxy(t, guardEverything(ledger, u.up))
					got := nodetest.Conformance(t, c.suite, endpoint)
					want := direct
					if u.name == "Stdio" && c.name == "2026" {
						// server-sse-polling's fixture closes its
						// response stream mid-call, through the HTTP
						// transport of the server's SDK, for the suite
						// to see the client resume it. A stdio server
						// has no stream to close, so the suite sees a
						// server without resumption: it fails nothing.
						want = maps.Clone(direct)
						if g := got["server-sse-polling"]; g.Failed > 0 {
							t.Errorf("server-sse-polling failed %d checks over stdio", g.Failed)
						}
						want["server-sse-polling"] = got["server-sse-polling"]
					}
					nodetest.SameConformance(t, want, got, "through the proxy")
				})
			}
		})
	}
}

// TestProxyRelaysWhileGuarding: a guarded call with a key, in front of the
// TypeScript server over Streamable HTTP and stdio, relays what the tool
// sends its caller while it runs: progress under the caller's token, log
// messages, and a request to elicit input, answered by that caller. Its
// retry is the replay: nothing runs, nothing is asked again.
func TestProxyRelaysWhileGuarding(t *testing.T) {
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/sdk")
	ledger := ledgerAddr(t)
	for _, c := range everythingUpstreams(t, node, dir, "everything.mjs") {
		t.Run(c.name, func(t *testing.T) {
			endpoint, _ := proxy(t, guardEverything(ledger, c.up))
			var mu sync.Mutex
			var progress []string
			var logs, asked int
			cl := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, &mcp.ClientOptions{
				ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					defer mu.Unlock()
					progress = append(progress, fmt.Sprintf("%v:%v", r.Params.ProgressToken, r.Params.Progress))
				},
				// Logging is deprecated as of 2026-07-28 (SEP-2577) and still
				// relayed: the proxy passes through what its upstream speaks.
				LoggingMessageHandler: func(context.Context, *mcp.LoggingMessageRequest) { //nolint:staticcheck // above
					mu.Lock()
					defer mu.Unlock()
					logs++
				},
				ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					mu.Lock()
					defer mu.Unlock()
					asked++
					return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"response": "yes to " + r.Params.Message}}, nil
				},
			})
			cs, err := cl.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			call := func(name, key string, args map[string]any, meta mcp.Meta) string {
				t.Helper()
				m := mcp.Meta{mcpguard.KeyMeta: c.name + "-" + key} // one ledger for both
				maps.Copy(m, meta)
				res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args, Meta: m})
				if err != nil || res.IsError || len(res.Content) != 1 {
					t.Fatalf("%s: %v %+v", name, err, res)
				}
				replayed, _ := res.Meta[mcpguard.ReplayedMeta].(bool)
				return fmt.Sprintf("%v %s", replayed, res.Content[0].(*mcp.TextContent).Text)
			}
			snapshot := func() (string, int, int) {
				mu.Lock()
				defer mu.Unlock()
				return strings.Join(progress, ","), logs, asked
			}

			got := call("test_tool_with_progress", "k-progress", map[string]any{}, mcp.Meta{"progressToken": "p1"})
			if p, _, _ := snapshot(); got != "false p1" || p != "p1:0,p1:50,p1:100" {
				t.Fatalf("the guarded call with progress: %q, progress %q", got, p)
			}
			if again := call("test_tool_with_progress", "k-progress", map[string]any{}, mcp.Meta{"progressToken": "p2"}); again != "true p1" {
				t.Fatalf("its retry: %q, want the replay of the first", again)
			}
			if got := call("test_tool_with_logging", "k-log", map[string]any{}, nil); got != "false Tool with logging executed successfully" {
				t.Fatalf("the guarded call that logs: %q", got)
			}
			want := "false User response: action=accept, content={\"response\":\"yes to may I?\"}"
			if got := call("test_elicitation", "k-elicit", map[string]any{"message": "may I?"}, nil); got != want {
				t.Fatalf("the guarded call that elicits: %q, want %q", got, want)
			}
			if again := call("test_elicitation", "k-elicit", map[string]any{"message": "may I?"}, nil); again != "true"+want[5:] {
				t.Fatalf("its retry: %q", again)
			}
			if p, logs, asked := snapshot(); p != "p1:0,p1:50,p1:100" || logs != 3 || asked != 1 {
				t.Fatalf("progress %q, %d log messages, asked %d times; want the first run's only, 3 messages, asked once", p, logs, asked)
			}
		})
	}
}

// TestBridgeChecksParamHeadersAsTheSDKDoes: the bridge, as the HTTP face
// of a stdio child of 2026-07-28, checks a call's Mcp-Param-* headers
// against its arguments as the TypeScript SDK's v2 server checks them over
// HTTP: the same calls are refused (400, HeaderMismatch) and the same are
// let through, sent to everything-v2.mjs directly and through idemproxy in
// front of it over stdio.
func TestBridgeChecksParamHeadersAsTheSDKDoes(t *testing.T) {
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/server")
	direct := everything(t, node, dir, "everything-v2.mjs")
	through, _ := proxy(t, config(ledgerAddr(t), byCommand(node, filepath.Join(dir, "everything-v2.mjs"), "--stdio"), policyConfig{}))
	// post sends a call of 2026-07-28 and returns its HTTP status and
	// JSON-RPC error code (0 for none).
	post := func(endpoint, method string, params map[string]any, headers map[string]string) (int, int64) {
		t.Helper()
		params["_meta"] = modernMeta(nil)
		name, _ := params["name"].(string)
		res, err := postModern(t.Context(), endpoint, method, name, params, headers)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var msg struct {
			Error *struct {
				Code int64 `json:"code"`
			} `json:"error"`
		}
		_ = json.NewDecoder(bytes.NewReader(firstMessage(b))).Decode(&msg)
		if msg.Error == nil {
			return res.StatusCode, 0
		}
		return res.StatusCode, msg.Error.Code
	}
	// No tools/list first: the first call starts the child, whose tools
	// the bridge lists for their bindings before it checks the call.
	for _, c := range []struct {
		name    string
		args    string
		headers map[string]string
	}{
		{"FirstCallWithoutItsHeader", `{"region":"eu"}`, nil},
		{"Agrees", `{"region":"eu","count":3,"flag":true}`, map[string]string{"Mcp-Param-Region": "eu", "Mcp-Param-Count": "3", "Mcp-Param-Flag": "true"}},
		{"IntegerAsDecimal", `{"count":3}`, map[string]string{"Mcp-Param-Count": "3.0"}},
		{"IntegerAsExponent", `{"count":3}`, map[string]string{"Mcp-Param-Count": "3e0"}},
		{"Fraction", `{"count":3.5}`, map[string]string{"Mcp-Param-Count": "3.5"}},
		{"OtherInteger", `{"count":3}`, map[string]string{"Mcp-Param-Count": "4"}},
		{"IntegerMissing", `{"count":3}`, nil},
		{"UnsafeIntegerWithoutHeader", `{"count":1152921504606846976}`, nil},
		{"AbsentArgumentWithHeader", `{}`, map[string]string{"Mcp-Param-Count": "3"}},
		{"NullArgumentWithHeader", `{"count":null}`, map[string]string{"Mcp-Param-Count": "3"}},
		{"BooleanAsNumber", `{"flag":true}`, map[string]string{"Mcp-Param-Flag": "1"}},
		{"Base64", `{"region":"Zürich"}`, map[string]string{"Mcp-Param-Region": "=?base64?WsO8cmljaA==?="}},
		{"Base64Unpadded", `{"region":"Hello"}`, map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8?="}},
		{"BlankInside", `{"region":"a b"}`, map[string]string{"Mcp-Param-Region": "a b"}},
		{"AnnotationInOtherCase", `{"zone":"z1"}`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			call := func(endpoint string) (int, int64) {
				var args map[string]any
				if err := json.Unmarshal([]byte(c.args), &args); err != nil {
					t.Fatal(err)
				}
				return post(endpoint, "tools/call", map[string]any{"name": "test_x_mcp_header", "arguments": args}, c.headers)
			}
			wantStatus, wantCode := call(direct)
			if gotStatus, gotCode := call(through); gotStatus != wantStatus || gotCode != wantCode {
				t.Errorf("through the proxy: HTTP %d, error %d; the SDK's server: HTTP %d, error %d", gotStatus, gotCode, wantStatus, wantCode)
			}
		})
	}
}

// TestStdioHostWritesANumberAsTheSDKReadsIt: a host over stdio that
// spells a bound integer with an exponent (3e0), in front of the
// TypeScript SDK's v2 server over Streamable HTTP: idemproxy writes its
// Mcp-Param-* header in decimal, which that server compares as the number
// it is, and the call runs.
func TestStdioHostWritesANumberAsTheSDKReadsIt(t *testing.T) {
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/server")
	h := stdioProxy(t, config(ledgerAddr(t), byURL(everything(t, node, dir, "everything-v2.mjs")), policyConfig{}))
	h.send(`{"jsonrpc":"2.0","id":"exp","method":"tools/call","params":{"name":"test_x_mcp_header","arguments":{"region":"eu","count":3e0},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
	if text, isErr, _ := toolText(t, h.answer(json.RawMessage(`"exp"`))); isErr || text != "region=eu" {
		t.Fatalf("a bound integer spelled 3e0: %q", text)
	}
}
