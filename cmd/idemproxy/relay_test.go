package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

// TestMain serves goUpstream over stdio when the proxy under test starts
// this binary as its stdio upstream. There it has three tools more:
// crash_once, whose first attempt of a claim ends the process mid-call,
// as a SIGKILL would, and whose attempts after it answer; hang, which
// never answers; and meet, which answers once a second call of it runs.
// With IDEMPROXY_TEST_AS_MAIN it is idemproxy itself
// (TestBenchMCPRuns, BenchmarkStdioHost, the host's idemproxy --stdio).
func TestMain(m *testing.M) {
	if os.Getenv("IDEMPROXY_TEST_AS_MAIN") != "" {
		os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
	}
	if os.Getenv("IDEMPROXY_TEST_STDIO_UPSTREAM") != "" {
		// A child slow to start: it serves once its test writes to
		// the gate (a named pipe) and closes it.
		if gate := os.Getenv("IDEMPROXY_TEST_STDIO_GATE"); gate != "" {
			if err := waitGate(gate); err != nil {
				os.Exit(4)
			}
		}
		// A child that exits at once the first time: it leaves a mark
		// for the next.
		if mark := os.Getenv("IDEMPROXY_TEST_STDIO_EXIT_ONCE"); mark != "" {
			if f, err := os.OpenFile(mark, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
				_ = f.Close()
				os.Exit(3)
			}
		}
		s := (&goUpstream{}).server()
		mcp.AddTool(s, &mcp.Tool{Name: "crash_once"}, func(_ context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
			if _, attempt, _ := mcpguard.ClaimFromMeta(req.Params.Meta); attempt == 1 {
				os.Exit(3)
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
		// hang reports progress, then never answers, cancelled or not, as
		// the TypeScript SDK's servers do not answer a cancelled call.
		mcp.AddTool(s, &mcp.Tool{Name: "hang"}, func(ctx context.Context, req *mcp.CallToolRequest, _ map[string]any) (*mcp.CallToolResult, any, error) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1})
			select {}
		})
		// meet waits until a second call of it runs, then reports
		// progress under its caller's token, with its argument who as the
		// message, and answers who: two calls whose progress is in flight
		// together.
		type meeting struct {
			Who string `json:"who"`
		}
		arrived, met := 0, make(chan struct{})
		var meetMu sync.Mutex
		mcp.AddTool(s, &mcp.Tool{Name: "meet"}, func(ctx context.Context, req *mcp.CallToolRequest, a meeting) (*mcp.CallToolResult, any, error) {
			meetMu.Lock()
			if arrived++; arrived == 2 {
				close(met)
			}
			meetMu.Unlock()
			<-met
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: 1, Message: a.Who})
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Who}}}, nil, nil
		})
		_ = s.Run(context.Background(), &mcp.StdioTransport{})
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// stdioUpstream is goUpstream in a child process, over stdio.
func stdioUpstream(t *testing.T) func(*mcpConfig) {
	t.Setenv("IDEMPROXY_TEST_STDIO_UPSTREAM", "1") // the child inherits it
	return byCommand(os.Args[0], "-test.run=^$")
}

// TestProxyBoundsWhatItRelays: a tool result over max_result_bytes, over
// Streamable HTTP (events or JSON) or stdio, is not relayed: the agent
// gets OUTCOME_TOO_LARGE, not retryable, saying the tool ran; the retry
// gets the same answer without a second run; the session goes on; and
// over stdio, a 48 MiB result costs the proxy's process no more than a
// few MiB of allocation.
func TestProxyBoundsWhatItRelays(t *testing.T) {
	for _, c := range []struct {
		name     string
		upstream func(*testing.T, *goUpstream) func(*mcpConfig)
	}{
		{"StreamableHTTPEvents", func(t *testing.T, u *goUpstream) func(*mcpConfig) { return byURL(u.serve(t)) }},
		{"StreamableHTTPJSON", func(t *testing.T, u *goUpstream) func(*mcpConfig) {
			return byURL(u.serveWith(t, &mcp.StreamableHTTPOptions{JSONResponse: true}))
		}},
		{"Stdio", func(t *testing.T, _ *goUpstream) func(*mcpConfig) { return stdioUpstream(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := &goUpstream{}
			cfg := config(ledgerAddr(t), c.upstream(t, up), policyConfig{})
			cfg.MCP.Tools["big_report"] = toolConfig{}
			cfg.MCP.MaxResultBytes = 1 << 20
			endpoint, _ := proxy(t, cfg)
			cs := connect(t, endpoint, nil)
			report := func(key string, size int) *mcp.CallToolResult {
				t.Helper()
				res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "big_report", Arguments: map[string]any{"bytes": size},
					Meta: mcp.Meta{mcpguard.KeyMeta: key}})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			size := 2 << 20
			if c.name == "Stdio" {
				size = 48 << 20
			}
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			first := report("big", size)
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			info, ok := mcpguard.ErrorFromResult(first)
			if !ok || info.Code != "OUTCOME_TOO_LARGE" || info.Retryable {
				t.Fatalf("a %d-byte result over a 1 MiB bound: %s; want OUTCOME_TOO_LARGE, not retryable", size, bare(t, first))
			}
			if again := report("big", size); bare(t, again) != bare(t, first) || again.Meta[mcpguard.ReplayedMeta] != true {
				t.Fatalf("the retry: %s; want the first answer, replayed", bare(t, again))
			}
			if small := report("small", 100); small.IsError {
				t.Fatalf("a small result after the large one: %s", bare(t, small))
			}
			if c.name == "Stdio" {
				if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
					t.Fatalf("relaying a 48 MiB result over a 1 MiB bound allocated %d MiB in the proxy's process", grew>>20)
				}
			} else if n := up.reports.Load(); n != 2 {
				t.Fatalf("big_report ran %d times; want 2 (the large one once, the small one)", n)
			}
		})
	}
}

