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
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-json-experiment/json/jsontext"
)

// bridge serves a stdio MCP server as Streamable HTTP, in every revision
// the server speaks, to the front in the same process (handlerTransport):
// nothing listens for it. The front (front.go) guards in front of it as it
// does in front of an HTTP upstream.
//
//   - A client of the 2025 revisions opens a session with initialize, and
//     gets a child process of its own: the child sees one client, with that
//     client's initialize and capabilities, as a stdio server expects.
//   - Requests of 2026-07-28 and later carry what they need in their _meta
//     envelope, so one child serves them all: the bridge gives each request
//     an id of its own upstream (clients' ids may collide), and a progress
//     token of its own, and puts the client's back on what the child
//     answers. Whether the child speaks that revision at all it learns once,
//     with a server/discover of its own (the stdio binding's probe); a child
//     that does not is answered as a server of the 2025 revisions answers a
//     request without a session, so that a client that can falls back to
//     initialize. Only the child's answer decides: a child slow to start
//     (a package manager fetching it, a host starting many servers at
//     once) keeps the requests that need its revision waiting, each at
//     most probeTimeout, and one that exits first is asked again when the
//     next one starts. As the HTTP face of that child, the bridge checks
//     the headers the revision binds to the body (headers.go).
//
// A child that exits is started again at the next message, and a session's
// new child is initialized as its client initialized the old one: the
// client's session goes on. A request in flight when its child exited is
// answered with codeUpstreamLost: nobody knows whether it ran.
//
// Messages pass through as they are. A response goes to the request that
// asked for it; a progress notification to the request that set its
// progress token; a notification of a subscription (subscriptions/listen)
// to the request that opened it; any other message the child sends (a log
// message, a request for sampling or elicitation) to the latest request
// still waiting, or else to the session's listening stream (GET), kept
// until one opens.
type bridge struct {
	argv  []string
	limit int64
	max   int           // the most sessions at once, the shared one included
	idle  time.Duration // a session idle this long is closed, and its child
	log   *slog.Logger
	// afterFunc starts a session's idle timer: time.AfterFunc, or a
	// test's clock.
	afterFunc func(time.Duration, func()) idleTimer
	// probeTimeout bounds how long a request waits for what the bridge
	// asks a child itself before the request can go to it: which
	// revisions it speaks (server/discover), a new child's initialize, a
	// page of its tools (tools/list). A request that has waited that long
	// for the revisions is refused errNotProbed, and the bridge goes on
	// waiting for the child's answer.
	probeTimeout time.Duration

	mu       sync.Mutex
	sessions map[string]*bridgeSession // 2025 sessions, by id
	shared   *bridgeSession            // the child of 2026-07-28 requests, while it serves
	era      string                    // what the child answered the probe: "" before it, eraModern or eraLegacy
	versions []string                  // the revisions of 2026-07-28 and later the child supports
	// bindings are the x-mcp-header bindings of each tool, from the
	// child's tools/list answers.
	bindings map[string][]paramHeader
	ids      atomic.Uint64
}

// The eras a stdio child can speak.
const (
	eraModern = "modern" // 2026-07-28 and later: server/discover, per-request _meta
	eraLegacy = "legacy" // the 2025 revisions: initialize
)

// defaultMaxSessions and defaultSessionIdle bound the bridge when the file
// sets no mcp.upstream.max_sessions or session_idle; defaultProbeTimeout is
// as long as the MCP SDKs wait for an answer by default, so that a child
// slow to start answers a host's first request as it would without the
// proxy.
const (
	defaultMaxSessions  = 64
	defaultSessionIdle  = 30 * time.Minute
	defaultProbeTimeout = time.Minute
)

// never is the idle time of a session that is never closed for being idle:
// over stdio the proxy's one session lasts as long as its host runs it.
const never = time.Duration(math.MaxInt64)

// queued bounds the messages kept for a listening stream not open yet.
const queued = 256

