package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

// front is the MCP mode's endpoint: a reverse proxy of the upstream's
// Streamable HTTP endpoint that changes only what the guard must. Every
// request and every answer passes through as it is (sessions, the
// client's and the server's capabilities, notifications both ways,
// server-to-client requests and their answers, the listening stream and
// its resumption, subscriptions, logging levels, pings, cancellation),
// except:
//   - a tools/call of a guarded tool, which the guard answers (running it
//     upstream once, while relaying what the upstream sends meanwhile);
//   - the initialize result, which gains the tools.idempotency capability;
//   - the tools/list result, which gains each guarded tool's key argument;
//   - a cancellation of a guarded call, which is not forwarded: the run
//     outlives its caller;
//   - any message over the relay bound.
//
// A stdio upstream is served as Streamable HTTP by a bridge (bridge.go),
// so the front is the same for both.
type front struct {
	upstream *url.URL
	client   *http.Client
	limit    int64
	// keys is, by guarded tool, the key argument the proxy advertises in
	// tools/list and removes before the upstream (toolConfig.keyArgument).
	keys    map[string]string
	guarded map[string]bool
	m       *metrics
	log     *slog.Logger

	guard *mcpguard.Guard
	proxy *httputil.ReverseProxy

	mu      sync.Mutex
	running map[string]struct{} // guarded calls in flight, by session and id
}

// maxRequestBytes bounds a message from the client.
const maxRequestBytes = 4 << 20

// codeUpstreamLost is the error of a call whose upstream connection
// broke before it answered: nobody knows whether it ran.
const codeUpstreamLost = -32098

func newFront(upstream string, transport http.RoundTripper, limit int64, tools map[string]toolConfig, g *mcpguard.Guard, m *metrics, log *slog.Logger) (*front, error) {
	u, err := url.Parse(upstream)
	if err != nil {
		return nil, err
	}
	f := &front{
		upstream: u, limit: limit, keys: map[string]string{}, guarded: map[string]bool{}, m: m, log: log,
		client:  &http.Client{Transport: transport},
		running: map[string]struct{}{},
	}
	for name, t := range tools {
		f.guarded[name] = true
		if arg := t.keyArgument(); arg != "" {
			f.keys[name] = arg
		}
	}
	f.guard = g
	f.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			r.Out.URL.Path, r.Out.URL.RawPath = u.Path, u.RawPath
			// The proxy checked the client's Origin; upstream, the
			// proxy is the client, of no browser's origin.
			r.Out.Header.Del("Origin")
		},
		Transport:  transport,
		BufferPool: copyBuffers{},
		// A stream (text/event-stream, or an answer of unknown length) is
		// flushed as each write comes; a JSON answer, which relay reads
		// whole, goes out at once with its length.
		FlushInterval:  0,
		ModifyResponse: f.relay,
		ErrorLog:       slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.WarnContext(r.Context(), "the upstream MCP server cannot be reached", "error", err)
			http.Error(w, "the upstream MCP server cannot be reached", http.StatusBadGateway)
		},
	}
	return f, nil
}

// forwarded is what a request the proxy forwards as it is says of its
// answer: the call it answers, and how to rewrite the response.
type forwarded struct {
	id      json.RawMessage
	rewrite func([]byte) []byte
}

type forwardedKey struct{}

func (f *front) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !f.local(r) {
		http.Error(w, fmt.Sprintf("Forbidden: the Host %q or Origin %q is not this machine", r.Host, r.Header.Get("Origin")), http.StatusForbidden)
		return
	}
	if r.Method != http.MethodPost {
		f.proxy.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		http.Error(w, "the message is larger than idemproxy takes", http.StatusRequestEntityTooLarge)
		return
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	if name, ok := f.batchedGuardedCall(body); ok {
		writeJSON(w, http.StatusBadRequest, map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{
			"code": jsonrpc.CodeInvalidRequest, "message": fmt.Sprintf("idemproxy guards the tool %s: send its tools/call alone, not in a JSON-RPC batch", name)}})
		return
	}
	e, ok := envelopeOf(r.Context(), body)
	var fw forwarded
	switch e.Method {
	case "tools/call":
		if name := e.view.name; f.guarded[name] && e.isCall() {
			f.serveGuarded(w, r, e, name)
			return
		}
		done := f.m.passthrough()
		defer done()
	case "initialize", "server/discover":
		fw.rewrite = advertiseIdempotency
	case "tools/list":
		fw.rewrite = f.advertiseKeys
	case "notifications/cancelled":
		if f.isRunning(r.Header.Get("Mcp-Session-Id"), e.view.requestID) {
			w.WriteHeader(http.StatusAccepted) // the run outlives its caller
			return
		}
	}
	if e.isCall() {
		fw.id = e.ID
	}
	ctx := context.WithValue(r.Context(), forwardedKey{}, fw)
	if ok {
		ctx = withEnvelope(ctx, body, e) // read once, when the upstream is the stdio bridge
	}
	f.proxy.ServeHTTP(w, r.WithContext(ctx))
}

