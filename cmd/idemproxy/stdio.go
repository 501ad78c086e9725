package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"golang.org/x/sys/unix"
)

// The MCP mode over stdio (--stdio): a host runs idemproxy as its MCP
// server's command, and idemproxy runs the upstream (a stdio child, or a
// server over Streamable HTTP). Each line the host writes is posted to the
// proxy's own endpoint, in process, as a client of Streamable HTTP posts
// it, and each message the endpoint answers is written back, a message a
// line. So the host gets the same guard, rewrites and bounds as a client
// over HTTP, on either kind of upstream, without a port to find or guard:
// the endpoint is reached in process (handlerTransport), and nothing
// listens.
//
// What a client of Streamable HTTP does, the adapter does for the host:
// it keeps the session id and the revision initialize gave, sends the
// headers 2026-07-28 binds to a request's body (MCP-Protocol-Version,
// Mcp-Method, Mcp-Name, an Mcp-Param-* for each argument the tool's
// schema marks with x-mcp-header), opens the session's listening stream
// after notifications/initialized, resumes a stream that ends before its
// answer, and ends the session with a DELETE when stdin closes.

// stdioAdapter is the host's one client of the endpoint.
type stdioAdapter struct {
	endpoint string
	client   *http.Client
	limit    int64 // the largest message the endpoint answers
	log      *slog.Logger

	wmu sync.Mutex
	out io.Writer

	mu      sync.Mutex
	session string // the 2025 session, once initialize answered
	version string // the revision initialize negotiated
	// init is the host's initialize, and initialized whether it then said
	// notifications/initialized: sent again when the upstream forgets the
	// session, which goes on.
	init        []byte
	initialized bool
	listening   string // the session whose listening stream is open
	// bindings are the x-mcp-header bindings of each tool, from the
	// tools/list answers the host read, or the adapter's own.
	bindings map[string][]paramHeader
	ids      uint64
	// inflight ends the exchange of each of the host's requests in
	// flight, by its id: a request the host cancels is a client that left.
	inflight map[string]context.CancelFunc

	renewing sync.Mutex     // one new session at a time
	calls    sync.WaitGroup // the messages in flight
}

// serveStdio serves h to the host on in and out until in ends or ctx
// does, then waits up to drain for the calls in flight, ends the session
// and returns. limit bounds one message the endpoint answers.
func serveStdio(ctx context.Context, h http.Handler, in io.Reader, out io.Writer, limit int64, drain time.Duration, log *slog.Logger) error {
	t := newHandlerTransport(h)
	defer t.Close()
	a := &stdioAdapter{endpoint: "http://localhost/mcp", client: &http.Client{Transport: t}, limit: limit + 64<<10,
		log: log, out: out, bindings: map[string][]paramHeader{}, inflight: map[string]context.CancelFunc{}}

	calls, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	lines, stop := make(chan []byte), make(chan struct{})
	defer close(stop)
	readErr := make(chan error, 1)
	go func() { readErr <- readLines(in, maxRequestBytes, lines, stop) }()
	var err error
read:
	for {
		select {
		case <-ctx.Done():
			break read
		case err = <-readErr:
			break read
		case line := <-lines:
			a.take(calls, line)
		}
	}
	if err != nil {
		log.ErrorContext(ctx, "reading stdin", "error", err)
	}
	// The host is done: let the calls in flight answer, as a drain does.
	done := make(chan struct{})
	go func() { a.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(drain):
		log.WarnContext(ctx, "calls still in flight after the drain timeout", "timeout", drain.String())
	}
	cancel()
	a.end(context.WithoutCancel(ctx))
	return err
}

