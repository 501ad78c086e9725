package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// The messages of Streamable HTTP, read and written one at a time: a POST's
// answer is one JSON message or a stream of server-sent events, each
// event one JSON-RPC message. The proxy holds at most the relay bound
// (max_result_bytes) of one message.

// sseEvent is one server-sent event.
type sseEvent struct {
	raw    []byte   // as read, with the blank line that ends it
	fields []string // its lines other than data (id, event, retry, comments)
	data   []byte   // its data lines, joined by "\n"
	id     string
	retry  time.Duration
	over   bool // larger than the bound: read away, nothing kept
}

// eventReader reads a stream of server-sent events one whole event at a
// time, each at most limit bytes.
type eventReader struct {
	in    *bufio.Reader
	limit int64
}

func newEventReader(r io.Reader, limit int64) *eventReader {
	return &eventReader{in: bufio.NewReader(r), limit: limit}
}

// next reads the next event; io.EOF when the stream ends between events.
func (r *eventReader) next() (sseEvent, error) {
	var ev sseEvent
	var size int64
	var line []byte
	content, started := 0, false
	for {
		chunk, err := r.in.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) && !errors.Is(err, io.EOF) {
			return ev, err
		}
		size += int64(len(chunk))
		if !ev.over && size > r.limit {
			ev = sseEvent{over: true}
			line = nil
		}
		if !ev.over {
			ev.raw = append(ev.raw, chunk...)
			line = append(line, chunk...)
		}
		content += len(bytes.TrimRight(chunk, "\r\n"))
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		eof := errors.Is(err, io.EOF)
		switch {
		case content == 0 && !eof && started:
			return ev, nil // the blank line that ends the event
		case content == 0 && !eof:
			ev.raw = nil // blank lines between events
		case content > 0:
			started = true
			if !ev.over {
				ev.field(bytes.TrimRight(line, "\r\n"))
			}
		}
		line, content = nil, 0
		if eof {
			if started {
				return ev, nil
			}
			return ev, io.EOF
		}
	}
}

// field takes one line of the event.
func (ev *sseEvent) field(line []byte) {
	name, value, _ := strings.Cut(string(line), ":")
	value = strings.TrimPrefix(value, " ")
	switch name {
	case "data":
		if ev.data != nil {
			ev.data = append(ev.data, '\n')
		}
		ev.data = append(ev.data, value...)
		if ev.data == nil {
			ev.data = []byte{}
		}
		return
	case "id":
		ev.id = value
	case "retry":
		if ms, err := strconv.Atoi(value); err == nil && ms >= 0 {
			ev.retry = time.Duration(ms) * time.Millisecond
		}
	}
	ev.fields = append(ev.fields, string(line))
}

// eventBytes is a server-sent event of fields and the message data.
func eventBytes(fields []string, data []byte) []byte {
	var b bytes.Buffer
	for _, f := range fields {
		b.WriteString(f)
		b.WriteByte('\n')
	}
	if len(fields) == 0 {
		b.WriteString("event: message\n")
	}
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		b.WriteString("data: ")
		b.Write(line)
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	return b.Bytes()
}

// envelope is what the proxy reads of a JSON-RPC message: a request or a
// notification has a method; a response has an id and no method. A
// request's or a notification's params are read once, with the envelope
// (view): what the proxy's checks and headers need of them.
//
// Members are matched by their exact names, the last of a name counting,
// as JSON.parse and the MCP SDKs read them. encoding/json matches a
// struct's fields case-insensitively: read that way, a call could name one
// method or tool to the proxy ("METHOD", "NAME") and another to its
// server, which would run a guarded tool unguarded.
type envelope struct {
	ID     json.RawMessage
	Method string
	Params json.RawMessage
	Result json.RawMessage
	Error  *rpcError
	view   paramsView
}

// paramsView is what the proxy reads of a message's params: its _meta
// (nil when absent or not an object), the name or URI it names (a string,
// else ""), its arguments as they are, and the request a cancellation
// names. It is read-only: envelopes share it.
type paramsView struct {
	meta      map[string]json.RawMessage
	name, uri string
	arguments json.RawMessage
	requestID json.RawMessage
}

// readEnvelope reads msg's envelope; ok is false when msg is not a JSON
// object.
func readEnvelope(msg []byte) (envelope, bool) {
	var m struct {
		ID     jsontext.Value `json:"id"`
		Method jsontext.Value `json:"method"`
		Params jsontext.Value `json:"params"`
		Result jsontext.Value `json:"result"`
		Error  jsontext.Value `json:"error"`
	}
	if !readObject(msg, &m) {
		return envelope{}, false
	}
	e := envelope{ID: rawOf(m.ID), Params: rawOf(m.Params), Result: rawOf(m.Result)}
	_ = jsonv2.Unmarshal(m.Method, &e.Method, readOptions)
	e.Error = readError(m.Error)
	return e.viewed(), true
}

// readError reads a JSON-RPC error object by its members' exact names,
// each on its own (one of the wrong type is left zero, and the others
// read); nil when raw is not an object.
func readError(raw jsontext.Value) *rpcError {
	var m struct {
		Code    jsontext.Value `json:"code"`
		Message jsontext.Value `json:"message"`
		Data    jsontext.Value `json:"data"`
	}
	if !readObject(raw, &m) {
		return nil
	}
	e := &rpcError{Data: rawOf(m.Data)}
	_ = jsonv2.Unmarshal(m.Code, &e.Code, readOptions)
	_ = jsonv2.Unmarshal(m.Message, &e.Message, readOptions)
	return e
}

