package main

import (
	"context"
	"fmt"
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
// pinned in examples/mcp-ts), run against a TypeScript SDK server with
// every fixture the suite calls (examples/mcp-ts/everything.mjs):
// directly, and through idemproxy in front of it over Streamable HTTP and
// over stdio, with the tools that log, report progress, sample and elicit
// guarded. Each run must pass the same scenarios with the same counts.

// everything starts examples/mcp-ts/everything.mjs over Streamable HTTP
// and returns its endpoint.
func everything(t *testing.T, node, dir string) string {
	t.Helper()
	return nodetest.Listen(t, exec.Command(node, filepath.Join(dir, "everything.mjs"))) + "/mcp"
}

// everythingUpstreams are everything.mjs as an upstream over Streamable
// HTTP and as a stdio child.
func everythingUpstreams(t *testing.T, node, dir string) []struct {
	name string
	up   func(*mcpConfig)
} {
	t.Helper()
	return []struct {
		name string
		up   func(*mcpConfig)
	}{
		{"StreamableHTTP", byURL(everything(t, node, dir))},
		{"Stdio", byCommand(node, filepath.Join(dir, "everything.mjs"), "--stdio")},
	}
}

// guardEverything guards the fixtures that talk to the client while they
// run. The suite sends no key, so the calls run unprotected: through the
// guard and its relay all the same.
func guardEverything(ledger string, up func(*mcpConfig)) fileConfig {
	c := config(ledger, up, policyConfig{})
	for _, name := range []string{"test_simple_text", "test_tool_with_logging", "test_tool_with_progress",
		"test_sampling", "test_elicitation", "test_elicitation_sep1034_defaults", "test_elicitation_sep1330_enums",
		"test_reconnection", "test_error_handling"} {
		c.MCP.Tools[name] = toolConfig{policyConfig: policyConfig{KeyOptional: true}}
	}
	return c
}

func TestConformanceThroughTheProxy(t *testing.T) {
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/conformance")
	direct := nodetest.Conformance(t, everything(t, node, dir))
	for name, s := range direct {
		if s.Failed > 0 {
			t.Errorf("directly, %s failed %d checks: everything.mjs lacks a fixture", name, s.Failed)
		}
	}
	ledger := ledgerAddr(t)
	for _, c := range everythingUpstreams(t, node, dir) {
		t.Run(c.name, func(t *testing.T) {
			endpoint, _ := proxy(t, guardEverything(ledger, c.up))
			nodetest.SameConformance(t, direct, nodetest.Conformance(t, endpoint), "through the proxy")
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
	for _, c := range everythingUpstreams(t, node, dir) {
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
