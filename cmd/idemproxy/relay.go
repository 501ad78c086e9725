package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
	return errorMessage(id, codeTooLarge, fmt.Sprintf("the upstream's answer is larger than the %d bytes idemproxy relays", limit))
}

// tooLargeResult is the tool's answer, as JSON, for a call (of params)
// whose upstream result was over the bound: the call ran, so the answer
// is permanent and stored, and says not to retry.
func tooLargeResult(limit int64, params json.RawMessage) (json.RawMessage, error) {
	le := &errcode.Error{Code: errcode.OutcomeTooLarge, Metadata: map[string]string{errcode.MetaApplied: "true"},
		Message: fmt.Sprintf("the tool ran, but its result is larger than the %d bytes idemproxy relays (max_result_bytes), so it was neither sent nor kept: do not retry this intent", limit)}
	info := mcpguard.ErrorInfo{Code: le.Code.String()}
	res := map[string]any{"isError": true, "content": []any{map[string]any{"type": "text", "text": mcpguard.Advice(le)}},
		"_meta": map[string]any{mcpguard.ErrorMeta: info}, "structuredContent": map[string]any{"error": info}}
	if isModern(params) {
		res["resultType"] = "complete"
	}
	return json.Marshal(res)
}

// isModern reports whether a request's params carry the per-request
// envelope of 2026-07-28 and later.
func isModern(params json.RawMessage) bool {
	_, ok := readParams(params).version()
	return ok
}

// boundedLines bounds the messages of a stdio upstream, one JSON message
// a line: a line over the limit is read away, and replaced by the bound's
// error for the call whose id it names, wherever in the line the id comes
// (the Go SDK writes "id" before "result", the TypeScript SDK's v2 after
// it). A line over the limit that names no id is dropped.
type boundedLines struct {
	in    *bufio.Reader
	limit int64
	out   []byte
	line  []byte
	over  *idFinder // while a line over the limit is read away
}

func (b *boundedLines) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		chunk, err := b.in.ReadSlice('\n')
		switch {
		case b.over != nil:
			b.over.write(chunk)
		case int64(len(b.line)+len(chunk)) > b.limit:
			b.over = &idFinder{}
			b.over.write(b.line)
			b.over.write(chunk)
			b.line = nil
		default:
			b.line = append(b.line, chunk...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if b.over != nil && (err == nil || errors.Is(err, io.EOF)) {
			if id := b.over.id(); id != nil {
				b.out = append(tooLargeMessage(id, b.limit), '\n')
			}
			b.over = nil
			if err != nil {
				return 0, err
			}
			continue
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

// idFinder reads a JSON object a chunk at a time and keeps only what it
// needs to find the object's "id" member: the names of its members, and
// the id's value (a string or a number, so short).
type idFinder struct {
	depth     int
	inString  bool
	escaped   bool
	expectKey bool   // at depth 1, before a member's name
	readKey   bool   // reading a member's name
	key       []byte // the member name being read, or the latest one
	inValue   bool   // reading the value of the id member
	value     []byte
	found     []byte
}

// maxIDBytes bounds the id's value and a member's name the finder keeps.
const maxIDBytes = 1 << 10

func (f *idFinder) write(chunk []byte) {
	for _, c := range chunk {
		f.step(c)
	}
}

func (f *idFinder) step(c byte) {
	if f.inValue && f.depth == 1 && (f.inString || (c != ',' && c != '}')) && len(f.value) < maxIDBytes {
		f.value = append(f.value, c)
	}
	if f.inString {
		switch {
		case f.escaped:
			f.escaped = false
		case c == '\\':
			f.escaped = true
		case c == '"':
			f.inString = false
			f.readKey = false
		}
		if f.readKey && len(f.key) < maxIDBytes {
			f.key = append(f.key, c)
		}
		return
	}
	switch c {
	case '"':
		f.inString = true
		if f.depth == 1 && f.expectKey {
			f.readKey, f.key = true, f.key[:0]
		}
	case '{', '[':
		f.depth++
		if f.depth == 1 {
			f.expectKey = true
		}
	case '}', ']':
		if f.depth == 1 {
			f.endMember()
		}
		f.depth--
	case ':':
		if f.depth == 1 {
			f.expectKey = false
			f.inValue = string(f.key) == "id"
			f.value = f.value[:0]
		}
	case ',':
		if f.depth == 1 {
			f.endMember()
			f.expectKey = true
		}
	}
}

// endMember ends a member of the object at depth 1.
func (f *idFinder) endMember() {
	if f.inValue {
		f.found = bytes.TrimSpace(f.value)
	}
	f.inValue = false
}

// id is the object's "id" member, when it had one.
func (f *idFinder) id() json.RawMessage {
	if len(f.found) == 0 || !json.Valid(f.found) {
		return nil
	}
	return json.RawMessage(f.found)
}
