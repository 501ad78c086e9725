package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/syncbuf"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// stdioHost is a host that runs idemproxy --stdio: it writes JSON-RPC
// lines on the proxy's stdin and reads its stdout.
type stdioHost struct {
	t     *testing.T
	in    io.WriteCloser
	lines chan []byte // stdout, a message a line; closed when it ends
	done  chan error  // what run returned
	ids   int
}

// stdioProxy runs the proxy over stdio with cfg, in process; it ends when
// the test closes its stdin, or when the test ends.
func stdioProxy(t *testing.T, cfg fileConfig) *stdioHost {
	t.Helper()
	return stdioProxyDraining(t, cfg, 5*time.Second)
}

// stdioProxyDraining is stdioProxy with the drain timeout drain.
func stdioProxyDraining(t *testing.T, cfg fileConfig, drain time.Duration) *stdioHost {
	t.Helper()
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.checkStdio(); err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	h := &stdioHost{t: t, in: inW, lines: make(chan []byte, 1024), done: make(chan error, 1)}
	go func() {
		h.done <- run(ctx, flags{stdio: true, drainTimeout: drain}, cfg, &listeners{in: inR, out: outW}, slog.New(slog.DiscardHandler))
		_ = outW.Close()
	}()
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 64<<20)
		for sc.Scan() {
			h.lines <- []byte(sc.Text())
		}
	}()
	t.Cleanup(func() {
		_ = inW.Close()
		cancel()
		go func() { // drains what is left, and ends with stdout
			for range h.lines {
			}
		}()
	})
	return h
}

// send writes one line.
func (h *stdioHost) send(line string) {
	h.t.Helper()
	if _, err := io.WriteString(h.in, line+"\n"); err != nil {
		h.t.Fatal(err)
	}
}

// rpcAnswer is a JSON-RPC response as the host reads it.
type rpcAnswer struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// call sends a request and reads until its response.
func (h *stdioHost) call(method string, params any) rpcAnswer {
	h.t.Helper()
	h.ids++
	id := h.ids
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err != nil {
		h.t.Fatal(err)
	}
	h.send(string(b))
	return h.answer(json.RawMessage(strconv.Itoa(id)))
}

// handshake initializes a 2025 session as a host does, and returns the
// answer to initialize.
func (h *stdioHost) handshake() rpcAnswer {
	h.t.Helper()
	init := h.call("initialize", map[string]any{"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "host", "version": "1"}})
	h.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return init
}

// invoice calls the guarded create_invoice with key.
func (h *stdioHost) invoice(key string) rpcAnswer {
	h.t.Helper()
	return h.call("tools/call", map[string]any{"name": "create_invoice",
		"arguments": map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 100},
		"_meta":     map[string]any{mcpguard.KeyMeta: key}})
}

// answer reads until the response to id (null for an error that names no
// request), past the other messages.
func (h *stdioHost) answer(id json.RawMessage) rpcAnswer {
	h.t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-h.lines:
			if !ok {
				h.t.Fatalf("stdout ended before the answer to %s", id)
			}
			var a rpcAnswer
			var m struct {
				Method string `json:"method"`
			}
			if json.Unmarshal(line, &a) != nil || json.Unmarshal(line, &m) != nil {
				h.t.Fatalf("stdout carried %q, not a JSON-RPC message", line)
			}
			if m.Method == "" && string(a.ID) == string(id) {
				return a
			}
		case <-timeout:
			h.t.Fatalf("no answer to %s in 30 s", id)
		}
	}
}

// envelope is the per-request _meta of 2026-07-28, with more keys.
func modernMeta(more map[string]any) map[string]any {
	m := map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{},
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "host", "version": "1"}}
	for k, v := range more {
		m[k] = v
	}
	return m
}

// postModern posts a request of 2026-07-28 to endpoint with the headers
// the revision binds to its body (Mcp-Name is name, unless ""), and more.
func postModern(ctx context.Context, endpoint, method, name string, params map[string]any, more map[string]string) (*http.Response, error) {
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	for k, v := range more {
		req.Header.Set(k, v)
	}
	return http.DefaultClient.Do(req)
}

