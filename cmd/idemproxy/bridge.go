package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"slices"
	"sync"
	"time"
)

// bridge serves a stdio MCP server as Streamable HTTP on loopback, one
// child process per session: the child sees one client, with that
// client's initialize and capabilities, as a stdio server expects. It
// passes messages through as they are. A response goes to the request
// that asked for it; a progress notification to the request that set its
// progress token; any other message the child sends (a log message, a
// request for sampling or elicitation) to the latest request still
// waiting, or else to the session's listening stream (GET), kept until
// one opens. The front (front.go) guards in front of it as it does in
// front of an HTTP upstream.
type bridge struct {
	argv  []string
	limit int64
	max   int           // the most sessions at once
	idle  time.Duration // a session idle this long is closed
	log   *slog.Logger
	// afterFunc starts a session's idle timer: time.AfterFunc, or a
	// test's clock.
	afterFunc func(time.Duration, func()) idleTimer

	mu       sync.Mutex
	sessions map[string]*bridgeSession
}

// defaultMaxSessions and defaultSessionIdle bound the bridge's children
// when the file sets no mcp.upstream.max_sessions or session_idle.
const (
	defaultMaxSessions = 64
	defaultSessionIdle = 30 * time.Minute
)

// queued bounds the messages kept for a listening stream not open yet.
const queued = 256

func newBridge(argv []string, limit int64, maxSessions int, idle time.Duration, log *slog.Logger) *bridge {
	if maxSessions <= 0 {
		maxSessions = defaultMaxSessions
	}
	if idle <= 0 {
		idle = defaultSessionIdle
	}
	return &bridge{argv: argv, limit: limit, max: maxSessions, idle: idle, log: log, sessions: map[string]*bridgeSession{},
		afterFunc: func(d time.Duration, f func()) idleTimer { return time.AfterFunc(d, f) }}
}

// idleTimer is a session's idle timer, as time.AfterFunc's: Stop and
// Reset.
type idleTimer interface {
	Stop() bool
	Reset(time.Duration) bool
}

// bridgeSession is one client's child process.
type bridgeSession struct {
	b     *bridge
	id    string
	stdin io.WriteCloser
	out   io.Closer
	idle  idleTimer // running while no request waits (touch)

	wmu sync.Mutex // one message at a time to the child

	mu       sync.Mutex
	closed   bool
	waiting  []*waiter          // requests waiting for their response, oldest first
	progress map[string]*waiter // by progress token
	listen   *waiter            // the listening stream
	queue    [][]byte           // for the listening stream, until it opens
	done     chan struct{}      // closed once the session is closed and its child has exited
}

// waiter is an HTTP response that carries messages to the client as
// server-sent events: a request's (id set), or the listening stream's.
type waiter struct {
	id   json.RawMessage
	msgs chan []byte // closed when the response is sent
	end  chan struct{}
}

func (b *bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	var s *bridgeSession
	if sid != "" {
		b.mu.Lock()
		s = b.sessions[sid]
		b.mu.Unlock()
		if s == nil {
			http.Error(w, "no such session: initialize again", http.StatusNotFound)
			return
		}
		s.mu.Lock()
		s.touch()
		s.mu.Unlock()
	}
	switch r.Method {
	case http.MethodPost:
		b.post(w, r, s)
	case http.MethodGet:
		if s == nil {
			http.Error(w, "GET needs an Mcp-Session-Id", http.StatusBadRequest)
			return
		}
		s.serveListen(w, r)
	case http.MethodDelete:
		if s == nil {
			http.Error(w, "DELETE needs an Mcp-Session-Id", http.StatusBadRequest)
			return
		}
		s.close()
		w.WriteHeader(http.StatusOK)
	default:
		http.Error(w, "POST, GET or DELETE", http.StatusMethodNotAllowed)
	}
}