// batchedGuardedCall reports the guarded tool that a JSON-RPC batch (an
// array of messages, which the 2025-03-26 revision allows) calls, if it
// calls one. Such a batch is refused whole: passed through, its call would
// reach the upstream without a claim, and a batch's answer is not one call's
// to store. A batch without one passes through as it is.
func (f *front) batchedGuardedCall(body []byte) (string, bool) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 || body[0] != '[' {
		return "", false
	}
	var batch []json.RawMessage
	if json.Unmarshal(body, &batch) != nil {
		return "", false
	}
	for _, msg := range batch {
		if e, _ := readEnvelope(msg); e.Method == "tools/call" {
			if name := e.view.name; f.guarded[name] {
				return name, true
			}
		}
	}
	return "", false
}

// local is DNS-rebinding protection, as the MCP SDKs have it: a request
// that arrives on a loopback address must name a loopback Host, and a
// loopback Origin if it has one.
func (f *front) local(r *http.Request) bool {
	addr, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || !isLoopback(addr.String()) {
		return true
	}
	if !isLoopback(r.Host) {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		return err == nil && isLoopback(u.Host)
	}
	return true
}

// isLoopback reports whether hostport names this machine.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = strings.Trim(hostport, "[]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// relay bounds (and for initialize and tools/list rewrites) an answer the
// proxy forwards as it is. A JSON answer is one message: it is read whole
// here and sent with its length; a stream is relayed as it comes.
func (f *front) relay(res *http.Response) error {
	fw, _ := res.Request.Context().Value(forwardedKey{}).(forwarded)
	if res.StatusCode != http.StatusOK {
		return nil
	}
	body := &relayBody{src: res.Body, id: fw.id, limit: f.limit, rewrite: fw.rewrite}
	switch ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); ct {
	case "text/event-stream":
		body.events = newEventReader(res.Body, f.limit)
	case "application/json":
		body.json = res.Body
		msg, err := io.ReadAll(body)
		_ = res.Body.Close()
		if err != nil {
			return fmt.Errorf("reading the upstream's answer: %w", err)
		}
		res.Body, res.ContentLength = io.NopCloser(bytes.NewReader(msg)), int64(len(msg))
		res.Header.Set("Content-Length", strconv.Itoa(len(msg)))
		return nil
	default:
		return nil
	}
	// The answer may change length (a rewrite, the bound's error).
	res.Header.Del("Content-Length")
	res.Body, res.ContentLength = body, -1
	return nil
}

// running is one guarded call in flight, for call.
type running struct {
	header  http.Header
	id      json.RawMessage
	tool    string
	session string
	client  *eventWriter // what the upstream sends meanwhile, to the client
	// refused is the upstream's HTTP answer when it refused the call
	// outright (an unknown session, say): the proxy relays it as it is.
	refused *http.Response
	body    []byte
}

type runningKey struct{}