func newBridge(argv []string, limit int64, maxSessions int, idle time.Duration, log *slog.Logger) *bridge {
	if maxSessions <= 0 {
		maxSessions = defaultMaxSessions
	}
	if idle <= 0 {
		idle = defaultSessionIdle
	}
	return &bridge{argv: argv, limit: limit, max: maxSessions, idle: idle, log: log, probeTimeout: defaultProbeTimeout,
		sessions: map[string]*bridgeSession{}, bindings: map[string][]paramHeader{},
		afterFunc: func(d time.Duration, f func()) idleTimer { return time.AfterFunc(d, f) }}
}

// idleTimer is a session's idle timer, as time.AfterFunc's: Stop and
// Reset.
type idleTimer interface {
	Stop() bool
	Reset(time.Duration) bool
}

// bridgeSession is a client's session of the 2025 revisions, or the one
// shared by the requests of 2026-07-28 and later, with its child process.
type bridgeSession struct {
	b      *bridge
	id     string // the Mcp-Session-Id; "" for the shared session
	shared bool
	idle   idleTimer // running while no request waits (touch)

	// wmu orders messages to the child; it is held while a child starts.
	wmu  sync.Mutex
	proc *proc // the running child; nil before the first and once one exits
	// init is the client's initialize (2025), which every new child gets
	// first, and initialized whether the client then said
	// notifications/initialized.
	init        json.RawMessage
	initialized bool
	// listed is closed once the shared child's tools/list has been read
	// for the tools' header bindings (learnTools).
	listed chan struct{}

	mu       sync.Mutex
	closed   bool
	waiting  []*waiter          // requests waiting for their response, oldest first
	progress map[string]*waiter // by the progress token the child sees
	listen   *waiter            // the listening stream
	queue    [][]byte           // for the listening stream, until it opens
	done     chan struct{}      // closed once the session is closed and its child has exited
}

// proc is one child process.
type proc struct {
	stdin io.WriteCloser
	out   *child
	// probed is closed, for a shared child, once the bridge knows which
	// revisions the shared child speaks, or once this one exited before
	// it answered (unprobed says how; the bridge's era stays unknown).
	probed   chan struct{}
	unprobed error
}

// waiter is an HTTP response that carries messages to the client: a
// request's (id set), or the listening stream's.
type waiter struct {
	id     json.RawMessage // the client's request id
	upID   json.RawMessage // the id the child sees: id itself, or the bridge's (the shared session)
	method string
	// token is the progress token the child sees, and clientToken the
	// client's, when the bridge gave the request one of its own.
	token       string
	clientToken json.RawMessage
	proc        *proc // the child the request went to
	msgs        chan []byte
	end         chan struct{}
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
			http.Error(w, "GET opens a session's stream (the 2025 revisions: initialize first); the 2026-07-28 revision has none", http.StatusMethodNotAllowed)
			return
		}
		s.serveListen(w, r)
	case http.MethodDelete:
		if s == nil {
			http.Error(w, "DELETE ends a session (the 2025 revisions); the 2026-07-28 revision has none", http.StatusMethodNotAllowed)
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
	e, ok := envelopeOf(r.Context(), body)
	if !ok {
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": nil,
			"error": map[string]any{"code": -32700, "message": "not one JSON-RPC message"}})
		return
	}
	if s == nil {
		switch {
		case modernMessage(r.Header, e):
			b.serveModern(w, r, body, e)
			return
		case e.Method == "initialize" && e.isCall():
			if s, err = b.open(r.Context()); err != nil {
				b.refuse(w, r, err)
				return
			}
			w.Header().Set("Mcp-Session-Id", s.id)
		default:
			http.Error(w, "a message without an Mcp-Session-Id must be initialize", http.StatusBadRequest)
			return
		}
	}
	switch e.Method {
	case "initialize":
		s.wmu.Lock()
		s.init = slices.Clone(body)
		s.wmu.Unlock()
	case "notifications/initialized":
		s.wmu.Lock()
		s.initialized = true
		s.wmu.Unlock()
	}
	if !e.isCall() {
		if err := s.send(r.Context(), nil, body); err != nil {
			http.Error(w, "the upstream MCP server is gone: "+err.Error(), http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusAccepted)
		return
	}
	id := bytes.TrimSpace(e.ID)
	wt := &waiter{id: id, upID: id, method: e.Method, token: e.progressToken(), msgs: make(chan []byte, 16), end: make(chan struct{})}
	if !s.wait(wt) {
		http.Error(w, "no such session: initialize again", http.StatusNotFound)
		return
	}
	defer s.forget(wt)
	if err := s.send(r.Context(), wt, body); err != nil {
		http.Error(w, "the upstream MCP server is gone: "+err.Error(), http.StatusBadGateway)
		return
	}
	stream(w, r, wt)
}

