package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// The relay bound of the MCP mode: the proxy holds at most maxResultBytes
// of one upstream message in memory. A message past it (a tool's result,
// most often) is not relayed: the proxy reads the rest of it away and
// answers the call with a JSON-RPC error of code codeTooLarge in its
// place, which forward turns into the tool's typed error. Nothing larger
// than the bound is ever buffered, whatever the upstream sends.

// defaultMaxResultBytes is the bound when the file sets none.
const defaultMaxResultBytes = 16 << 20

// codeTooLarge is the JSON-RPC error the bound puts in place of a message
// over it (a server error code of the implementation-defined range).
const codeTooLarge = -32099

// tooLargeMessage is the JSON-RPC response, for the call id, that takes
// the place of a message over limit bytes.
func tooLargeMessage(id json.RawMessage, limit int64) []byte {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{
		"code": codeTooLarge, "message": fmt.Sprintf("the upstream's answer is larger than the %d bytes idemproxy relays", limit),
	}})
	return b
}

// tooLargeResult is the tool's answer for a call whose upstream result was
// over the bound: the call ran, so the answer is permanent and stored, and
// says not to retry.
func tooLargeResult(limit int64) *mcp.CallToolResult {
	le := &errcode.Error{Code: errcode.OutcomeTooLarge, Metadata: map[string]string{"applied": "true"},
		Message: fmt.Sprintf("the tool ran, but its result is larger than the %d bytes idemproxy relays (max_result_bytes), so it was neither sent nor kept: do not retry this intent", limit)}
	info := mcpguard.ErrorInfo{Code: le.Code.String()}
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: mcpguard.Advice(le)}},
		Meta: mcp.Meta{mcpguard.ErrorMeta: info}, StructuredContent: map[string]any{"error": info}}
}

// isTooLarge reports whether err is the bound's error.
func isTooLarge(err error) bool {
	var w *jsonrpc.Error
	return errors.As(err, &w) && w.Code == codeTooLarge
}

// boundedTransport bounds the messages of the Streamable HTTP upstream:
// the response to each POST, a JSON message or a stream of server-sent
// events, each message at most limit bytes.
type boundedTransport struct {
	base  http.RoundTripper
	limit int64
}

func (t *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var id json.RawMessage
	if req.Method == http.MethodPost && req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			var msg struct {
				ID json.RawMessage `json:"id"`
			}
			if json.NewDecoder(body).Decode(&msg) == nil {
				id = msg.ID
			}
			_ = body.Close()
		}
	}
	res, err := t.base.RoundTrip(req)
	if err != nil || id == nil || res.StatusCode != http.StatusOK {
		return res, err
	}
	ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		b, err := io.ReadAll(io.LimitReader(res.Body, t.limit+1))
		if err == nil && int64(len(b)) > t.limit {
			_, err = io.Copy(io.Discard, res.Body) // the rest, away
			b = tooLargeMessage(id, t.limit)
		}
		_ = res.Body.Close()
		if err != nil {
			return nil, err
		}
		res.Body, res.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
		res.Header.Del("Content-Length")
	case "text/event-stream":
		res.Body = &boundedEvents{src: res.Body, in: bufio.NewReader(res.Body), id: id, limit: t.limit}
	}
	return res, nil
}

// boundedEvents relays a stream of server-sent events one whole event at a
// time; an event over the limit is read away and replaced by the bound's
// error for the call, which ends the stream.
type boundedEvents struct {
	src   io.Closer
	in    *bufio.Reader
	id    json.RawMessage
	limit int64
	out   []byte // what is ready to be read
	event []byte // the event being read
	over  bool   // the event is over the limit: reading it away
	mid   bool   // the last read ended inside a line
	done  bool
}

func (e *boundedEvents) Read(p []byte) (int, error) {
	for len(e.out) == 0 {
		if e.done {
			return 0, io.EOF
		}
		if err := e.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, e.out)
	e.out = e.out[n:]
	return n, nil
}

// next reads one line of the stream.
func (e *boundedEvents) next() error {
	line, err := e.in.ReadSlice('\n')
	// A blank line ends an event; a long line comes in several reads.
	end := !e.mid && len(line) > 0 && len(bytes.TrimRight(line, "\r\n")) == 0
	e.mid = errors.Is(err, bufio.ErrBufferFull)
	if e.mid {
		err = nil
	}
	if !e.over {
		e.event = append(e.event, line...)
		if int64(len(e.event)) > e.limit {
			e.over, e.event = true, nil
		}
	}
	switch {
	case end && e.over:
		e.out = append([]byte("event: message\ndata: "), tooLargeMessage(e.id, e.limit)...)
		e.out = append(e.out, "\n\n"...)
		e.done = true
	case end:
		e.out, e.event = e.event, nil
	}
	if errors.Is(err, io.EOF) {
		if !e.over {
			e.out = append(e.out, e.event...)
		}
		e.done = true
		return nil
	}
	return err
}

func (e *boundedEvents) Close() error { return e.src.Close() }

// boundedLines bounds the messages of a stdio upstream, one JSON message
// a line: a line over the limit is read away and replaced by the bound's
// error for the call whose id the line names first (the Go and TypeScript
// SDKs write "id" before "result"). A line over the limit that names no
// id fails the session.
type boundedLines struct {
	in    *bufio.Reader
	limit int64
	out   []byte
	line  []byte
	over  bool
}

func (b *boundedLines) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		chunk, err := b.in.ReadSlice('\n')
		if !b.over {
			b.line = append(b.line, chunk...)
			if int64(len(b.line)) > b.limit {
				b.over = true
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if b.over && (err == nil || errors.Is(err, io.EOF)) {
			id := leadingID(b.line)
			if id == nil {
				return 0, fmt.Errorf("an upstream message larger than the %d bytes idemproxy relays, naming no call", b.limit)
			}
			b.out = append(tooLargeMessage(id, b.limit), '\n')
			b.line, b.over = nil, false
			break
		}
		if err != nil {
			if len(b.line) > 0 {
				b.out, b.line = b.line, nil
				break
			}
			return 0, err
		}
		b.out, b.line = b.line, nil
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

// leadingID is the "id" of the JSON object that prefix starts, when it
// comes before any value too long to read; nil otherwise.
func leadingID(prefix []byte) json.RawMessage {
	dec := json.NewDecoder(bytes.NewReader(prefix))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil
		}
		if k == "id" {
			return v
		}
	}
	return nil
}