// serveGuarded answers e, a tools/call of the guarded tool, through the
// guard. The message is read once, by ServeHTTP: the guard reads SEP-3182's
// parameter from its params.
func (f *front) serveGuarded(w http.ResponseWriter, r *http.Request, e envelope, tool string) {
	rc := &running{header: r.Header.Clone(), id: e.ID, tool: tool, session: r.Header.Get("Mcp-Session-Id"), client: &eventWriter{w: w}}
	key := rc.session + "\x00" + string(e.ID)
	f.mu.Lock()
	f.running[key] = struct{}{}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.running, key)
		f.mu.Unlock()
	}()
	ctx := context.WithValue(r.Context(), runningKey{}, rc)
	res, err := f.m.observe(tool, func() (json.RawMessage, error) {
		return f.guard.ServeJSON(ctx, e.Params, r.Header, f.call)
	})
	if rc.refused != nil && !rc.client.started() {
		for k, v := range rc.refused.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(rc.refused.StatusCode)
		_, _ = w.Write(rc.body)
		return
	}
	if err == nil {
		rc.client.answer(response(e.ID, "result", res))
		return
	}
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) {
		werr = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
	}
	b, err := json.Marshal(werr)
	if err != nil {
		b, _ = json.Marshal(&jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()})
	}
	rc.client.answer(response(e.ID, "error", b))
}

// response is the JSON-RPC response to id whose member (result or error)
// is v. Both are JSON as decoded or encoded here, so they are written as
// they are, not scanned again; an empty v is null.
func response(id json.RawMessage, member string, v json.RawMessage) []byte {
	if len(v) == 0 {
		v = json.RawMessage("null")
	}
	out := make([]byte, 0, len(id)+len(v)+32)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, id...)
	out = append(out, `,"`...)
	out = append(out, member...)
	out = append(out, `":`...)
	out = append(out, v...)
	return append(out, '}')
}

// isRunning reports whether the call id of session is a guarded call in
// flight.
func (f *front) isRunning(session string, id json.RawMessage) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.running[session+"\x00"+string(bytes.TrimSpace(id))]
	return ok
}

// call runs a guarded tools/call upstream, innermost under the guard, and
// returns its result. What the upstream sends before it (progress, log
// messages, requests for sampling or elicitation) goes to the client as
// it comes. Its context is the guard's: the run outlives the client.
func (f *front) call(ctx context.Context, params json.RawMessage) (json.RawMessage, error) {
	rc, _ := ctx.Value(runningKey{}).(*running)
	if rc == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "idemproxy: a guarded call without its request"}
	}
	params = f.stripKey(rc.tool, params)
	body := request(rc.id, params)
	res, err := f.post(withCall(ctx, body, rc.id, params), rc.header, body)
	var op *net.OpError
	switch {
	case errors.As(err, &op) && op.Op == "dial":
		// Nothing was sent: a guarded call is released (UNAVAILABLE is
		// transient), and its retry runs afresh.
		return nil, fmt.Errorf("%w: %w: %w", errUpstreamDown, status.Error(codes.Unavailable, "upstream down"), err)
	case err != nil:
		// The call may have reached the upstream: nobody knows whether it
		// wrote.
		return nil, guard.UnknownOutcome("the connection to the upstream MCP server broke after the call was sent", err)
	}
	if res.StatusCode != http.StatusOK {
		rc.refused = res
		rc.body, _ = io.ReadAll(io.LimitReader(res.Body, 64<<10))
		_ = res.Body.Close()
		return nil, fmt.Errorf("%w: %w: the upstream answered HTTP %d", errUpstreamDown, status.Error(codes.Unavailable, "upstream refused"), res.StatusCode)
	}
	msg, err := f.await(ctx, rc, res)
	if err != nil {
		// The call reached the upstream: nobody knows whether it wrote.
		return nil, guard.UnknownOutcome("the upstream MCP server's answer broke off", err)
	}
	e, _ := readEnvelope(msg)
	switch {
	case e.Error != nil && e.Error.Code == codeTooLarge:
		return tooLargeResult(f.limit, params) // the tool ran; its answer is not relayed, and says so
	case e.Error != nil && e.Error.Code == codeUpstreamLost:
		return nil, guard.UnknownOutcome(e.Error.Message, nil)
	case e.Error != nil:
		return nil, &jsonrpc.Error{Code: e.Error.Code, Message: e.Error.Message, Data: e.Error.Data}
	case len(e.Result) == 0:
		return nil, guard.UnknownOutcome("the upstream MCP server answered neither a result nor an error", nil)
	}
	return e.Result, nil
}

// mayHold reports whether JSON msg may hold the name s: whether s is in
// it, or an escape that may spell one of its characters (\uXXXX, or \/).
// The other escapes, as in a text that quotes JSON, spell a quote, a
// backslash or a control character, which no name here has.
func mayHold(msg []byte, s string) bool {
	return bytes.Contains(msg, []byte(s)) || bytes.Contains(msg, []byte(`\u`)) || bytes.Contains(msg, []byte(`\/`))
}

