package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/nodetest"
)

// v2Server is examples/mcp-ts/server-v2.mjs, a server on the TypeScript
// SDK's v2 packages that serves 2026-07-28 beside the 2025 revisions, as
// an upstream over Streamable HTTP or over stdio.
func v2Server(t *testing.T, stdio bool) func(*mcpConfig) {
	t.Helper()
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/server")
	script := filepath.Join(dir, "server-v2.mjs")
	if stdio {
		return byCommand(node, script, "--stdio")
	}
	return byURL(nodetest.Listen(t, exec.Command(node, script)) + "/mcp")
}

// v2Result is a tool result as client-v2.mjs prints it.
type v2Result struct {
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	IsError bool `json:"isError"`
	Meta    struct {
		Replayed bool                `json:"io.idemledger/replayed"`
		Error    *mcpguard.ErrorInfo `json:"io.idemledger/error"`
	} `json:"_meta"`
}

func (r v2Result) text() string {
	if len(r.Content) != 1 {
		return fmt.Sprintf("(%d contents)", len(r.Content))
	}
	return r.Content[0].Text
}

// v2Run is what client-v2.mjs prints.
type v2Run struct {
	Era                   string
	First, Retry, Changed v2Result
	ArgKey, ArgKeyRetry   v2Result
	Charge, ChargeRetry   v2Result
	Asked                 int
	Count                 struct{ Invoices, Charges int }
}

// runV2Client runs client-v2.mjs against endpoint with the version
// negotiation mode (auto, pin or legacy). An endpoint of "stdio" and a
// command after it run the command as the client's server over stdio.
func runV2Client(t *testing.T, endpoint, mode, prefix string, command ...string) v2Run {
	t.Helper()
	node, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/client")
	args := []string{filepath.Join(dir, "client-v2.mjs"), endpoint, mode, prefix}
	if len(command) > 0 {
		args = append(append(args, "--"), command...)
	}
	cmd := exec.CommandContext(t.Context(), node, args...)
	cmd.Env = append(os.Environ(), "IDEMPROXY_TEST_AS_MAIN=1") // a command of this binary is idemproxy's cli
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if e, ok := err.(*exec.ExitError); ok { //nolint:errorlint // the command's own error
			ee = e
		}
		t.Fatalf("client-v2.mjs %s: %v\n%s", mode, err, stderrOf(ee))
	}
	var run v2Run
	if err := json.Unmarshal(out, &run); err != nil {
		t.Fatalf("client-v2.mjs printed %s: %v", out, err)
	}
	return run
}