// readLines sends each line of in, at most limit bytes, on lines; a line
// past the limit is read away and sent as nil. It returns at the end of
// in, or at the first line after stop is closed.
func readLines(in io.Reader, limit int, lines chan<- []byte, stop <-chan struct{}) error {
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		line, over, err := readLine(r, limit)
		if line = bytes.TrimSpace(line); over || len(line) > 0 {
			if over {
				line = nil
			}
			select {
			case lines <- line:
			case <-stop:
				return nil
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// readLine reads one line of r, or reads it away when it is over limit.
func readLine(r *bufio.Reader, limit int) (line []byte, over bool, err error) {
	for {
		chunk, err := r.ReadSlice('\n')
		if !over {
			line = append(line, chunk...)
			if len(bytes.TrimRight(line, "\r\n")) > limit {
				line, over = nil, true
			}
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return line, over, err
		}
	}
}

// take sends one message of the host to the endpoint. An initialize is
// answered before the next message is read, so that what follows it
// carries its session; every other message goes on its own. The session's
// listening stream opens after notifications/initialized.
func (a *stdioAdapter) take(ctx context.Context, line []byte) {
	if line == nil {
		a.write(errorMessage(nil, jsonrpc.CodeInvalidRequest, "the message is larger than idemproxy takes"))
		return
	}
	if line[0] == '[' && json.Valid(line) {
		a.calls.Go(func() { a.exchangeBatch(ctx, line) })
		return
	}
	e, ok := readEnvelope(line)
	if !ok {
		a.write(errorMessage(nil, jsonrpc.CodeParseError, "the message is not a JSON-RPC message"))
		return
	}
	read := withEnvelope(ctx, line, e) // the endpoint, in process, does not read it again
	if e.Method == "initialize" {
		a.mu.Lock()
		a.init = line
		a.mu.Unlock()
		a.exchange(read, line, e)
		return
	}
	switch {
	case e.isCall():
		read, done := a.track(read, e.ID)
		a.calls.Go(func() {
			defer done()
			a.exchange(read, line, e)
		})
	case e.Method == "notifications/cancelled":
		// The notification goes first: the front knows a guarded call
		// by it, whose run goes on without its caller.
		a.calls.Go(func() {
			a.exchange(read, line, e)
			a.cancel(e)
		})
	default:
		a.calls.Go(func() { a.exchange(read, line, e) })
	}
	if e.Method == "notifications/initialized" {
		a.mu.Lock()
		a.initialized = true
		a.mu.Unlock()
		a.startListening(ctx)
	}
}

// track gives the host's request id a context of its own, which cancel
// ends; done forgets it.
func (a *stdioAdapter) track(ctx context.Context, id json.RawMessage) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	key := compactID(id)
	a.mu.Lock()
	a.inflight[key] = cancel
	a.mu.Unlock()
	return ctx, func() {
		a.mu.Lock()
		delete(a.inflight, key)
		a.mu.Unlock()
		cancel()
	}
}

// cancel ends the exchange of the request a notifications/cancelled
// names, as a client of Streamable HTTP that cancels closes its stream:
// the upstream stops waiting on it, and the host, which gave up, is sent
// nothing more for it.
func (a *stdioAdapter) cancel(e envelope) {
	id := e.view.requestID
	if len(id) == 0 {
		return
	}
	a.mu.Lock()
	cancel := a.inflight[compactID(id)]
	a.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// compactID is a request id as a map key: 7 and 7.0 are not the same id,
// but blanks do not count.
func compactID(id json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, id) != nil {
		return string(id)
	}
	return b.String()
}

// startListening opens the session's listening stream, once a session.
func (a *stdioAdapter) startListening(ctx context.Context) {
	a.mu.Lock()
	session := a.session
	open := session != "" && a.listening != session
	if open {
		a.listening = session
	}
	a.mu.Unlock()
	if open {
		go a.listen(ctx, session)
	}
}

// exchange posts one message and writes what the endpoint answers. A
// session the upstream no longer knows (it restarted) is initialized
// again, as the host initialized it, and the message sent once more.
func (a *stdioAdapter) exchange(ctx context.Context, msg []byte, e envelope) {
	res, session, err := a.post(ctx, msg, e)
	if err == nil && res.StatusCode == http.StatusNotFound && session != "" && e.Method != "initialize" {
		_ = res.Body.Close()
		if err = a.renew(ctx, session); err == nil {
			res, session, err = a.post(ctx, msg, e)
		}
	}
	if err != nil {
		a.fail(ctx, e, "idemproxy could not serve the message: "+err.Error())
		return
	}
	defer res.Body.Close()
	if e.Method == "initialize" {
		if id := res.Header.Get("Mcp-Session-Id"); id != "" {
			a.mu.Lock()
			a.session = id
			a.mu.Unlock()
		}
	}
	switch {
	case res.StatusCode == http.StatusAccepted:
		return
	case res.StatusCode != http.StatusOK:
		a.refused(e, res)
		return
	}
	var answered bool
	for {
		last, ok, err := a.relay(res, e)
		answered = answered || ok
		if answered || !e.isCall() || err != nil || last == "" {
			if !answered && e.isCall() {
				a.fail(ctx, e, "the upstream's stream ended before its answer")
			}
			return
		}
		_ = res.Body.Close()
		if res, err = a.get(ctx, session, last); err != nil {
			a.fail(ctx, e, "resuming the upstream's stream: "+err.Error())
			return
		}
		defer res.Body.Close()
	}
}

// exchangeBatch posts a JSON-RPC batch (the 2025-03-26 revision's) as it
// is, and writes what the endpoint answers: the batch's answers, or its
// refusal (the front refuses a batch that calls a guarded tool).
func (a *stdioAdapter) exchangeBatch(ctx context.Context, batch []byte) {
	res, _, err := a.post(ctx, batch, envelope{})
	if err != nil {
		a.log.WarnContext(ctx, "a batch of the host was not delivered", "error", err)
		return
	}
	defer res.Body.Close()
	switch res.StatusCode {
	case http.StatusAccepted:
	case http.StatusOK:
		if _, _, err := a.relay(res, envelope{}); err != nil {
			a.log.WarnContext(ctx, "the answer to a batch of the host broke off", "error", err)
		}
	default:
		body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
		if json.Valid(body) {
			a.write(body)
			return
		}
		a.log.WarnContext(ctx, "the upstream refused a batch of the host", "status", res.StatusCode, "answer", string(body))
	}
}

// post sends one message with the headers a client of Streamable HTTP
// sends, and reports the session it named.
func (a *stdioAdapter) post(ctx context.Context, msg []byte, e envelope) (*http.Response, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.endpoint, bytes.NewReader(msg))
	if err != nil {
		return nil, "", err
	}
	session := a.headers(ctx, req.Header, e)
	res, err := a.client.Do(req)
	return res, session, err
}

// renew initializes the session again when it is still stale: the host's
// initialize (under an id of the proxy's, its answer not the host's to
// read), then notifications/initialized if the host had said it, and
// opens the new session's listening stream.
func (a *stdioAdapter) renew(ctx context.Context, stale string) error {
	a.renewing.Lock()
	defer a.renewing.Unlock()
	a.mu.Lock()
	current, init, initialized := a.session, a.init, a.initialized
	a.mu.Unlock()
	if current != stale {
		return nil // renewed while this message waited
	}
	msg, ok := setMember(init, "id", json.RawMessage(`"idemproxy-initialize-again"`))
	if !ok {
		return errors.New("the upstream forgot the session, and the host's initialize cannot be sent again")
	}
	// The stale session stays the one the others send until this one
	// is known: each of them that meets the 404 waits here, then sends
	// again on the new session.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.endpoint, bytes.NewReader(msg))
	if err != nil {
		return err
	}
	e, _ := readEnvelope(msg)
	a.headers(ctx, req.Header, e)
	req.Header.Del("Mcp-Session-Id")
	res, err := a.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	id := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != http.StatusOK || id == "" {
		return fmt.Errorf("the upstream forgot the session and refused a new one: HTTP %d", res.StatusCode)
	}
	a.mu.Lock()
	a.session = id
	a.mu.Unlock()
	a.log.InfoContext(ctx, "the upstream forgot the host's session: initialized it again", "session", id)
	if initialized {
		note := []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		e, _ := readEnvelope(note)
		if res, _, err := a.post(ctx, note, e); err == nil {
			_ = res.Body.Close()
		}
		a.startListening(ctx)
	}
	return nil
}

// relay writes the messages of one answer; ok reports whether the
// response to e was among them, last is the stream's last event id.
func (a *stdioAdapter) relay(res *http.Response, e envelope) (last string, ok bool, err error) {
	ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	if ct == "application/json" {
		msg, err := io.ReadAll(io.LimitReader(res.Body, a.limit))
		if err != nil {
			return "", false, err
		}
		a.answer(e, msg)
		return "", true, nil
	}
	if ct != "text/event-stream" {
		return "", false, fmt.Errorf("the endpoint answered %q", ct)
	}
	events := newEventReader(res.Body, a.limit)
	for {
		ev, err := events.next()
		if errors.Is(err, io.EOF) {
			return last, ok, nil
		}
		if err != nil {
			return last, ok, err
		}
		last = cmp.Or(ev.id, last)
		if ev.over || len(bytes.TrimSpace(ev.data)) == 0 {
			continue
		}
		if m, _ := readEnvelope(ev.data); e.isCall() && m.answers(e.ID) {
			a.answer(e, ev.data)
			return last, true, nil
		}
		a.write(ev.data)
	}
}

// answer writes the response to e, learning from it what later requests
// carry: initialize's revision, the tools' header bindings.
func (a *stdioAdapter) answer(e envelope, msg []byte) {
	switch e.Method {
	case "initialize":
		var r struct {
			Result struct {
				ProtocolVersion string `json:"protocolVersion"`
			} `json:"result"`
		}
		if readObject(msg, &r) && r.Result.ProtocolVersion != "" {
			a.mu.Lock()
			a.version = r.Result.ProtocolVersion
			a.mu.Unlock()
		}
	case "tools/list":
		a.learn(msg)
	}
	a.write(msg)
}

// learn keeps the x-mcp-header bindings of each tool a tools/list answer
// lists; it returns the answer's next cursor.
func (a *stdioAdapter) learn(msg []byte) string {
	var r struct {
		Result toolList `json:"result"`
	}
	if !readObject(msg, &r) {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, t := range r.Result.Tools {
		a.bindings[t.Name] = paramHeaders(t.InputSchema)
	}
	return r.Result.Next
}

// headers are what a client of Streamable HTTP sends with e; session is
// the session they name.
func (a *stdioAdapter) headers(ctx context.Context, h http.Header, e envelope) (session string) {
	h.Set("Content-Type", "application/json")
	h.Set("Accept", "application/json, text/event-stream")
	a.mu.Lock()
	session, version := a.session, a.version
	a.mu.Unlock()
	if session != "" {
		h.Set("Mcp-Session-Id", session)
	}
	modern := false
	if v, ok := e.view.version(); ok {
		version, modern = v, v >= modernRevision
	}
	if version != "" {
		h.Set("MCP-Protocol-Version", version)
	}
	if !modern || e.Method == "" {
		return session
	}
	h.Set("Mcp-Method", e.Method)
	name, ok := bodyName(e)
	if !ok {
		return session
	}
	h.Set("Mcp-Name", headerText(name))
	if e.Method != "tools/call" {
		return session
	}
	bindings := a.bindingsOf(ctx, name, e)
	if len(bindings) == 0 {
		return session
	}
	args := e.arguments()
	for _, b := range bindings {
		if arg, ok := argument(args, b.path); ok {
			h.Set("Mcp-Param-"+b.name, paramText(arg))
		}
	}
	return session
}

// bindingsOf are the header bindings of tool. A tool the host called
// without a tools/list the adapter saw is looked up once with a
// tools/list of the adapter's own, in the envelope of the call e.
func (a *stdioAdapter) bindingsOf(ctx context.Context, tool string, e envelope) []paramHeader {
	a.mu.Lock()
	b, known := a.bindings[tool]
	a.mu.Unlock()
	if known {
		return b
	}
	envelope := map[string]json.RawMessage{}
	for _, k := range []string{metaProtocolVersion, metaClientCapabilities, metaClientInfo} {
		if v, ok := e.view.meta[k]; ok {
			envelope[k] = v
		}
	}
	cursor := ""
	for range 100 { // pages
		params := map[string]any{"_meta": envelope}
		if cursor != "" {
			params["cursor"] = cursor
		}
		msg, err := a.call(ctx, "tools/list", params)
		if err != nil {
			a.log.WarnContext(ctx, "listing the upstream's tools for their header bindings", "error", err)
			break
		}
		if cursor = a.learn(msg); cursor == "" {
			break
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b, known = a.bindings[tool]
	if !known {
		a.bindings[tool] = nil // not a tool the upstream lists: its own answer says so
	}
	return b
}

// call is a request of the adapter's own, in the 2026-07-28 revision, and
// its response.
func (a *stdioAdapter) call(ctx context.Context, method string, params map[string]any) ([]byte, error) {
	a.mu.Lock()
	a.ids++
	id := fmt.Sprintf(`"idemproxy-stdio-%d"`, a.ids)
	a.mu.Unlock()
	msg, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(id), "method": method, "params": params})
	if err != nil {
		return nil, err
	}
	e, _ := readEnvelope(msg)
	res, _, err := a.post(ctx, msg, e)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d", res.StatusCode)
	}
	if ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); ct == "application/json" {
		return io.ReadAll(io.LimitReader(res.Body, a.limit))
	}
	events := newEventReader(res.Body, a.limit)
	for {
		ev, err := events.next()
		if err != nil {
			return nil, err
		}
		if m, _ := readEnvelope(ev.data); m.answers(e.ID) {
			return ev.data, nil
		}
	}
}