// viewed is e with its params' view, read when e is a request or a
// notification with params.
func (e envelope) viewed() envelope {
	if e.Method != "" && len(e.Params) > 0 {
		e.view = readParams(e.Params)
	}
	return e
}

// readParams reads a message's params for its view.
func readParams(params json.RawMessage) paramsView {
	var m struct {
		Meta      jsontext.Value `json:"_meta"`
		Name      jsontext.Value `json:"name"`
		URI       jsontext.Value `json:"uri"`
		Arguments jsontext.Value `json:"arguments"`
		RequestID jsontext.Value `json:"requestId"`
	}
	if !readObject(params, &m) {
		return paramsView{}
	}
	v := paramsView{arguments: rawOf(m.Arguments), requestID: rawOf(m.RequestID)}
	if !readObject(m.Meta, &v.meta) {
		v.meta = nil
	}
	_ = jsonv2.Unmarshal(m.Name, &v.name, readOptions)
	_ = jsonv2.Unmarshal(m.URI, &v.uri, readOptions)
	return v
}

// readObject decodes msg, one JSON object, into v and reports whether msg
// is one. It reads with encoding/json/v2 (go-json-experiment/json, which
// Go 1.27's standard library is): a struct's fields by their exact names,
// the last member of a name counting, invalid UTF-8 in a string replaced
// as encoding/json replaces it, no deeper than 10,000 levels, in half the
// time of encoding/json into a map (BenchmarkReadEnvelope), and reading
// every message as that did (FuzzReadEnvelope).
func readObject(msg []byte, v any) bool {
	msg = bytes.TrimLeft(msg, " \t\r\n")
	if len(msg) == 0 || msg[0] != '{' {
		return false
	}
	return jsonv2.Unmarshal(msg, v, readOptions) == nil
}

var readOptions = jsonv2.JoinOptions(jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))

// rawOf is a member read by readObject, nil when it was absent.
func rawOf(v jsontext.Value) json.RawMessage {
	if len(v) == 0 {
		return nil
	}
	return json.RawMessage(v)
}

// version is the protocol version in the params' _meta envelope.
func (v paramsView) version() (string, bool) {
	raw, ok := v.meta[metaProtocolVersion]
	var version string
	if !ok || json.Unmarshal(raw, &version) != nil {
		return "", false
	}
	return version, true
}

// progressToken is the progress token a request's _meta sets, as a map
// key; "" when none.
func (e envelope) progressToken() string {
	return string(bytes.TrimSpace(e.view.meta["progressToken"]))
}

// errorMessage is a JSON-RPC error response to id.
func errorMessage(id json.RawMessage, code int64, message string) []byte {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": message}})
	return b
}

// answers reports whether e is the response to the request of id.
func (e envelope) answers(id json.RawMessage) bool {
	return e.Method == "" && len(e.ID) > 0 && bytes.Equal(bytes.TrimSpace(e.ID), bytes.TrimSpace(id))
}

// isCall reports whether e is a request (it expects a response).
func (e envelope) isCall() bool { return e.Method != "" && len(e.ID) > 0 && string(e.ID) != "null" }

// relayBody is an upstream answer on its way to the client, one message
// at a time: a message over the bound is read away and, on a POST's
// answer, replaced by the bound's error for the call, which ends the
// answer (on a GET's stream it is dropped); the response to the call is
// rewritten by rewrite, when there is one.
type relayBody struct {
	src     io.Closer
	events  *eventReader // nil for a JSON answer
	json    io.Reader
	id      json.RawMessage // the call the answer is for; nil on a GET
	limit   int64
	rewrite func([]byte) []byte
	out     []byte
	done    bool
}

func (b *relayBody) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		if b.done {
			return 0, io.EOF
		}
		if err := b.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *relayBody) next() error {
	if b.events == nil {
		b.done = true
		msg, err := io.ReadAll(io.LimitReader(b.json, b.limit+1))
		if err != nil {
			return err
		}
		if int64(len(msg)) > b.limit {
			_, _ = io.Copy(io.Discard, b.json) // the rest, away
			b.out = tooLargeMessage(b.id, b.limit)
			return nil
		}
		b.out = b.rewritten(msg)
		return nil
	}
	ev, err := b.events.next()
	switch {
	case errors.Is(err, io.EOF):
		b.done = true
	case err != nil:
		return err
	case ev.over && b.id != nil:
		b.out, b.done = eventBytes(nil, tooLargeMessage(b.id, b.limit)), true
	case ev.over:
		// A message of the listening stream over the bound: dropped.
	case b.rewrite != nil && ev.data != nil:
		if r := b.rewritten(ev.data); !bytes.Equal(r, ev.data) {
			b.out = eventBytes(ev.fields, r)
			return nil
		}
		b.out = ev.raw
	default:
		b.out = ev.raw
	}
	return nil
}

// rewritten is msg, rewritten when it is the response to the call.
func (b *relayBody) rewritten(msg []byte) []byte {
	if b.rewrite == nil {
		return msg
	}
	if e, ok := readEnvelope(msg); ok && e.answers(b.id) && e.Result != nil {
		return b.rewrite(msg)
	}
	return msg
}

func (b *relayBody) Close() error { return b.src.Close() }