// request is the tools/call of id with params, both JSON as decoded or
// encoded here, written as they are.
func request(id, params json.RawMessage) []byte {
	out := make([]byte, 0, len(id)+len(params)+64)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, id...)
	out = append(out, `,"method":"tools/call","params":`...)
	out = append(out, params...)
	return append(out, '}')
}

// errUpstreamDown is the error of a call the proxy could not send.
var errUpstreamDown = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the upstream MCP server cannot be reached"}

// post sends one message upstream with the client's headers: every one
// the revision binds to the message (MCP-Protocol-Version, Mcp-Method,
// Mcp-Name, Mcp-Param-*), the session's, authorization, the trace's, and
// any other end-to-end header, but the Origin the proxy checked.
func (f *front) post(ctx context.Context, header http.Header, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.upstream.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range header {
		if !notForwarded[k] {
			req.Header[k] = slices.Clone(v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	return f.client.Do(req)
}

// notForwarded are the headers of the client's message that the proxy does
// not send upstream with a guarded call: the connection's own (hop by
// hop, RFC 9110 section 7.6.1), those of the body it encodes again, the
// Host and Origin of the client's request, and a stream position that a
// POST does not have.
var notForwarded = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authorization": true, "Proxy-Authenticate": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Content-Length": true, "Content-Encoding": true, "Accept-Encoding": true, "Content-Type": true, "Accept": true,
	"Host": true, "Origin": true, "Last-Event-Id": true,
}

// await reads the upstream's answer to the guarded call: its response,
// with every other message relayed to the client meanwhile. A stream that
// ends before the response is resumed with Last-Event-ID, after the
// retry time the upstream asked for (SEP-1699).
func (f *front) await(ctx context.Context, rc *running, res *http.Response) ([]byte, error) {
	for {
		ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
		if ct == "application/json" {
			defer res.Body.Close()
			msg, err := io.ReadAll(io.LimitReader(res.Body, f.limit+1))
			if err != nil {
				return nil, err
			}
			if int64(len(msg)) > f.limit {
				return tooLargeMessage(rc.id, f.limit), nil
			}
			return msg, nil
		}
		if ct != "text/event-stream" {
			_ = res.Body.Close()
			return nil, fmt.Errorf("the upstream answered %q", ct)
		}
		events := newEventReader(res.Body, f.limit)
		var last string
		var retry time.Duration
		for {
			ev, err := events.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				_ = res.Body.Close()
				return nil, err
			}
			last, retry = cmp.Or(ev.id, last), max(retry, ev.retry)
			if ev.over {
				_ = res.Body.Close()
				return tooLargeMessage(rc.id, f.limit), nil
			}
			if len(bytes.TrimSpace(ev.data)) == 0 {
				continue // a priming event
			}
			if e, _ := readEnvelope(ev.data); e.answers(rc.id) {
				_ = res.Body.Close()
				return ev.data, nil
			}
			rc.client.event(ev.data)
		}
		_ = res.Body.Close()
		if last == "" {
			return nil, errors.New("the upstream's stream ended before its answer")
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		var err error
		if res, err = f.resume(ctx, rc.header, last); err != nil {
			return nil, err
		}
	}
}

// resume opens the upstream's stream again after the event last.
func (f *front) resume(ctx context.Context, header http.Header, last string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.upstream.String(), nil)
	if err != nil {
		return nil, err
	}
	for _, h := range []string{"Authorization", "Mcp-Session-Id", "Mcp-Protocol-Version"} {
		if v := header.Values(h); len(v) > 0 {
			req.Header[http.CanonicalHeaderKey(h)] = v
		}
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", last)
	res, err := f.client.Do(req)
	if err == nil && res.StatusCode != http.StatusOK {
		_ = res.Body.Close()
		return nil, fmt.Errorf("resuming the upstream's stream: HTTP %d", res.StatusCode)
	}
	return res, err
}

// eventWriter is the client's answer to a guarded call: a JSON message
// when the upstream sent nothing before its result, else a stream of
// server-sent events. The events carry no ids: a client that loses the
// stream re-sends the call with its key, and the guard answers it. Writes
// after the client left are dropped.
type eventWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	sse  bool
	gone bool
}

func (e *eventWriter) started() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sse
}

