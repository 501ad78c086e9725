package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoregistry"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// The type URLs of the outcomes the adapters store as JSON.
const (
	httpResponseType = "type.idemledger.io/http.Response"
	mcpResultType    = "type.idemledger.io/mcp.CallToolResult"
	jsonrpcErrorType = "type.idemledger.io/jsonrpc.Error"
)

// decoded is an outcome as the record page shows it. Every field is text,
// escaped where it is shown: an outcome is what a caller sent.
type decoded struct {
	None     bool
	Kind     string // what the bytes were read as
	TypeURL  string
	Size     int
	Status   int      // an HTTP response's
	Headers  []string // an HTTP response's, "Name: value"
	Body     string   // JSON indented, text, or hex
	Raw      string   // the stored bytes as the copy button copies them
	ErrorMsg string   // a stored error status's
}

// decode reads an outcome: an HTTP response (its status, headers and
// body), an MCP result or JSON-RPC error (JSON), a protobuf message of a
// type ledgerd knows (protojson), a stored error status, or hex.
func decode(o *ledgerv1.Outcome) decoded {
	if o == nil {
		return decoded{None: true}
	}
	if st := o.GetStatus(); st != nil {
		return decoded{Kind: "error status", ErrorMsg: fmt.Sprintf("code %d: %s", st.GetCode(), st.GetMessage()), Size: len(st.GetMessage())}
	}
	a := o.GetResponse()
	d := decoded{TypeURL: a.GetTypeUrl(), Size: len(a.GetValue())}
	v := a.GetValue()
	switch d.TypeURL {
	case httpResponseType:
		var res struct {
			Status int         `json:"status"`
			Header http.Header `json:"header"`
			Body   []byte      `json:"body"`
		}
		if json.Unmarshal(v, &res) == nil {
			d.Kind, d.Status = "HTTP response", res.Status
			for name, values := range res.Header {
				for _, hv := range values {
					d.Headers = append(d.Headers, name+": "+hv)
				}
			}
			slices.Sort(d.Headers)
			d.Body, d.Raw = text(res.Body), text(res.Body)
			return d
		}
	case mcpResultType, jsonrpcErrorType:
		if b, ok := indent(v); ok {
			d.Kind, d.Body, d.Raw = "MCP result (JSON)", b, string(v)
			if d.TypeURL == jsonrpcErrorType {
				d.Kind = "JSON-RPC error (JSON)"
			}
			return d
		}
	}
	if mt, err := protoregistry.GlobalTypes.FindMessageByURL(d.TypeURL); err == nil {
		if m, err := a.UnmarshalNew(); err == nil {
			if b, err := (protojson.MarshalOptions{Multiline: true}).Marshal(m); err == nil {
				d.Kind, d.Body, d.Raw = string(mt.Descriptor().FullName())+" (protojson)", string(b), string(b)
				return d
			}
		}
	}
	if b, ok := indent(v); ok {
		d.Kind, d.Body, d.Raw = "JSON", b, string(v)
		return d
	}
	d.Kind, d.Body, d.Raw = "bytes (hex)", hex.Dump(v), hex.EncodeToString(v)
	return d
}

// indent is b indented, when b is JSON.
func indent(b []byte) (string, bool) {
	var out bytes.Buffer
	if !json.Valid(b) || json.Indent(&out, b, "", "  ") != nil {
		return "", false
	}
	return out.String(), true
}

// text is a body as text: indented JSON, UTF-8 as it is, hex otherwise.
func text(b []byte) string {
	if s, ok := indent(b); ok {
		return s
	}
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.TrimSpace(hex.Dump(b))
}
