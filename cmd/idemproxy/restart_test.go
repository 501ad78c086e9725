package main

import (
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestStdioUpstreamExitsMidCall: the stdio upstream exits while it runs a
// guarded call (crash_once, as a SIGKILL would end it). The agent's
// session goes on: the bridge starts the upstream again (a 2025 session's
// child initialized as its client initialized the first), and the next
// call on the same session is answered. The call in flight is unknown:
// UNAVAILABLE, retryable, until its lease runs out; then the tool's policy
// answers its retry with the same key: TAKEOVER runs it again, once; HOLD
// says OUTCOME_UNKNOWN and runs nothing.
func TestStdioUpstreamExitsMidCall(t *testing.T) {
	for _, policy := range []string{"takeover", "hold"} {
		for _, version := range []string{"2025-11-25", "2026-07-28"} {
			t.Run(policy+"/"+version, func(t *testing.T) {
				clock := ledgertest.NewClock(time.Now())
				cfg := config(ledgerAddrAt(t, clock.Now), stdioUpstream(t), policyConfig{})
				cfg.MCP.Tools["crash_once"] = toolConfig{policyConfig: policyConfig{
					Lease: duration(300 * time.Millisecond), OnLeaseExpiry: policy, OnInProgress: "reject",
				}}
				endpoint, _ := proxy(t, cfg)
				c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
				cs, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint}, &mcp.ClientSessionOptions{ProtocolVersion: version})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = cs.Close() })
				crash := func() *mcp.CallToolResult {
					t.Helper()
					res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "crash_once", Arguments: map[string]any{},
						Meta: mcp.Meta{mcpguard.KeyMeta: "k-crash"}})
					if err != nil {
						t.Fatalf("crash_once: %v", err)
					}
					return res
				}
				lost := crash()
				if info, ok := mcpguard.ErrorFromResult(lost); !ok || info.Code != "UNAVAILABLE" || !info.Retryable ||
					!strings.Contains(bare(t, lost), "the upstream MCP server exited before it answered") {
					t.Fatalf("the call whose upstream exited: %s; want UNAVAILABLE, retryable, saying the upstream exited", bare(t, lost))
				}
				if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil || res.IsError {
					t.Fatalf("the next call on the session: %v, %v; want it answered by the upstream started again", res, err)
				}
				if info, ok := mcpguard.ErrorFromResult(crash()); !ok || info.Code != "IN_PROGRESS" {
					t.Fatalf("a retry within the lease: %+v; want IN_PROGRESS", info)
				}
				clock.Advance(400 * time.Millisecond)
				res := crash()
				info, isErr := mcpguard.ErrorFromResult(res)
				switch {
				case policy == "takeover" && (isErr || res.IsError || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "done"):
					t.Fatalf("after the lease, under TAKEOVER: %s; want the run of the second attempt", bare(t, res))
				case policy == "hold" && (!isErr || info.Code != "OUTCOME_UNKNOWN" || info.Retryable):
					t.Fatalf("after the lease, under HOLD: %s; want OUTCOME_UNKNOWN", bare(t, res))
				}
				if again := crash(); policy == "takeover" && (again.Meta[mcpguard.ReplayedMeta] != true || bare(t, again) != bare(t, res)) {
					t.Fatalf("the retry after the takeover: %s; want its replay", bare(t, again))
				}
			})
		}
	}
}