// listen relays the session's listening stream (the server's requests
// and notifications outside any call) until the session or ctx ends.
func (a *stdioAdapter) listen(ctx context.Context, session string) {
	last := ""
	for ctx.Err() == nil {
		res, err := a.get(ctx, session, last)
		if err != nil {
			a.log.DebugContext(ctx, "the session's listening stream", "error", err)
			return
		}
		got, _, err := a.relay(res, envelope{})
		_ = res.Body.Close()
		if err != nil || got == "" {
			return // a stream without event ids cannot be resumed
		}
		last = got
	}
}

// get opens session's stream ("" for a request of the 2026-07-28
// revision, which has none), after the event last when it is set.
func (a *stdioAdapter) get(ctx context.Context, session, last string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.endpoint, nil)
	if err != nil {
		return nil, err
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	a.mu.Lock()
	if a.version != "" {
		req.Header.Set("MCP-Protocol-Version", a.version)
	}
	a.mu.Unlock()
	req.Header.Set("Accept", "text/event-stream")
	if last != "" {
		req.Header.Set("Last-Event-ID", last)
	}
	res, err := a.client.Do(req)
	if err == nil && res.StatusCode != http.StatusOK {
		_ = res.Body.Close()
		return nil, fmt.Errorf("HTTP %d", res.StatusCode)
	}
	return res, err
}

