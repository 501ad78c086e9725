package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
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
	t.Cleanup(func() { b.closeAll(); srv.Close() }) // a session's listening stream ends when it closes
	return b, srv.URL
}

// dial opens a session of the 2025 revisions (a child of its own).
func dial(t *testing.T, endpoint string) (*mcp.ClientSession, error) {
	t.Helper()
	return dialWith(t, endpoint, nil)
}

func dialWith(t *testing.T, endpoint string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, opts)
	return c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, MaxRetries: -1},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
}

// onlySession is the bridge's one session.
func onlySession(t *testing.T, b *bridge) *bridgeSession {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sessions) != 1 {
		t.Fatalf("%d sessions, want 1", len(b.sessions))
	}
	for _, s := range b.sessions {
		return s
	}
	return nil
}

// fakeTimer is a session's idle timer that runs on the test's word:
// elapse does what the end of the idle time would.
type fakeTimer struct {
	mu      sync.Mutex
	f       func()
	running bool
	changed chan struct{} // a value after a Stop or Reset, for a test waiting on one
}

func (t *fakeTimer) set(running bool) bool {
	t.mu.Lock()
	was := t.running
	t.running = running
	t.mu.Unlock()
	select {
	case t.changed <- struct{}{}:
	default:
	}
	return was
}

func (t *fakeTimer) Stop() bool               { return t.set(false) }
func (t *fakeTimer) Reset(time.Duration) bool { return t.set(true) }

func (t *fakeTimer) isRunning() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.running
}

// elapse ends the idle time: it runs the timer's function if the timer
// was running, and reports whether it was.
func (t *fakeTimer) elapse() bool {
	if !t.set(false) {
		return false
	}
	t.f()
	return true
}

// waitRunning waits for the timer to run, or to stop, as running says.
func (t *fakeTimer) waitRunning(running bool) {
	for t.isRunning() != running {
		<-t.changed
	}
}

// fakeIdle gives the bridge's next sessions fake idle timers, and returns
// the latest one made.
func (b *bridge) fakeIdle() func() *fakeTimer {
	var mu sync.Mutex
	var last *fakeTimer
	b.afterFunc = func(_ time.Duration, f func()) idleTimer {
		mu.Lock()
		defer mu.Unlock()
		last = &fakeTimer{f: f, running: true, changed: make(chan struct{}, 1)}
		return last
	}
	return func() *fakeTimer {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
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
	b, endpoint := bridgeTo(t, 1, time.Minute)
	idle := b.fakeIdle()
	cs, err := dial(t, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	s := onlySession(t, b)
	s.wmu.Lock()
	p := s.proc
	s.wmu.Unlock()
	if !idle().elapse() {
		t.Fatal("the idle session's timer was not running")
	}
	<-s.done // closed by its idle timer, once the child has exited
	if p.out.cmd.ProcessState == nil {
		t.Fatal("the session closed, its child still runs")
	}
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err == nil {
		t.Fatal("a call on a closed session was answered")
	}
	if _, err := dial(t, endpoint); err != nil {
		t.Fatalf("a new session after the idle one closed: %v", err)
	}
}

// TestBridgeKeepsASessionWhileACallWaits: a session is idle only while no
// request of its client waits for its answer. Its idle time stops while a
// call runs (a call longer than session_idle keeps its child), and starts
// over once the call is answered or its client leaves it.
func TestBridgeKeepsASessionWhileACallWaits(t *testing.T) {
	b, endpoint := bridgeTo(t, 1, time.Minute)
	idle := b.fakeIdle()
	running := make(chan struct{}, 1)
	cs, err := dialWith(t, endpoint, &mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
		running <- struct{}{}
	}})
	if err != nil {
		t.Fatal(err)
	}
	s := onlySession(t, b)
	ctx, cancel := context.WithCancel(t.Context())
	called := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "wait_for_cancel", Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": "p"}})
		called <- err
	}()
	<-running // the child runs the call, which waits for its answer
	if idle().elapse() {
		t.Fatal("the idle timer ran while a call waited for its answer")
	}
	select {
	case <-s.done:
		t.Fatal("the session closed while a call waited for its answer")
	default:
	}
	cancel()
	if err := <-called; err == nil {
		t.Fatal("the cancelled call was answered")
	}
	idle().waitRunning(true) // the bridge let go of the call the client left
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil {
		t.Fatalf("a call after the long one: %v", err)
	}
	if !idle().isRunning() {
		t.Fatal("the idle timer is not running once every call is answered")
	}
	if !idle().elapse() {
		t.Fatal("the idle timer did not end the idle session")
	}
	<-s.done
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

