package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

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