// end ends the session, when there is one (its stdio child with it).
func (a *stdioAdapter) end(ctx context.Context) {
	a.mu.Lock()
	session, version := a.session, a.version
	a.mu.Unlock()
	if session == "" {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, a.endpoint, nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("MCP-Protocol-Version", version)
	if res, err := a.client.Do(req); err == nil {
		_ = res.Body.Close()
	}
}

// refused relays an answer other than 200 and 202: the JSON-RPC error it
// carries, or else one that says what the endpoint answered.
func (a *stdioAdapter) refused(e envelope, res *http.Response) {
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if !e.isCall() {
		a.log.Warn("the upstream refused a message of the host", "method", e.Method, "status", res.StatusCode, "answer", string(body))
		return
	}
	if m, ok := readEnvelope(body); ok && m.Error != nil {
		a.write(errorMessage(e.ID, m.Error.Code, m.Error.Message))
		return
	}
	a.write(errorMessage(e.ID, jsonrpc.CodeInternalError, fmt.Sprintf("%s: %s", res.Status, strings.TrimSpace(string(body)))))
}

// fail answers the request e with an error, if e is a request that the
// host did not cancel.
func (a *stdioAdapter) fail(ctx context.Context, e envelope, why string) {
	if ctx.Err() != nil {
		return // cancelled by the host, or past the drain: nobody waits
	}
	if !e.isCall() {
		a.log.WarnContext(ctx, "a message of the host was not delivered", "method", e.Method, "error", why)
		return
	}
	a.write(errorMessage(e.ID, codeUpstreamLost, why))
}

// write sends one message to the host, on a line of its own.
func (a *stdioAdapter) write(msg []byte) {
	var b bytes.Buffer
	if err := json.Compact(&b, msg); err != nil {
		a.log.Warn("the upstream sent a message that is not JSON; dropped", "error", err)
		return
	}
	b.WriteByte('\n')
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if _, err := a.out.Write(b.Bytes()); err != nil {
		a.log.Warn("writing to stdout", "error", err)
	}
}

// hostInput is what --stdio reads the host's messages from: stdin, read
// through Go's poller when it is a pipe or a socket, as a host's is.
// os.Stdin reads a pipe with a blocking read(2): the thread waits in the
// kernel while the host says nothing, the runtime's monitor hands its P
// to another thread for the rest of the proxy's work, and each message
// the host writes costs the hand-off back. Through the poller a read
// that would wait parks only its goroutine. On this project's machine
// that was a sixth to a third of the proxy's CPU a call
// (docs/performance.md).
//
// Nonblocking is a flag of the pipe's open file, which other processes
// of the host could share with this one: restore clears it again. A
// stdin already nonblocking is read through the poller as it is; a
// terminal, a file or /dev/null is read as os.Stdin reads it.
func hostInput() (in *os.File, restore func()) {
	if !stdinBlockingPipe() || unix.SetNonblock(unix.Stdin, true) != nil {
		return os.Stdin, func() {}
	}
	// NewFile sees the flag and reads the descriptor through the poller.
	return os.NewFile(uintptr(unix.Stdin), "/dev/stdin"), func() { _ = unix.SetNonblock(unix.Stdin, false) }
}

// stdinBlockingPipe is whether stdin is a pipe or a socket in blocking
// mode.
func stdinBlockingPipe() bool {
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode()&(os.ModeNamedPipe|os.ModeSocket) == 0 {
		return false
	}
	flags, err := unix.FcntlInt(uintptr(unix.Stdin), unix.F_GETFL, 0)
	return err == nil && flags&unix.O_NONBLOCK == 0
}