// TestBridgeGivesEachCallItsOwnProgress: two clients of 2026-07-28 call
// a tool of the shared stdio child at once, each under the same progress
// token. The child sees a token of the bridge's own for each, so each
// client gets the progress of its own call, under its own token, and not
// the other's.
func TestBridgeGivesEachCallItsOwnProgress(t *testing.T) {
	endpoint, _ := proxy(t, config(ledgerAddr(t), stdioUpstream(t), policyConfig{}))
	type heard struct {
		progress []string // token:message of each progress notification
		result   string
	}
	call := func(who string) heard {
		// Bounded: a proxy that keeps the second call from the child
		// while the first waits for it fails here instead of hanging.
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		res, err := postModern(ctx, endpoint, "tools/call", "meet", map[string]any{
			"name": "meet", "arguments": map[string]any{"who": who}, "_meta": modernMeta(map[string]any{"progressToken": "p"})}, nil)
		if err != nil {
			t.Error(err)
			return heard{}
		}
		defer res.Body.Close()
		var h heard
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			var msg struct {
				Method string `json:"method"`
				Params struct {
					Token   json.RawMessage `json:"progressToken"`
					Message string          `json:"message"`
				} `json:"params"`
				Result *struct {
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"result"`
			}
			if err := json.Unmarshal([]byte(data), &msg); err != nil {
				t.Errorf("%s heard %q: %v", who, data, err)
				continue
			}
			switch {
			case msg.Method == "notifications/progress":
				h.progress = append(h.progress, string(msg.Params.Token)+":"+msg.Params.Message)
			case msg.Result != nil && len(msg.Result.Content) == 1:
				h.result = msg.Result.Content[0].Text
			}
		}
		return h
	}
	var a, b heard
	var wg sync.WaitGroup
	wg.Go(func() { a = call("a") })
	wg.Go(func() { b = call("b") })
	wg.Wait()
	for who, h := range map[string]heard{"a": a, "b": b} {
		if h.result != who || !slices.Equal(h.progress, []string{`"p":` + who}) {
			t.Errorf("client %s heard progress %q and the result %q; want its own progress under its own token, and %q", who, h.progress, h.result, who)
		}
	}
}

// waitGate blocks until a writer opens the named pipe gate and closes it.
func waitGate(gate string) error {
	f, err := os.Open(gate) // a pipe's reader waits here for its writer
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(io.Discard, f)
	return err
}

// TestBridgeWaitsForAChildSlowToStart: a stdio child that has not answered
// server/discover when a request has waited probeTimeout is not taken for a
// server of the 2025 revisions: the request is refused 503 with
// Retry-After, the bridge goes on waiting, and the child's late answer
// decides, so that the next request is served in 2026-07-28.
func TestBridgeWaitsForAChildSlowToStart(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("IDEMPROXY_TEST_STDIO_GATE", gate)
	b, endpoint := bridgeTo(t, 4, time.Hour)
	b.probeTimeout = 50 * time.Millisecond // the child is held at its gate, however long this is

	res, body := discover(t, endpoint)
	if res.StatusCode != http.StatusServiceUnavailable || res.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), "server/discover") {
		t.Fatalf("before the child answers: %s, Retry-After %q, %s; want 503 with Retry-After", res.Status, res.Header.Get("Retry-After"), body)
	}
	b.mu.Lock()
	s := b.shared
	b.mu.Unlock()
	if era := b.knownEra(); era != "" || s == nil {
		t.Fatalf("the era is %q after a request the child did not answer; want it unknown, the child kept", era)
	}
	s.wmu.Lock()
	p := s.proc
	s.wmu.Unlock()

	w, err := os.OpenFile(gate, os.O_WRONLY, 0) // the child waits at the other end
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	<-p.probed // the same child answers the bridge's first server/discover
	if era := b.knownEra(); era != eraModern {
		t.Fatalf("the era is %q once the child answered; want %q", era, eraModern)
	}
	res, body = discover(t, endpoint)
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "2026-07-28") {
		t.Fatalf("once the child answered: %s %s; want its discover result", res.Status, body)
	}
}

// TestBridgeStartsAnotherChildForOneThatExitedUnprobed: a stdio child that
// exits before it answers server/discover says nothing about the revisions
// the server speaks; the request that waited starts another child, which
// answers it.
func TestBridgeStartsAnotherChildForOneThatExitedUnprobed(t *testing.T) {
	t.Setenv("IDEMPROXY_TEST_STDIO_EXIT_ONCE", filepath.Join(t.TempDir(), "exited"))
	b, endpoint := bridgeTo(t, 4, time.Hour)
	if res, body := discover(t, endpoint); res.StatusCode != http.StatusOK || !strings.Contains(string(body), "2026-07-28") {
		t.Fatalf("after a child that exited unprobed: %s %s; want the next child's discover result", res.Status, body)
	}
	if era := b.knownEra(); era != eraModern {
		t.Fatalf("the era is %q; want %q", era, eraModern)
	}
}

// discover posts a server/discover of 2026-07-28 to endpoint and reads
// the whole answer.
func discover(t *testing.T, endpoint string) (*http.Response, []byte) {
	t.Helper()
	res, err := postModern(t.Context(), endpoint, "server/discover", "", map[string]any{"_meta": modernMeta(nil)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, body
}