// TestProxyBoundsAPassedThroughAnswer: a tool the proxy does not guard
// is relayed as it is, up to the bound: a result over it is replaced by
// the bound's error for the call, whether the upstream answers JSON (read
// whole and sent with its length) or events, and a small one after it
// passes whole.
func TestProxyBoundsAPassedThroughAnswer(t *testing.T) {
	for name, opts := range map[string]*mcp.StreamableHTTPOptions{"JSON": {JSONResponse: true}, "Events": nil} {
		t.Run(name, func(t *testing.T) {
			up := &goUpstream{}
			cfg := config(ledgerAddr(t), byURL(up.serveWith(t, opts)), policyConfig{})
			cfg.MCP.MaxResultBytes = 1 << 20
			endpoint, _ := proxy(t, cfg)
			cs := connect(t, endpoint, nil)
			_, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "big_report", Arguments: map[string]any{"bytes": 2 << 20}})
			var werr *jsonrpc.Error
			if !errors.As(err, &werr) || werr.Code != codeTooLarge {
				t.Fatalf("a 2 MiB result of a tool passed through a 1 MiB bound: %v; want the bound's error", err)
			}
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "big_report", Arguments: map[string]any{"bytes": 100 << 10}})
			if err != nil || res.IsError {
				t.Fatalf("a 100 KiB result after it: %v %v", err, res)
			}
			if got := len(res.Content[0].(*mcp.TextContent).Text); got != 100<<10 {
				t.Fatalf("the 100 KiB result came through with %d bytes", got)
			}
			if n := up.reports.Load(); n != 2 {
				t.Fatalf("big_report ran %d times; want 2", n)
			}
		})
	}
}

// TestBoundedLinesFindsTheID: a line over the bound is replaced by the
// bound's error for the id it names, wherever the id comes; an id inside
// a nested value, or in a string, is not the message's; a line that names
// no id is dropped; lines under the bound pass as they are.
func TestBoundedLinesFindsTheID(t *testing.T) {
	big := strings.Repeat("x", 100)
	for name, c := range map[string]struct{ line, want string }{
		"IDFirst":         {`{"jsonrpc":"2.0","id":7,"result":{"text":"` + big + `"}}`, "7"},
		"IDLast":          {`{"result":{"text":"` + big + `","id":99},"jsonrpc":"2.0","id":"call-3"}`, `"call-3"`},
		"IDInAString":     {`{"result":{"text":"\"id\":5,` + big + `"},"id":8}`, "8"},
		"EscapedQuotes":   {`{"result":{"t":"\\\"}{` + big + `"} , "id" : 12 }`, "12"},
		"NoID":            {`{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"` + big + `"}}`, ""},
		"NestedIDOnly":    {`{"result":{"id":4,"text":"` + big + `"}}`, ""},
		"UnderTheBound":   {`{"id":1,"result":{}}`, `{"id":1,"result":{}}`},
		"ArrayOfMessages": {`[{"id":1,"t":"` + big + `"}]`, ""},
	} {
		t.Run(name, func(t *testing.T) {
			r := &boundedLines{in: bufio.NewReaderSize(strings.NewReader(c.line+"\n"+`{"id":2,"result":{}}`+"\n"), 16), limit: 64}
			out, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			want := []string{`{"id":2,"result":{}}`}
			switch {
			case strings.HasPrefix(c.want, "{"):
				want = append([]string{c.want}, want...)
			case c.want != "":
				want = append([]string{string(tooLargeMessage(json.RawMessage(c.want), 64))}, want...)
			}
			if strings.Join(lines, "\n") != strings.Join(want, "\n") {
				t.Fatalf("got\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