// refuse answers a request the bridge could not give a child.
func (b *bridge) refuse(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errNotProbed) && r.Context().Err() == nil {
		b.log.WarnContext(r.Context(), "a request was refused: the stdio upstream has not said which revisions it speaks", "error", err)
	}
	if errors.Is(err, errTooManySessions) || errors.Is(err, errNotProbed) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	b.log.ErrorContext(r.Context(), "the upstream MCP server does not start", "error", err)
	http.Error(w, "the upstream MCP server does not start", http.StatusBadGateway)
}

// serveModern answers a message of 2026-07-28 or later through the shared
// child.
func (b *bridge) serveModern(w http.ResponseWriter, r *http.Request, body []byte, e envelope) {
	if !e.isCall() {
		w.WriteHeader(http.StatusAccepted) // the revision defines no notification over HTTP
		return
	}
	if e.Method == "initialize" {
		writeJSON(w, http.StatusNotFound, map[string]any{"jsonrpc": "2.0", "id": e.ID,
			"error": map[string]any{"code": codeMethodNotFound, "message": "Method not found: the 2026-07-28 revision has no initialize"}})
		return
	}
	if strings.TrimSpace(r.Header.Get("MCP-Protocol-Version")) != "" {
		if why := checkEnvelope(e); why != "" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": e.ID,
				"error": map[string]any{"code": -32602, "message": "Invalid params: " + why}})
			return
		}
	}
	if why := checkHeaders(r.Header, e); why != "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": e.ID,
			"error": map[string]any{"code": codeHeaderMismatch, "message": "Header mismatch: " + why}})
		return
	}
	s, err := b.sharedSession(r.Context())
	if err == nil {
		if v, _ := e.view.version(); !b.supports(v) {
			b.mu.Lock()
			supported := slices.Clone(b.versions)
			b.mu.Unlock()
			writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": e.ID, "error": map[string]any{
				"code": codeUnsupportedVersion, "message": "Unsupported protocol version: " + v,
				"data": map[string]any{"supported": supported, "requested": v}}})
			return
		}
	}
	switch {
	case errors.Is(err, errLegacyUpstream):
		// As a server of the 2025 revisions answers a message without a
		// session: a client that can falls back to initialize.
		http.Error(w, "the upstream MCP server speaks the 2025 revisions only: initialize first", http.StatusBadRequest)
		return
	case err != nil:
		b.refuse(w, r, err)
		return
	}
	if e.Method == "tools/call" {
		// A call's Mcp-Param-* headers are checked against its tool's
		// bindings, which a new child's tools/list gives.
		select {
		case <-s.toolsListed():
		case <-r.Context().Done():
			return
		}
	}
	if why := checkParams(r.Header, e, b.toolBindings(e)); why != "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": e.ID,
			"error": map[string]any{"code": codeHeaderMismatch, "message": "Header mismatch: " + why}})
		return
	}
	wt := &waiter{id: bytes.TrimSpace(e.ID), upID: b.newID(), method: e.Method, msgs: make(chan []byte, 16), end: make(chan struct{})}
	params, ok := e.Params, true
	if tok := e.progressToken(); tok != "" {
		wt.token = string(b.newID())
		wt.clientToken = json.RawMessage(tok)
		params, ok = setProgressToken(e.Params, json.RawMessage(wt.token))
	}
	msg, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": wt.upID, "method": e.Method, "params": params})
	if !ok || err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": e.ID,
			"error": map[string]any{"code": -32602, "message": "the params are not an object"}})
		return
	}
	if !s.wait(wt) {
		http.Error(w, "the upstream MCP server is gone", http.StatusBadGateway)
		return
	}
	defer s.forget(wt)
	if err := s.send(r.Context(), wt, msg); err != nil {
		http.Error(w, "the upstream MCP server is gone: "+err.Error(), http.StatusBadGateway)
		return
	}
	if !answer(w, r, wt) {
		// The client left, which on HTTP cancels its request.
		cancel, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/cancelled",
			"params": map[string]any{"requestId": wt.upID, "reason": "the client closed its stream"}})
		_ = s.send(context.WithoutCancel(r.Context()), nil, cancel)
	}
}