// firstMessage is the message an answer's body carries: the body, or the
// data of its first event on.
func firstMessage(body []byte) []byte {
	if _, data, ok := bytes.Cut(body, []byte("data: ")); ok {
		return data
	}
	return body
}

// toolText is a tool result's text, whether it is an error, and whether
// it is the guard's replay.
func toolText(t *testing.T, a rpcAnswer) (text string, isError, replayed bool) {
	t.Helper()
	if a.Error != nil {
		t.Fatalf("a JSON-RPC error: %d %s", a.Error.Code, a.Error.Message)
	}
	var r struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool           `json:"isError"`
		Meta    map[string]any `json:"_meta"`
	}
	if err := json.Unmarshal(a.Result, &r); err != nil || len(r.Content) != 1 {
		t.Fatalf("a tool result of one text: %s (%v)", a.Result, err)
	}
	return r.Content[0].Text, r.IsError, r.Meta[mcpguard.ReplayedMeta] == true
}

// TestStdioHostOnTheModernRevision: a host that runs idemproxy --stdio
// (in front of a stdio child) and speaks 2026-07-28 with no headers at
// all: the proxy sends the ones the revision binds to the body, so the
// child's checks pass, even for a tool the host called before it listed
// the tools (an Mcp-Param-* header of a non-ASCII value, in base64); the
// guard runs a write once, replays it, refuses the key with another
// payload; a guarded result over the bound is OUTCOME_TOO_LARGE, a result
// of this revision (resultType complete); what is not a message, or is
// over 4 MiB, gets a JSON-RPC error and the session goes on.
func TestStdioHostOnTheModernRevision(t *testing.T) {
	cfg := config(ledgerAddr(t), stdioUpstream(t), policyConfig{})
	cfg.MCP.Tools["big_report"] = toolConfig{}
	cfg.MCP.MaxResultBytes = 1 << 20
	h := stdioProxy(t, cfg)

	d := h.call("server/discover", map[string]any{"_meta": modernMeta(nil)})
	if d.Error != nil || !strings.Contains(string(d.Result), mcpguard.IdempotencyCapability) {
		t.Fatalf("server/discover: %s %+v; want the idempotency capability", d.Result, d.Error)
	}
	region := h.call("tools/call", map[string]any{"name": "regional", "arguments": map[string]any{"region": "Zürich", "level": 3}, "_meta": modernMeta(nil)})
	if text, isErr, _ := toolText(t, region); isErr || !strings.Contains(text, "Zürich") {
		t.Fatalf("a tool with a header binding, before tools/list: %q", text)
	}
	// A number the host spells with an exponent: its header is the
	// decimal a server compares as a number.
	h.send(`{"jsonrpc":"2.0","id":"exp","method":"tools/call","params":{"name":"regional","arguments":{"region":"eu","level":3e0},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
	if text, isErr, _ := toolText(t, h.answer(json.RawMessage(`"exp"`))); isErr || !strings.Contains(text, "3e0") {
		t.Fatalf("a bound integer spelled 3e0: %q", text)
	}
	list := h.call("tools/list", map[string]any{"_meta": modernMeta(nil)})
	if !strings.Contains(string(list.Result), mcpguard.DefaultKeyArgument) {
		t.Fatalf("tools/list does not advertise the key argument: %s", list.Result)
	}
	invoice := func(amount int) rpcAnswer {
		return h.call("tools/call", map[string]any{"name": "create_invoice",
			"arguments": map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": amount},
			"_meta":     modernMeta(map[string]any{mcpguard.KeyMeta: "stdio-modern"})})
	}
	first, firstErr, firstReplayed := toolText(t, invoice(100))
	again, _, replayed := toolText(t, invoice(100))
	if firstErr || firstReplayed || !replayed || again != first {
		t.Fatalf("a write %q, then its retry %q (replayed %v); want a run, then its marked replay", first, again, replayed)
	}
	changed := invoice(200)
	if info, ok := errorInfo(changed.Result); !ok || info.Code != "KEY_REUSED" {
		t.Fatalf("the key with another amount: %s", changed.Result)
	}
	big := h.call("tools/call", map[string]any{"name": "big_report", "arguments": map[string]any{"bytes": 2 << 20},
		"_meta": modernMeta(map[string]any{mcpguard.KeyMeta: "stdio-modern-big"})})
	var shape struct {
		ResultType string `json:"resultType"`
	}
	if info, ok := errorInfo(big.Result); !ok || info.Code != "OUTCOME_TOO_LARGE" || json.Unmarshal(big.Result, &shape) != nil || shape.ResultType != "complete" {
		t.Fatalf("a 2 MiB result over a 1 MiB bound: %s; want OUTCOME_TOO_LARGE, resultType complete", big.Result)
	}

	h.send("this is not JSON")
	if a := h.answer(json.RawMessage("null")); a.Error == nil || a.Error.Code != -32700 {
		t.Fatalf("a line that is not JSON: %+v", a)
	}
	h.send(`{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"echo","arguments":{"pad":"` + strings.Repeat("x", maxRequestBytes) + `"}}}`)
	if a := h.answer(json.RawMessage("null")); a.Error == nil || a.Error.Code != -32600 {
		t.Fatalf("a line over 4 MiB: %+v", a)
	}
	if text, _, replayed := toolText(t, invoice(100)); !replayed || text != first {
		t.Fatalf("the session after the bad lines: %q", text)
	}
}

// errorInfo is the guard's typed error in a tool result.
func errorInfo(result json.RawMessage) (mcpguard.ErrorInfo, bool) {
	var r struct {
		Meta struct {
			Error *mcpguard.ErrorInfo `json:"io.idemledger/error"`
		} `json:"_meta"`
	}
	if json.Unmarshal(result, &r) != nil || r.Meta.Error == nil {
		return mcpguard.ErrorInfo{}, false
	}
	return *r.Meta.Error, true
}

// TestStdioHostOnThe2025Handshake: a host of the 2025 revisions over
// stdio, in front of an upstream over Streamable HTTP: initialize gains the
// capability, a write runs once and is replayed; and when the host closes
// stdin with a guarded call in flight, the proxy answers the call before
// it ends its output, and exits cleanly.
func TestStdioHostOnThe2025Handshake(t *testing.T) {
	// The second write waits in the upstream until the test lets it go.
	var runs atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	up := &goUpstream{hold: func(ctx context.Context, _ uint32) bool {
		if runs.Add(1) == 2 {
			close(entered)
			select {
			case <-release:
			case <-ctx.Done():
				return false
			}
		}
		return true
	}}
	cfg := config(ledgerAddr(t), byURL(up.serve(t)), policyConfig{})
	h := stdioProxy(t, cfg)

	if init := h.handshake(); init.Error != nil || !strings.Contains(string(init.Result), mcpguard.IdempotencyCapability) {
		t.Fatalf("initialize: %s %+v; want the idempotency capability", init.Result, init.Error)
	}
	first, _, _ := toolText(t, h.invoice("stdio-2025"))
	again, _, replayed := toolText(t, h.invoice("stdio-2025"))
	if !replayed || again != first {
		t.Fatalf("a write %q, then its retry %q (replayed %v)", first, again, replayed)
	}

	// The last call runs upstream when stdin ends; then it answers.
	h.ids++
	id := strconv.Itoa(h.ids)
	h.send(`{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"create_invoice","arguments":{"customer":"cus_2","currency":"EUR","amount_cents":100},"_meta":{"` + mcpguard.KeyMeta + `":"stdio-last"}}}`)
	select {
	case <-entered:
	case line := <-h.lines:
		t.Fatalf("the last call was answered before it ran: %s", line)
	}
	_ = h.in.Close()
	close(release)
	if text, isErr, _ := toolText(t, h.answer(json.RawMessage(id))); isErr {
		t.Fatalf("the call in flight when stdin closed: %q", text)
	}
	if err := <-h.done; err != nil {
		t.Fatalf("idemproxy --stdio after stdin closed: %v", err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.rows) != 2 {
		t.Fatalf("the upstream wrote %d rows; want 2", len(up.rows))
	}
}

// TestStdioFlags: --stdio takes no admin port unless one is named, and a
// file that cannot serve over stdio is a usage error.
func TestStdioFlags(t *testing.T) {
	f, err := parseFlags([]string{"--stdio"}, io.Discard)
	if err != nil || f.adminListen != "" {
		t.Fatalf("--stdio: admin %q, %v; want none", f.adminListen, err)
	}
	if f, _ := parseFlags([]string{"--stdio", "--admin-listen", "127.0.0.1:9"}, io.Discard); f.adminListen != "127.0.0.1:9" {
		t.Fatalf("--stdio --admin-listen: %q", f.adminListen)
	}
	if f, _ := parseFlags(nil, io.Discard); f.adminListen == "" {
		t.Fatal("without --stdio the admin listener is on by default")
	}
	dir := t.TempDir()
	for name, body := range map[string]string{
		"http":   "http:\n  upstream: http://127.0.0.1:8080\n  tenant: {static: acme}\n  routes:\n    \"POST /v1/x\": {}\n",
		"header": "mcp:\n  upstream: {url: http://127.0.0.1:8090/mcp}\n  tenant: {header: X-Tenant}\n  tools: {create_invoice: {}}\n",
	} {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		if code := cli([]string{"--config", path, "--stdio"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--stdio") {
			t.Errorf("%s over stdio: exit %d, %q; want 2, saying why", name, code, stderr.String())
		}
	}
}

// TestStdioHostRunsOnOneProcessor: idemproxy --stdio, as a host runs it,
// serves on one P, and on as many as GOMAXPROCS says when it is set; its
// admin endpoint's go_sched_gomaxprocs_threads tells which.
func TestStdioHostRunsOnOneProcessor(t *testing.T) {
	t.Parallel()
	server := []string{"env", "-u", "IDEMPROXY_TEST_AS_MAIN", os.Args[0], "-test.run=^$"}
	file := stdioConfigFile(t, config(ledgerAddr(t), byCommand(server...), policyConfig{}))
	var environ []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") {
			environ = append(environ, kv)
		}
	}
	for _, c := range []struct{ env, want string }{{"", "1"}, {"GOMAXPROCS=2", "2"}} {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "--config", file, "--stdio", "--admin-listen", "127.0.0.1:0", "--log-format", "json") //nolint:gosec // the test's own binary
		cmd.Env = append(slices.Clone(environ), "IDEMPROXY_TEST_AS_MAIN=1", "IDEMPROXY_TEST_STDIO_UPSTREAM=1")
		if c.env != "" {
			cmd.Env = append(cmd.Env, c.env)
		}
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stderr, logs := io.Pipe() // read as it comes, and ended when the process is
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ended := make(chan error, 1)
		go func() {
			ended <- cmd.Wait()
			_ = logs.Close()
		}()
		var admin string
		for lines := bufio.NewScanner(stderr); admin == "" && lines.Scan(); {
			var line struct{ Msg, Admin string }
			if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "idemproxy serving stdio" {
				admin = line.Admin
			}
		}
		if admin == "" {
			t.Fatalf("%q: idemproxy --stdio never said it serves, or where its admin endpoint is", c.env)
		}
		go func() { _, _ = io.Copy(io.Discard, stderr) }()
		res, err := http.Get("http://" + admin + "/metrics") //nolint:noctx // the admin endpoint of the test's process
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		procs := ""
		for line := range strings.Lines(string(metrics)) {
			if v, ok := strings.CutPrefix(line, "go_sched_gomaxprocs_threads "); ok {
				procs = strings.TrimSpace(v)
			}
		}
		if procs != c.want {
			t.Errorf("environment %q: go_sched_gomaxprocs_threads %q, want %s", c.env, procs, c.want)
		}
		_ = stdin.Close() // the host leaves: the proxy ends
		if err := <-ended; err != nil {
			t.Errorf("environment %q: idemproxy --stdio ended with %v after its host left", c.env, err)
		}
	}
}

// TestStdioHostPipeReadThroughThePoller: idemproxy --stdio, run as a
// host runs it (stdin a pipe, or a socket as Node gives its children),
// reads stdin nonblocking, through Go's poller, and serves a guarded call
// so; when the host leaves, the flag is as it was before, blocking. A
// stdin that came nonblocking stays so. The test holds the stdin's end
// too, and reads the flag of the open file the two share.
func TestStdioHostPipeReadThroughThePoller(t *testing.T) {
	t.Parallel()
	server := []string{"env", "-u", "IDEMPROXY_TEST_AS_MAIN", os.Args[0], "-test.run=^$"}
	file := stdioConfigFile(t, config(ledgerAddr(t), byCommand(server...), policyConfig{}))
	connect := map[string]func() (r, w *os.File, err error){
		"pipe": os.Pipe,
		"socket": func() (r, w *os.File, err error) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return nil, nil, err
			}
			return os.NewFile(uintptr(fds[0]), "stdin"), os.NewFile(uintptr(fds[1]), "host"), nil
		},
	}
	for _, kind := range []string{"pipe", "socket"} {
		for _, came := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s came nonblocking %v", kind, came), func(t *testing.T) {
				r, w, err := connect[kind]()
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = r.Close() }()
				fcntl(t, r, func(fd int) error { return unix.SetNonblock(fd, came) })
				out, outW, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				// exec.Cmd would put stdin in blocking mode (it passes
				// files by Fd): the process is forked with the
				// descriptors as they are.
				var pid int
				fcntl(t, r, func(in int) error {
					fcntl(t, outW, func(o int) error {
						pid, err = syscall.ForkExec(os.Args[0], []string{os.Args[0], "--config", file, "--stdio", "--log-level", "warn"}, &syscall.ProcAttr{
							Env:   append(os.Environ(), "IDEMPROXY_TEST_AS_MAIN=1", "IDEMPROXY_TEST_STDIO_UPSTREAM=1"),
							Files: []uintptr{uintptr(in), uintptr(o), uintptr(syscall.Stderr)},
						})
						return err
					})
					return nil
				})
				_ = outW.Close()
				proc, err := os.FindProcess(pid)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = proc.Kill() })
				h := &stdioHost{t: t, in: w, lines: make(chan []byte, 16)}
				go func() {
					defer close(h.lines)
					for sc := bufio.NewScanner(out); sc.Scan(); {
						h.lines <- slices.Clone(sc.Bytes())
					}
				}()
				if init := h.handshake(); init.Error != nil {
					t.Fatalf("initialize: %+v", init.Error)
				}
				if text, isErr, _ := toolText(t, h.invoice(fmt.Sprintf("poller-%s-%v", kind, came))); isErr {
					t.Fatalf("a guarded call: %s", text)
				}
				if !nonblocking(t, r) {
					t.Errorf("stdin is blocking while idemproxy --stdio serves: its reads wait in the kernel")
				}
				_ = w.Close() // the host leaves: the proxy ends
				for range h.lines {
				}
				if state, err := proc.Wait(); err != nil || !state.Success() {
					t.Fatalf("idemproxy --stdio ended with %v, %v after its host left", state, err)
				}
				if nonblocking(t, r) != came {
					t.Errorf("after idemproxy --stdio, stdin is nonblocking %v", !came)
				}
			})
		}
	}
}

// fcntl runs op on f's descriptor; not through Fd, which puts the
// descriptor in blocking mode.
func fcntl(t *testing.T, f *os.File, op func(fd int) error) {
	t.Helper()
	raw, err := f.SyscallConn()
	if err == nil {
		err = raw.Control(func(fd uintptr) { err = op(int(fd)) })
	}
	if err != nil {
		t.Fatal(err)
	}
}

// nonblocking is whether f's open file is nonblocking.
func nonblocking(t *testing.T, f *os.File) (nb bool) {
	t.Helper()
	fcntl(t, f, func(fd int) error {
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		nb = flags&unix.O_NONBLOCK != 0
		return err
	})
	return nb
}

// TestHTTPModeSizesItsProcs: idemproxy over HTTP on two Ps (GOMAXPROCS=2)
// goes down to one while idle, and says so at debug; with --procs max it
// stays on two; --procs takes auto or max only.
func TestHTTPModeSizesItsProcs(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "idemproxy.yaml")
	body := fmt.Sprintf("ledger:\n  address: %s\nmcp:\n  upstream: {url: %q}\n  tenant: {static: acme}\n  tools:\n    create_invoice: {}\n",
		ledgerAddr(t), (&goUpstream{}).serve(t))
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (admin string, logs *syncbuf.Buffer) {
		cmd := exec.CommandContext(t.Context(), os.Args[0], append([]string{"--config", file, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--log-level", "debug"}, args...)...) //nolint:gosec // the test's own binary
		cmd.Env = append(os.Environ(), "IDEMPROXY_TEST_AS_MAIN=1", "GOMAXPROCS=2")
		logs = &syncbuf.Buffer{}
		cmd.Stderr = logs
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		ledgertest.Eventually(t, 20*time.Second, func() bool {
			for line := range strings.Lines(logs.String()) {
				var l struct{ Msg, Admin string }
				if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "idemproxy listening" {
					admin = l.Admin
				}
			}
			return admin != ""
		}, "idemproxy says where it listens")
		return admin, logs
	}
	procs := func(admin string) string {
		res, err := http.Get("http://" + admin + "/metrics") //nolint:noctx // the admin endpoint of the test's process
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		metrics, _ := io.ReadAll(res.Body)
		for line := range strings.Lines(string(metrics)) {
			if v, ok := strings.CutPrefix(line, "go_sched_gomaxprocs_threads "); ok {
				return strings.TrimSpace(v)
			}
		}
		return ""
	}
	auto, autoLogs := run()
	fixed, _ := run("--procs", "max")
	if got := procs(fixed); got != "2" {
		t.Fatalf("--procs max with GOMAXPROCS=2: go_sched_gomaxprocs_threads %q", got)
	}
	ledgertest.Eventually(t, 30*time.Second, func() bool { return procs(auto) == "1" }, "an idle idemproxy goes down to one P")
	// idemproxy logs the change after it makes it, and its log reaches the
	// test through a pipe: the line may come after the metric says one P.
	ledgertest.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(autoLogs.String(), `"msg":"GOMAXPROCS set","procs":1`)
	}, "a debug line for the change to one P")
	if got := procs(fixed); got != "2" {
		t.Errorf("--procs max: go_sched_gomaxprocs_threads %q after the other went down to one", got)
	}
	var stderr bytes.Buffer
	if code := cli([]string{"--config", file, "--procs", "2"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "--procs") {
		t.Fatalf("--procs 2: exit %d, %s", code, stderr.String())
	}
}

// TestStdioHostOutlivesItsUpstreamSession: an upstream over Streamable
// HTTP that restarts forgets the host's 2025 session (404). The proxy
// initializes a session again, as the host initialized it, and sends the
// message once more: the host's session goes on, unguarded and guarded
// calls alike, and a retry of a write done before is still its replay.
func TestStdioHostOutlivesItsUpstreamSession(t *testing.T) {
	up := &goUpstream{}
	var handler atomic.Pointer[http.Handler]
	restart := func() { // a new server: no session of before
		s := up.server()
		h := http.Handler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
		handler.Store(&h)
	}
	restart()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	h := stdioProxy(t, config(ledgerAddr(t), byURL(srv.URL), policyConfig{}))

	h.handshake()
	first, _, _ := toolText(t, h.invoice("before"))

	// Eight calls at once meet the forgotten session: one initializes
	// again, and every one is answered on the new session.
	restart()
	const n = 8
	for i := range n {
		h.send(`{"jsonrpc":"2.0","id":"echo-` + strconv.Itoa(i) + `","method":"tools/call","params":{"name":"echo","arguments":{}}}`)
	}
	for answered := 0; answered < n; {
		line := <-h.lines
		var a rpcAnswer
		if json.Unmarshal(line, &a) != nil || !strings.HasPrefix(string(a.ID), `"echo-`) {
			continue
		}
		if text, isErr, _ := toolText(t, a); isErr || text != "echo" {
			t.Fatalf("an unguarded call after the upstream restarted: %q", text)
		}
		answered++
	}
	if text, isErr, replayed := toolText(t, h.invoice("after")); isErr || replayed {
		t.Fatalf("a write after the upstream restarted: %q", text)
	}
	if text, _, replayed := toolText(t, h.invoice("before")); !replayed || text != first {
		t.Fatalf("the retry of a write of before: %q (replayed %v); want %q, replayed", text, replayed, first)
	}
	if w := up.writes(); len(w) != 2 {
		t.Fatalf("the upstream wrote %d rows; want 2", len(w))
	}
}