// event sends one message before the answer.
func (e *eventWriter) event(msg []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		return
	}
	if !e.sse {
		e.sse = true
		e.w.Header().Set("Content-Type", "text/event-stream")
		e.w.Header().Set("Cache-Control", "no-cache")
		e.w.WriteHeader(http.StatusOK)
	}
	if _, err := e.w.Write(eventBytes(nil, msg)); err != nil {
		e.gone = true
		return
	}
	_ = http.NewResponseController(e.w).Flush()
}

// answer sends the call's response, the last message.
func (e *eventWriter) answer(msg []byte) {
	e.mu.Lock()
	sse := e.sse
	e.mu.Unlock()
	if sse {
		e.event(msg)
		return
	}
	e.w.Header().Set("Content-Type", "application/json")
	e.w.WriteHeader(http.StatusOK)
	_, _ = e.w.Write(msg)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// advertiseIdempotency adds SEP-3182's tools.idempotency capability to an
// initialize response: the proxy reads params.idempotencyKey.
func advertiseIdempotency(msg []byte) []byte {
	return editResult(msg, func(result map[string]any) {
		caps, _ := result["capabilities"].(map[string]any)
		if caps == nil {
			caps = map[string]any{}
		}
		exp, _ := caps["experimental"].(map[string]any)
		if exp == nil {
			exp = map[string]any{}
		}
		if _, ok := exp[mcpguard.IdempotencyCapability]; !ok {
			exp[mcpguard.IdempotencyCapability] = map[string]any{}
		}
		caps["experimental"] = exp
		result["capabilities"] = caps
	})
}

// advertiseKeys adds each guarded tool's key argument to its input schema
// in a tools/list response, an optional string described for a model as
// mcpguard.KeySchema does, so that a model learns to send it.
func (f *front) advertiseKeys(msg []byte) []byte {
	return editResult(msg, func(result map[string]any) {
		tools, _ := result["tools"].([]any)
		for _, t := range tools {
			tool, _ := t.(map[string]any)
			name, _ := tool["name"].(string)
			arg, ok := f.keys[name]
			if !ok {
				continue
			}
			schema, _ := tool["inputSchema"].(map[string]any)
			if schema == nil {
				schema = map[string]any{"type": "object"}
			}
			props, _ := schema["properties"].(map[string]any)
			if _, declared := props[arg]; declared {
				continue // the upstream's own
			}
			withKey := maps.Clone(props)
			if withKey == nil {
				withKey = map[string]any{}
			}
			withKey[arg] = map[string]any{
				"type": "string", "minLength": 1, "maxLength": 255, "description": mcpguard.KeyDescription,
			}
			schema["properties"] = withKey
			tool["inputSchema"] = schema
		}
	})
}

// editResult is a JSON-RPC response with its result edited by edit; msg
// itself when it has no object result.
func editResult(msg []byte, edit func(map[string]any)) []byte {
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.UseNumber()
	if dec.Decode(&m) != nil {
		return msg
	}
	result, ok := m["result"].(map[string]any)
	if !ok {
		return msg
	}
	edit(result)
	b, err := json.Marshal(m)
	if err != nil {
		return msg
	}
	return b
}

// stripKey is params of a call of tool with its key argument removed, so
// that an upstream whose schema does not declare it is not sent it. Every
// other member goes as it came. Params that cannot hold the argument
// (its name is not in them, nor any escape) are not decoded.
func (f *front) stripKey(tool string, params json.RawMessage) json.RawMessage {
	arg, ok := f.keys[tool]
	if !ok || !mayHold(params, arg) {
		return params
	}
	var p map[string]json.RawMessage
	if json.Unmarshal(params, &p) != nil || p == nil {
		return params
	}
	var args map[string]json.RawMessage
	if json.Unmarshal(p["arguments"], &args) != nil || args == nil {
		return params // not an object: the upstream says what it makes of it
	}
	if _, sent := args[arg]; !sent {
		return params
	}
	delete(args, arg)
	b, err := json.Marshal(args)
	if err != nil {
		return params
	}
	p["arguments"] = b
	if out, err := json.Marshal(p); err == nil {
		return out
	}
	return params
}