// errLegacyUpstream is the shared session's error when the child speaks
// only the 2025 revisions.
var errLegacyUpstream = errors.New("the upstream MCP server speaks the 2025 revisions only")

// sharedSession is the session of 2026-07-28 requests, its child started
// as needed, once the bridge knows that the child speaks that revision: a
// request waits for the child's answer at most probeTimeout.
func (b *bridge) sharedSession(ctx context.Context) (*bridgeSession, error) {
	b.mu.Lock()
	if b.era == eraLegacy {
		b.mu.Unlock()
		return nil, errLegacyUpstream
	}
	s := b.shared
	if s == nil {
		if len(b.sessions) >= b.max {
			b.mu.Unlock()
			return nil, errTooManySessions
		}
		s = b.newSession("", true)
		b.shared = s
	}
	b.mu.Unlock()
	wait := time.NewTimer(b.probeTimeout)
	defer wait.Stop()
	// A child that exited before it answered is followed by one more, in
	// the same wait: a child that keeps exiting is not started in a loop.
	for started := 0; ; started++ {
		s.wmu.Lock()
		if s.proc == nil {
			if err := s.start(ctx); err != nil {
				s.wmu.Unlock()
				return nil, err
			}
		}
		p := s.proc
		s.wmu.Unlock()
		select {
		case <-p.probed:
		case <-wait.C:
			return nil, fmt.Errorf("%w in %s; idemproxy goes on waiting for its answer", errNotProbed, b.probeTimeout)
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", errNotProbed, ctx.Err())
		}
		switch era := b.knownEra(); {
		case era == eraLegacy:
			return nil, errLegacyUpstream
		case era != "":
			return s, nil
		case started > 0:
			return nil, fmt.Errorf("%w: %w", errNotProbed, p.unprobed)
		}
		s.wmu.Lock()
		if s.proc == p {
			s.proc = nil
		}
		s.wmu.Unlock()
	}
}

// knownEra is the revisions the shared child speaks, as far as the bridge
// knows: eraModern, eraLegacy, or "" before a child answered.
func (b *bridge) knownEra() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.era
}

// errNotProbed refuses a request of 2026-07-28 for which the stdio child
// has not said whether it speaks that revision: it has not answered
// server/discover yet, or it exited first. Nothing is decided; the client
// may send the request again.
var errNotProbed = errors.New("the upstream MCP server has not answered server/discover")

// supports reports whether the child serves the revision v (of 2026-07-28
// or later), as its probe said.
func (b *bridge) supports(v string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Contains(b.versions, v)
}

// newID is an id the bridge gives a request upstream, as JSON.
func (b *bridge) newID() json.RawMessage {
	return json.RawMessage(strconv.Quote("idemproxy-" + strconv.FormatUint(b.ids.Add(1), 10)))
}