// stdioConfigFile writes cfg's ledger, upstream command and tools as the
// file a host's idemproxy --stdio reads.
func stdioConfigFile(t testing.TB, cfg fileConfig) string {
	t.Helper()
	argv, err := json.Marshal(cfg.MCP.Upstream.Command)
	if err != nil {
		t.Fatal(err)
	}
	var tools strings.Builder
	for name := range cfg.MCP.Tools {
		fmt.Fprintf(&tools, "    %s: {}\n", name)
	}
	path := filepath.Join(t.TempDir(), "idemproxy.yaml")
	body := fmt.Sprintf("ledger:\n  address: %s\nmcp:\n  upstream:\n    command: %s\n  tenant: {static: %s}\n  tools:\n%s",
		cfg.Ledger.Address, argv, cfg.MCP.Tenant.Static, tools.String())
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func stderrOf(e *exec.ExitError) []byte {
	if e == nil {
		return nil
	}
	return e.Stderr
}

// TestProxyServesTheV2SDK: the official TypeScript SDK's v2 client, on
// the 2026-07-28 revision (negotiated by server/discover, and pinned) and
// on the 2025 handshake, through the proxy in front of a v2 server over
// Streamable HTTP and over stdio, and running `idemproxy --config FILE
// --stdio` itself as its server over stdio, as a host does (in front of
// the v2 server over stdio). For each: a key in _meta runs the write
// once and its retry is the marked replay; the key with another payload
// is KEY_REUSED; a key in the tool's argument does the same; a charge that
// asks for a confirmation first (an input_required round on 2026-07-28, an
// elicitation on 2025) runs once, its confirmation asked once, and its
// retry is the replay, asked nothing.
func TestProxyServesTheV2SDK(t *testing.T) {
	for _, path := range []string{"StreamableHTTP", "Stdio", "StdioHost"} {
		t.Run(path, func(t *testing.T) {
			stdio, host := path != "StreamableHTTP", path == "StdioHost"
			cfg := config(ledgerAddr(t), v2Server(t, stdio), policyConfig{})
			cfg.MCP.Tools["charge"] = toolConfig{}
			var endpoint string
			var command []string
			if host {
				endpoint, command = "stdio", []string{os.Args[0], "--config", stdioConfigFile(t, cfg), "--stdio"}
			} else {
				endpoint, _ = proxy(t, cfg)
			}
			invoices, charges := 0, 0
			for _, mode := range []string{"auto", "pin", "legacy"} {
				t.Run(mode, func(t *testing.T) {
					run := runV2Client(t, endpoint, mode, mode, command...)
					if want := map[string]string{"auto": "modern", "pin": "modern", "legacy": "legacy"}[mode]; run.Era != want {
						t.Errorf("the client's era: %q, want %q", run.Era, want)
					}
					for _, c := range []struct {
						name          string
						first, replay v2Result
					}{{"a key in _meta", run.First, run.Retry}, {"a key argument", run.ArgKey, run.ArgKeyRetry}, {"the confirmed charge", run.Charge, run.ChargeRetry}} {
						if c.first.IsError || c.first.Meta.Replayed || !c.replay.Meta.Replayed || c.first.text() != c.replay.text() {
							t.Errorf("%s: %+v, then %+v; want a run, then its marked replay", c.name, c.first, c.replay)
						}
					}
					if e := run.Changed.Meta.Error; e == nil || e.Code != "KEY_REUSED" || e.Retryable {
						t.Errorf("the key with another amount: %+v; want KEY_REUSED", run.Changed)
					}
					if run.Asked != 1 {
						t.Errorf("the client was asked %d times to confirm the charge; want once", run.Asked)
					}
					// Over stdio a 2025 session has a child of its own,
					// which holds its own rows; a host's idemproxy runs
					// children of its own.
					wantInvoices, wantCharges := 2, 1
					if !host && (!stdio || mode != "legacy") {
						invoices, charges = invoices+2, charges+1
						wantInvoices, wantCharges = invoices, charges
					}
					if run.Count.Invoices != wantInvoices || run.Count.Charges != wantCharges {
						t.Errorf("the server holds %d invoices and %d charges; want %d and %d", run.Count.Invoices, run.Count.Charges, wantInvoices, wantCharges)
					}
				})
			}
		})
	}
}

// TestProxyBoundsAV2StdioResult: a 20 MiB result of a v2 server over
// stdio (which writes the message's id after its result) is over the
// relay bound: OUTCOME_TOO_LARGE, not retryable, saying the tool ran; its
// retry gets the same answer; and the session goes on, on either era.
func TestProxyBoundsAV2StdioResult(t *testing.T) {
	cfg := config(ledgerAddr(t), v2Server(t, true), policyConfig{})
	cfg.MCP.Tools["big_report"] = toolConfig{}
	endpoint, _ := proxy(t, cfg)
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		t.Run(version, func(t *testing.T) {
			c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
			cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint}, &mcp.ClientSessionOptions{ProtocolVersion: version})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.Close() })
			report := func() *mcp.CallToolResult {
				t.Helper()
				res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "big_report", Arguments: map[string]any{"bytes": 20 << 20},
					Meta: mcp.Meta{mcpguard.KeyMeta: "big-" + version}})
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			first := report()
			if info, ok := mcpguard.ErrorFromResult(first); !ok || info.Code != "OUTCOME_TOO_LARGE" || info.Retryable ||
				!strings.Contains(bare(t, first), "the tool ran") {
				t.Fatalf("a 20 MiB result: %s; want OUTCOME_TOO_LARGE, saying the tool ran", bare(t, first))
			}
			if again := report(); again.Meta[mcpguard.ReplayedMeta] != true || bare(t, again) != bare(t, first) {
				t.Fatalf("its retry: %s", bare(t, again))
			}
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice",
				Arguments: map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 100}, Meta: mcp.Meta{mcpguard.KeyMeta: "after-" + version}})
			if err != nil || res.IsError {
				t.Fatalf("the next call on the session: %v, %v", res, err)
			}
		})
	}
}
