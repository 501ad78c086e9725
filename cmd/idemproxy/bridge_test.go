package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// bridgeTo serves a stdio goUpstream through a bridge of at most
// maxSessions sessions, each closed after idle.
func bridgeTo(t *testing.T, maxSessions int, idle time.Duration) (*bridge, string) {
	t.Helper()
	t.Setenv("IDEMPROXY_TEST_STDIO_UPSTREAM", "1")
	b := newBridge([]string{os.Args[0], "-test.run=^$"}, defaultMaxResultBytes, maxSessions, idle, slog.New(slog.DiscardHandler))
	srv := httptest.NewServer(b)
	t.Cleanup(func() { srv.Close(); b.closeAll() })
	return b, srv.URL
}

func dial(t *testing.T, endpoint string) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil)
	return c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1}, nil)
}

// TestBridgeBoundsSessions: each session of a stdio upstream is a child
// process; past max_sessions a new client is refused 503 with
// Retry-After, and a session its client ends (DELETE) makes room.
func TestBridgeBoundsSessions(t *testing.T) {
	_, endpoint := bridgeTo(t, 1, time.Hour)
	first, err := dial(t, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"b","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") == "" {
		t.Fatalf("a second session past max_sessions 1: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := dial(t, endpoint)
	if err != nil {
		t.Fatalf("after the first session ended: %v", err)
	}
	_ = second.Close()
}

// TestBridgeClosesIdleSessions: a session left idle (its client gone
// without a DELETE) is closed, its child ended; its id is then unknown,
// so that a client that comes back initializes again.
func TestBridgeClosesIdleSessions(t *testing.T) {
	b, endpoint := bridgeTo(t, 1, 200*time.Millisecond)
	cs, err := dial(t, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	var s *bridgeSession
	for _, s = range b.sessions {
	}
	b.mu.Unlock()
	if s == nil {
		t.Fatal("no session")
	}
	<-s.done // closed by its idle timer, once the child has exited
	if s.out.(*child).cmd.ProcessState == nil {
		t.Fatal("the session closed, its child still runs")
	}
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err == nil {
		t.Fatal("a call on a closed session was answered")
	}
	if _, err := dial(t, endpoint); err != nil {
		t.Fatalf("a new session after the idle one closed: %v", err)
	}
}

// TestProxyRefusesALargeMessage: a message from the client over the
// proxy's 4 MiB is 413, and so is one to the stdio bridge; the session
// goes on.
func TestProxyRefusesALargeMessage(t *testing.T) {
	up := &goUpstream{}
	endpoint, _ := proxy(t, config(ledgerAddr(t), byURL(up.serve(t)), policyConfig{}))
	_, bridged := bridgeTo(t, 1, time.Hour)
	for _, url := range []string{endpoint, bridged} {
		big := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"pad":"` + strings.Repeat("x", maxRequestBytes) + `"}}`
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(big))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: a message over 4 MiB: %d, want 413", url, res.StatusCode)
		}
		cs, err := dial(t, url)
		if err != nil {
			t.Fatalf("%s after the large message: %v", url, err)
		}
		_ = cs.Close()
	}
}