func (b *bridge) post(w http.ResponseWriter, r *http.Request, s *bridgeSession) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		http.Error(w, "the message is too large", http.StatusRequestEntityTooLarge)
		return
	}
	e, ok := readEnvelope(body)
	if !ok {
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": nil,
			"error": map[string]any{"code": -32700, "message": "not one JSON-RPC message"}})
		return
	}
	if s == nil {
		if e.Method != "initialize" || !e.isCall() {
			http.Error(w, "a message without an Mcp-Session-Id must be initialize", http.StatusBadRequest)
			return
		}
		if s, err = b.open(); err != nil {
			if errors.Is(err, errTooManySessions) {
				w.Header().Set("Retry-After", "1")
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			b.log.ErrorContext(r.Context(), "the upstream MCP server does not start", "error", err)
			http.Error(w, "the upstream MCP server does not start", http.StatusBadGateway)
			return
		}
		w.Header().Set("Mcp-Session-Id", s.id)
	}
	if !e.isCall() {
		if err := s.send(body); err != nil {
			http.Error(w, "the upstream MCP server is gone", http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	wt := &waiter{id: bytes.TrimSpace(e.ID), msgs: make(chan []byte, 16), end: make(chan struct{})}
	if !s.wait(wt, progressToken(e.Params)) {
		http.Error(w, "the upstream MCP server is gone", http.StatusNotFound)
		return
	}
	defer s.forget(wt)
	if err := s.send(body); err != nil {
		http.Error(w, "the upstream MCP server is gone", http.StatusNotFound)
		return
	}
	stream(w, r, wt)
}

// stream writes wt's messages as server-sent events until it ends or the
// client leaves.
func stream(w http.ResponseWriter, r *http.Request, wt *waiter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for {
		select {
		case msg, ok := <-wt.msgs:
			if !ok {
				return
			}
			if _, err := w.Write(eventBytes(nil, msg)); err != nil {
				return
			}
			_ = rc.Flush()
		case <-wt.end:
			return
		case <-r.Context().Done():
			return
		}
	}
}

var errTooManySessions = errors.New("idemproxy serves as many sessions of the stdio upstream as it may (mcp.upstream.max_sessions): retry shortly")

// open starts a child for a new session.
func (b *bridge) open() (*bridgeSession, error) {
	b.mu.Lock()
	full := len(b.sessions) >= b.max
	b.mu.Unlock()
	if full {
		return nil, errTooManySessions
	}
	cmd := exec.Command(b.argv[0], b.argv[1:]...) //nolint:gosec // the operator's configured upstream
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the upstream MCP server: %w", err)
	}
	out := &child{Reader: &boundedLines{in: bufio.NewReader(stdout), limit: b.limit}, cmd: cmd, stdin: stdin}
	s := &bridgeSession{b: b, id: rand.Text(), stdin: stdin, out: out, progress: map[string]*waiter{}, done: make(chan struct{})}
	s.idle = b.afterFunc(b.idle, s.close)
	b.mu.Lock()
	b.sessions[s.id] = s
	b.mu.Unlock()
	go s.read(out)
	return s, nil
}

// send writes one message to the child.
func (s *bridgeSession) send(msg []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.stdin.Write(append(bytes.TrimSpace(msg), '\n')); err != nil {
		s.close()
		return err
	}
	return nil
}

// wait registers wt as waiting for its response; false when the session
// is closed.
func (s *bridgeSession) wait(wt *waiter, token string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.waiting = append(s.waiting, wt)
	if token != "" {
		s.progress[token] = wt
	}
	s.touch()
	return true
}

// touch starts the session's idle time over, or stops it while a request
// of its client waits for its answer: a session is idle only while none
// does, so a call that runs longer than session_idle keeps its session.
// Called with s.mu held.
func (s *bridgeSession) touch() {
	switch {
	case s.closed:
	case len(s.waiting) > 0:
		s.idle.Stop()
	default:
		s.idle.Reset(s.b.idle)
	}
}

// forget drops wt, answered or abandoned by its client.
func (s *bridgeSession) forget(wt *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = slices.DeleteFunc(s.waiting, func(o *waiter) bool { return o == wt })
	for k, o := range s.progress {
		if o == wt {
			delete(s.progress, k)
		}
	}
	if s.listen == wt {
		s.listen = nil
	}
	s.touch()
}

// read routes the child's messages until it exits, then closes the
// session.
func (s *bridgeSession) read(out io.Reader) {
	defer s.close()
	lines := bufio.NewScanner(out)
	lines.Buffer(make([]byte, 0, 64<<10), int(s.b.limit)+1<<10)
	for lines.Scan() {
		msg := slices.Clone(bytes.TrimSpace(lines.Bytes()))
		if len(msg) == 0 {
			continue
		}
		s.route(msg)
	}
}

// route sends one message of the child where it belongs.
func (s *bridgeSession) route(msg []byte) {
	e, _ := readEnvelope(msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	var to *waiter
	switch {
	case e.Method == "" && len(e.ID) > 0: // a response
		for _, wt := range s.waiting {
			if bytes.Equal(wt.id, bytes.TrimSpace(e.ID)) {
				to = wt
			}
		}
		if to == nil {
			return // its client left
		}
		// The idle time starts over before the answer can reach the
		// client (its stream reads to.msgs without s.mu).
		s.waiting = slices.DeleteFunc(s.waiting, func(o *waiter) bool { return o == to })
		s.touch()
		deliver(to, msg)
		close(to.msgs)
		return
	case e.Method == "notifications/progress":
		to = s.progress[progressTokenOf(e.Params)]
	}
	if to == nil && len(s.waiting) > 0 {
		to = s.waiting[len(s.waiting)-1]
	}
	if to == nil {
		to = s.listen
	}
	if to == nil {
		if len(s.queue) == queued {
			s.queue = s.queue[1:]
		}
		s.queue = append(s.queue, msg)
		return
	}
	deliver(to, msg)
}

// deliver hands msg to wt without blocking the child's reader; a client
// too slow to take 16 messages loses the oldest.
func deliver(wt *waiter, msg []byte) {
	for {
		select {
		case wt.msgs <- msg:
			return
		default:
			select {
			case <-wt.msgs:
			default:
			}
		}
	}
}

// serveListen is the session's listening stream: a GET takes the place
// of the one before.
func (s *bridgeSession) serveListen(w http.ResponseWriter, r *http.Request) {
	wt := &waiter{msgs: make(chan []byte, queued+16), end: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		http.Error(w, "no such session: initialize again", http.StatusNotFound)
		return
	}
	if s.listen != nil {
		close(s.listen.end)
	}
	s.listen = wt
	for _, msg := range s.queue {
		wt.msgs <- msg
	}
	s.queue = nil
	s.mu.Unlock()
	defer s.forget(wt)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	stream(w, r.WithContext(ctx), wt)
}

// close ends the session: its child, and an error answer to each request
// still waiting.
func (s *bridgeSession) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for _, wt := range s.waiting {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": wt.id, "error": map[string]any{
			"code": codeUpstreamLost, "message": "the upstream MCP server exited before it answered",
		}})
		deliver(wt, b)
		close(wt.msgs)
	}
	s.waiting = nil
	s.mu.Unlock()
	s.idle.Stop()
	s.b.mu.Lock()
	delete(s.b.sessions, s.id)
	s.b.mu.Unlock()
	_ = s.out.Close() // the child has exited when it returns
	close(s.done)
}

// closeAll ends every session.
func (b *bridge) closeAll() {
	b.mu.Lock()
	all := make([]*bridgeSession, 0, len(b.sessions))
	for _, s := range b.sessions {
		all = append(all, s)
	}
	b.mu.Unlock()
	for _, s := range all {
		s.close()
	}
}

// progressToken is the progress token a request's params set, as a map
// key; "" when none.
func progressToken(params json.RawMessage) string {
	var p struct {
		Meta struct {
			Token json.RawMessage `json:"progressToken"`
		} `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil {
		return ""
	}
	return string(bytes.TrimSpace(p.Meta.Token))
}

// progressTokenOf is the token a progress notification names.
func progressTokenOf(params json.RawMessage) string {
	var p struct {
		Token json.RawMessage `json:"progressToken"`
	}
	if json.Unmarshal(params, &p) != nil {
		return ""
	}
	return string(bytes.TrimSpace(p.Token))
}