// answer writes wt's messages to the client: one JSON message when the
// response comes first, with the status the revision gives its error, or
// a stream of server-sent events otherwise. It reports whether the
// response reached the client.
func answer(w http.ResponseWriter, r *http.Request, wt *waiter) bool {
	var first []byte
	select {
	case msg, ok := <-wt.msgs:
		if !ok {
			return true
		}
		first = msg
	case <-wt.end:
		return true
	case <-r.Context().Done():
		return false
	}
	e, _ := readEnvelope(first)
	if e.Method == "" {
		status := http.StatusOK
		if e.Error != nil {
			status = modernStatus(e.Error.Code)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(first)
		return true
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(eventBytes(nil, first)); err != nil {
		return false
	}
	return stream(w, r, wt)
}

// stream writes wt's messages as server-sent events until it ends or the
// client leaves, which it reports with false.
func stream(w http.ResponseWriter, r *http.Request, wt *waiter) bool {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
	}
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	for {
		select {
		case msg, ok := <-wt.msgs:
			if !ok {
				return true
			}
			if _, err := w.Write(eventBytes(nil, msg)); err != nil {
				return false
			}
			_ = rc.Flush()
		case <-wt.end:
			return true
		case <-r.Context().Done():
			return false
		}
	}
}

var errTooManySessions = errors.New("idemproxy serves as many sessions of the stdio upstream as it may (mcp.upstream.max_sessions): retry shortly")

// open starts a session of the 2025 revisions and its child.
func (b *bridge) open(ctx context.Context) (*bridgeSession, error) {
	b.mu.Lock()
	n := len(b.sessions)
	if b.shared != nil {
		n++
	}
	if n >= b.max {
		b.mu.Unlock()
		return nil, errTooManySessions
	}
	s := b.newSession(rand.Text(), false)
	b.sessions[s.id] = s
	b.mu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.start(ctx); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (b *bridge) newSession(id string, shared bool) *bridgeSession {
	s := &bridgeSession{b: b, id: id, shared: shared, progress: map[string]*waiter{}, done: make(chan struct{})}
	s.idle = b.afterFunc(b.idle, s.close)
	return s
}

// start starts the session's child (s.wmu held): a session's new child is
// initialized as its client initialized the one before; the shared child
// is probed, the first time, for the revisions it speaks.
func (s *bridgeSession) start(ctx context.Context) error {
	cmd := exec.Command(s.b.argv[0], s.b.argv[1:]...) //nolint:gosec // the operator's configured upstream
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the upstream MCP server: %w", err)
	}
	p := &proc{stdin: stdin, out: &child{Reader: &boundedLines{in: bufio.NewReader(stdout), limit: s.b.limit}, cmd: cmd, stdin: stdin}}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		_ = p.out.Close()
		return errSessionClosed
	}
	s.proc = p
	s.b.log.DebugContext(ctx, "started the stdio upstream", "pid", cmd.Process.Pid, "session", s.id, "shared", s.shared)
	go s.read(p)
	switch {
	case s.shared:
		p.probed, s.listed = make(chan struct{}), make(chan struct{})
		go s.probe(context.WithoutCancel(ctx), p, s.listed)
	case s.init != nil:
		return s.reinitialize(ctx, p)
	}
	return nil
}

var errSessionClosed = errors.New("the session is closed")

// probe asks a new shared child, while the bridge does not know, which
// revisions it speaks (server/discover), and waits for its answer as long
// as the child runs; then it learns the tools' header bindings and closes
// listed. A discover result, or an error only a server of 2026-07-28
// answers, says the child speaks that revision; any other error says it
// speaks the 2025 revisions only. A child that exits before it answers
// says nothing: the next child is asked.
func (s *bridgeSession) probe(ctx context.Context, p *proc, listed chan struct{}) {
	defer close(listed)
	era := s.b.knownEra()
	if era == "" {
		res, rpcErr, err := s.call(ctx, p, "server/discover", nil, s.lockedWriteTo(p))
		if err == nil && rpcErr != nil && rpcErr.Code == codeUpstreamLost {
			err = errors.New(rpcErr.Message)
		}
		if err != nil {
			p.unprobed = err
			close(p.probed)
			return
		}
		versions := supportedVersions(res)
		era = eraLegacy
		if rpcErr == nil && len(versions) > 0 ||
			rpcErr != nil && (rpcErr.Code == codeUnsupportedVersion || rpcErr.Code == codeHeaderMismatch || rpcErr.Code == codeMissingCapability) {
			era = eraModern
		}
		if len(versions) == 0 {
			versions = []string{modernRevision}
		}
		s.b.mu.Lock()
		s.b.era, s.b.versions = era, versions
		s.b.mu.Unlock()
		s.b.log.InfoContext(ctx, "the stdio upstream's revisions", "era", era)
	}
	close(p.probed)
	if era == eraLegacy {
		s.close()
		return
	}
	s.learnTools(ctx, p)
}