// TestStdioHostCancels: a request the host cancels (a tool whose server
// answers nothing once it is cancelled) is ended
// in the proxy as well as upstream: the host gets no answer for it, and
// when stdin closes the proxy exits at once instead of waiting out its
// drain timeout for an answer that will not come.
func TestStdioHostCancels(t *testing.T) {
	h := stdioProxyDraining(t, config(ledgerAddr(t), stdioUpstream(t), policyConfig{}), time.Hour)
	h.handshake()
	h.send(`{"jsonrpc":"2.0","id":"slow","method":"tools/call","params":{"name":"hang","arguments":{},"_meta":{"progressToken":"p"}}}`)
	for line := range h.lines { // the tool runs
		if strings.Contains(string(line), `"notifications/progress"`) {
			break
		}
	}
	h.send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"slow"}}`)
	_ = h.in.Close()
	select {
	case err := <-h.done:
		if err != nil {
			t.Fatalf("idemproxy --stdio: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("idemproxy --stdio still waits for the cancelled call 30 s after stdin closed")
	}
	for line := range h.lines {
		if strings.Contains(string(line), `"id":"slow"`) {
			t.Fatalf("the host was answered a call it cancelled: %s", line)
		}
	}
}

// TestUpstreamHeaderFiles: an upstream over Streamable HTTP that wants
// credentials the proxy's client has none of (a host over stdio, or an
// agent over HTTP that sends another) gets them from
// mcp.upstream.header_files, on every request: the session, guarded calls
// and passed-through ones. A file the proxy cannot use is an error at start.
func TestUpstreamHeaderFiles(t *testing.T) {
	up := &goUpstream{}
	s := up.server()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	secret := filepath.Join(t.TempDir(), "authorization")
	if err := os.WriteFile(secret, []byte("Bearer s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config(ledgerAddr(t), byURL(srv.URL), policyConfig{})
	cfg.MCP.Upstream.HeaderFiles = map[string]string{"Authorization": secret}

	host := stdioProxy(t, cfg)
	if a := host.handshake(); a.Error != nil {
		t.Fatalf("initialize over stdio: %+v", a.Error)
	}
	if text, isErr, _ := toolText(t, host.invoice("with-credentials")); isErr {
		t.Fatalf("a guarded call over stdio: %q", text)
	}

	endpoint, _ := proxy(t, cfg)
	wrong := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer not-the-upstreams")
		return http.DefaultTransport.RoundTrip(r)
	})
	cs := connect(t, endpoint, wrong)
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{}}); err != nil || res.IsError {
		t.Fatalf("a call passed through over HTTP: %v, %v", res, err)
	}
	if w := up.writes(); len(w) != 1 {
		t.Fatalf("the upstream wrote %d rows; want 1", len(w))
	}

	bad := cfg
	bad.MCP = &mcpConfig{Tenant: cfg.MCP.Tenant, Tools: cfg.MCP.Tools}
	bad.MCP.Upstream.URL = srv.URL
	for name, file := range map[string]string{"Mcp-Session-Id": secret, "Authorization": filepath.Join(t.TempDir(), "missing")} {
		bad.MCP.Upstream.HeaderFiles = map[string]string{name: file}
		err := bad.check()
		if err == nil {
			err = run(t.Context(), flags{}, bad, &listeners{front: newListener(t), admin: nil}, slog.New(slog.DiscardHandler))
		}
		if err == nil || !strings.Contains(err.Error(), "header_files") {
			t.Errorf("header_files %s from %s: %v; want an error that names it", name, file, err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func newListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}