// toolsListed is closed once the shared child's tools are listed.
func (s *bridgeSession) toolsListed() <-chan struct{} {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.listed == nil {
		listed := make(chan struct{})
		close(listed)
		return listed
	}
	return s.listed
}

// learnTools reads every page of the child's tools/list for the tools'
// x-mcp-header bindings.
func (s *bridgeSession) learnTools(ctx context.Context, p *proc) {
	var cursor string
	for range 100 {
		ctx, cancel := context.WithTimeout(ctx, s.b.probeTimeout)
		var params map[string]any
		if cursor != "" {
			params = map[string]any{"cursor": cursor}
		}
		res, rpcErr, err := s.call(ctx, p, "tools/list", params, s.lockedWriteTo(p))
		cancel()
		if err != nil || rpcErr != nil {
			return
		}
		if cursor = s.b.learn(res); cursor == "" {
			return
		}
	}
}

// learn takes the tools' bindings from a tools/list result, and returns
// its next cursor.
func (b *bridge) learn(result json.RawMessage) string {
	var list toolList
	if !readObject(result, &list) {
		return ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range list.Tools {
		b.bindings[t.Name] = paramHeaders(t.InputSchema)
	}
	return list.Next
}

// toolBindings are the x-mcp-header bindings of the tool a tools/call
// names, as far as the bridge knows them.
func (b *bridge) toolBindings(e envelope) []paramHeader {
	if e.Method != "tools/call" {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bindings[e.view.name]
}

// reinitialize initializes a session's new child as its client initialized
// the child before (s.wmu held).
func (s *bridgeSession) reinitialize(ctx context.Context, p *proc) error {
	params, err := initializeParams(s.init)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, s.b.probeTimeout)
	defer cancel()
	_, rpcErr, err := s.call(ctx, p, "initialize", params, s.writeTo(p))
	switch {
	case err != nil:
		return fmt.Errorf("initialize the upstream MCP server again: %w", err)
	case rpcErr != nil:
		return fmt.Errorf("initialize the upstream MCP server again: %s", rpcErr.Message)
	case s.initialized:
		return s.write(p, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`))
	}
	return nil
}

// initializeParams are the params of the client's initialize request.
func initializeParams(request []byte) (map[string]any, error) {
	var init struct {
		Params jsontext.Value `json:"params"`
	}
	if !readObject(request, &init) {
		return nil, errors.New("the client's initialize request is not a JSON object")
	}
	var params map[string]any
	if err := json.Unmarshal(init.Params, &params); err != nil {
		return nil, fmt.Errorf("the client's initialize params: %w", err)
	}
	return params, nil
}

// rpcError is a JSON-RPC error object.
type rpcError struct {
	Code    int64           `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// call sends the bridge's own request to the child p with write and waits
// for its answer. On the shared session the params get the revision's
// _meta envelope.
func (s *bridgeSession) call(ctx context.Context, p *proc, method string, params map[string]any, write func([]byte) error) (json.RawMessage, *rpcError, error) {
	if s.shared {
		if params == nil {
			params = map[string]any{}
		}
		params["_meta"] = map[string]any{metaProtocolVersion: modernRevision, metaClientCapabilities: map[string]any{},
			metaClientInfo: map[string]any{"name": "idemproxy", "version": version()}}
	}
	wt := &waiter{upID: s.b.newID(), method: method, proc: p, msgs: make(chan []byte, 16), end: make(chan struct{})}
	wt.id = wt.upID
	msg, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": wt.upID, "method": method, "params": params})
	if err != nil {
		return nil, nil, err
	}
	if !s.wait(wt) {
		return nil, nil, errSessionClosed
	}
	defer s.forget(wt)
	if err := write(msg); err != nil {
		return nil, nil, err
	}
	for {
		select {
		case m, ok := <-wt.msgs:
			if !ok {
				return nil, nil, errors.New("the upstream MCP server exited before it answered")
			}
			e, _ := readEnvelope(m)
			if e.Method != "" {
				continue // a notification or a request of the child's, while it starts: nobody to answer it
			}
			if e.Error != nil {
				return nil, e.Error, nil
			}
			return e.Result, nil, nil
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// send writes one message of the client to the session's child, starting
// one when none runs; wt is the request's waiter, nil for a message that
// has no answer.
func (s *bridgeSession) send(ctx context.Context, wt *waiter, msg []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	for attempt := 0; ; attempt++ {
		if s.proc == nil {
			if err := s.start(context.WithoutCancel(ctx)); err != nil {
				return err
			}
		}
		p := s.proc
		if wt != nil {
			s.mu.Lock()
			wt.proc = p
			s.mu.Unlock()
		}
		err := s.write(p, msg)
		if err == nil || attempt > 0 {
			return err
		}
		// The child exited: nothing was written. Start another.
		if s.proc == p {
			s.proc = nil
		}
	}
}

// writeTo writes to the child p, s.wmu held.
func (s *bridgeSession) writeTo(p *proc) func([]byte) error {
	return func(msg []byte) error { return s.write(p, msg) }
}

// lockedWriteTo writes to the child p, taking s.wmu.
func (s *bridgeSession) lockedWriteTo(p *proc) func([]byte) error {
	return func(msg []byte) error {
		s.wmu.Lock()
		defer s.wmu.Unlock()
		return s.write(p, msg)
	}
}

// write writes one message to the child p (s.wmu held).
func (s *bridgeSession) write(p *proc, msg []byte) error {
	_, err := p.stdin.Write(append(bytes.TrimSpace(msg), '\n'))
	return err
}

// wait registers wt as waiting for its response; false when the session
// is closed.
func (s *bridgeSession) wait(wt *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.waiting = append(s.waiting, wt)
	if wt.token != "" {
		s.progress[wt.token] = wt
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

// read routes the child p's messages until it exits. Then the requests
// that went to it are answered codeUpstreamLost, and the session's next
// message starts a child again.
func (s *bridgeSession) read(p *proc) {
	lines := bufio.NewScanner(p.out)
	lines.Buffer(make([]byte, 0, 64<<10), int(s.b.limit)+1<<10)
	for lines.Scan() {
		msg := slices.Clone(bytes.TrimSpace(lines.Bytes()))
		if len(msg) == 0 {
			continue
		}
		s.route(msg)
	}
	// A session closed by the proxy closes its child's output itself.
	if err := lines.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		s.b.log.Warn("the stdio upstream's output broke off", "error", err)
	}
	_ = p.out.Close() // the child has exited when it returns
	s.b.log.Debug("the stdio upstream exited", "pid", p.out.cmd.Process.Pid, "session", s.id, "shared", s.shared)
	s.lost(p)
	s.wmu.Lock()
	if s.proc == p {
		s.proc = nil
	}
	s.wmu.Unlock()
}

// lost answers every request that went to the child p, which exited
// before it answered them.
func (s *bridgeSession) lost(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = slices.DeleteFunc(s.waiting, func(wt *waiter) bool {
		if wt.proc != p {
			return false
		}
		deliver(wt, errorMessage(wt.id, codeUpstreamLost, "the upstream MCP server exited before it answered"))
		close(wt.msgs)
		return true
	})
	s.touch()
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
			if bytes.Equal(wt.upID, bytes.TrimSpace(e.ID)) {
				to = wt
			}
		}
		if to == nil {
			return // its client left
		}
		if to.method == "tools/list" && e.Result != nil {
			_ = s.b.learn(e.Result)
		}
		// The idle time starts over before the answer can reach the
		// client (its stream reads to.msgs without s.mu).
		s.waiting = slices.DeleteFunc(s.waiting, func(o *waiter) bool { return o == to })
		s.touch()
		deliver(to, s.forClient(to, msg, "id"))
		close(to.msgs)
		return
	case e.Method == "notifications/progress":
		if to = s.progress[progressTokenOf(e.Params)]; to != nil {
			msg = s.forClient(to, msg, "progressToken")
		}
	case s.shared:
		if sub := subscriptionOf(e.Params); sub != nil {
			for _, wt := range s.waiting {
				if bytes.Equal(wt.upID, sub) {
					to = wt
				}
			}
			if to != nil {
				msg = s.forClient(to, msg, "subscriptionId")
			}
		}
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

// forClient is a message of the child for the request wt, with the
// client's own id, progress token or subscription id in place of the
// bridge's (the shared session's), as what says.
func (s *bridgeSession) forClient(wt *waiter, msg []byte, what string) []byte {
	if !s.shared || bytes.Equal(wt.id, wt.upID) {
		return msg
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil {
		return msg
	}
	switch what {
	case "id":
		m["id"] = wt.id
	case "progressToken":
		if wt.clientToken == nil {
			return msg
		}
		params, ok := setMember(m["params"], "progressToken", wt.clientToken)
		if !ok {
			return msg
		}
		m["params"] = params
	case "subscriptionId":
		params, ok := setMeta(m["params"], metaSubscriptionID, wt.id)
		if !ok {
			return msg
		}
		m["params"] = params
	}
	b, err := json.Marshal(m)
	if err != nil {
		return msg
	}
	return b
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
		deliver(wt, errorMessage(wt.id, codeUpstreamLost, "the session of the upstream MCP server was closed before it answered"))
		close(wt.msgs)
	}
	s.waiting = nil
	s.mu.Unlock()
	s.idle.Stop()
	s.b.mu.Lock()
	if s.shared {
		if s.b.shared == s {
			s.b.shared = nil
		}
	} else {
		delete(s.b.sessions, s.id)
	}
	s.b.mu.Unlock()
	s.wmu.Lock()
	p := s.proc
	s.proc = nil
	s.wmu.Unlock()
	if p != nil {
		_ = p.out.Close() // the child has exited when it returns
	}
	close(s.done)
}

// closeAll ends every session.
func (b *bridge) closeAll() {
	b.mu.Lock()
	all := make([]*bridgeSession, 0, len(b.sessions)+1)
	for _, s := range b.sessions {
		all = append(all, s)
	}
	if b.shared != nil {
		all = append(all, b.shared)
	}
	b.mu.Unlock()
	for _, s := range all {
		s.close()
	}
}

// supportedVersions are the revisions a server/discover result lists; none
// when it lists none or is not a result.
func supportedVersions(res json.RawMessage) []string {
	var d struct {
		Versions []string `json:"supportedVersions"`
	}
	if !readObject(res, &d) {
		return nil
	}
	return d.Versions
}

// progressTokenOf is the token a progress notification names.
func progressTokenOf(params json.RawMessage) string {
	var p struct {
		Token jsontext.Value `json:"progressToken"`
	}
	if !readObject(params, &p) {
		return ""
	}
	return string(bytes.TrimSpace(p.Token))
}

// subscriptionOf is the subscription a notification's _meta names.
func subscriptionOf(params json.RawMessage) json.RawMessage {
	var p struct {
		Meta map[string]jsontext.Value `json:"_meta"`
	}
	if !readObject(params, &p) {
		return nil
	}
	return rawOf(p.Meta[metaSubscriptionID])
}

// setProgressToken is a request's params with token as their
// _meta.progressToken.
func setProgressToken(params json.RawMessage, token json.RawMessage) (json.RawMessage, bool) {
	return setMeta(params, "progressToken", token)
}

// setMeta is params with value as their _meta's key; false when params or
// their _meta are not objects.
func setMeta(params json.RawMessage, key string, value json.RawMessage) (json.RawMessage, bool) {
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil || p == nil {
		return nil, false
	}
	meta, ok := setMember(p["_meta"], key, value)
	if !ok {
		return nil, false
	}
	p["_meta"] = meta
	b, err := json.Marshal(p)
	return b, err == nil
}

// setMember is the object obj (absent or null taken for empty) with key
// set to value.
func setMember(obj json.RawMessage, key string, value json.RawMessage) (json.RawMessage, bool) {
	m := map[string]json.RawMessage{}
	if len(obj) > 0 && string(obj) != "null" {
		if json.Unmarshal(obj, &m) != nil || m == nil {
			return nil, false
		}
	}
	m[key] = value
	b, err := json.Marshal(m)
	return b, err == nil
}
