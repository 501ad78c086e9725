package console

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"

	// The well-known types, so that a resolution may name any of them.
	_ "google.golang.org/protobuf/types/known/emptypb"
	_ "google.golang.org/protobuf/types/known/structpb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/errcode"
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

// The kinds of outcome a record's method stores, for "Resolve: applied".
const (
	kindHTTP = "http" // httpguard's: a method "http:POST /v1/invoices"
	kindMCP  = "mcp"  // mcpguard's: a method "mcp:tools/…"
	kindGRPC = "grpc" // the gRPC interceptor's: a method "/pkg.Service/Method"
)

// outcomeKind is the kind of outcome method stores.
func outcomeKind(method string) string {
	switch {
	case strings.HasPrefix(method, "http:"):
		return kindHTTP
	case strings.HasPrefix(method, "mcp:"):
		return kindMCP
	}
	return kindGRPC
}

// appliedOutcome is the outcome an operator enters for a record of
// method, read from the form as its kind asks: an HTTP response (status,
// content type, body), an MCP tool result (its JSON), or a gRPC response
// (protojson of a type ledgerd knows, or the message's bytes in base64 with
// its type URL). What does not decode is refused, typed, and stores
// nothing.
func appliedOutcome(method string, form func(string) string) (*ledgerv1.Outcome, error) {
	var a *anypb.Any
	switch outcomeKind(method) {
	case kindHTTP:
		status, err := strconv.Atoi(strings.TrimSpace(form("status")))
		if err != nil || status < 100 || status > 599 {
			return nil, errcode.Errorf(errcode.ValidationFailed, "the HTTP status %q is not a number from 100 to 599", form("status"))
		}
		res := struct {
			Status int         `json:"status"`
			Header http.Header `json:"header,omitempty"`
			Body   []byte      `json:"body,omitempty"`
		}{Status: status, Body: []byte(form("body"))}
		if ct := strings.TrimSpace(form("content_type")); ct != "" {
			res.Header = http.Header{"Content-Type": {ct}}
		}
		b, err := json.Marshal(res)
		if err != nil {
			return nil, errcode.Wrap(errcode.ValidationFailed, err, "the HTTP response does not encode")
		}
		a = &anypb.Any{TypeUrl: httpResponseType, Value: b}
	case kindMCP:
		v := []byte(strings.TrimSpace(form("result")))
		var res struct {
			Content []struct {
				Type string `json:"type"`
			} `json:"content"`
			IsError *bool `json:"isError"`
		}
		if err := json.Unmarshal(v, &res); err != nil {
			return nil, errcode.Errorf(errcode.ValidationFailed, "the tool result is not JSON: %v", err)
		}
		if res.Content == nil {
			return nil, errcode.Errorf(errcode.ValidationFailed, `the tool result has no "content" array: a CallToolResult such as {"content":[{"type":"text","text":"inv_7"}]}`)
		}
		for i, c := range res.Content {
			if c.Type == "" {
				return nil, errcode.Errorf(errcode.ValidationFailed, "the tool result's content %d has no type", i)
			}
		}
		a = &anypb.Any{TypeUrl: mcpResultType, Value: v}
	default:
		if j := strings.TrimSpace(form("response_json")); j != "" {
			a = &anypb.Any{}
			if err := protojson.Unmarshal([]byte(j), a); err != nil {
				return nil, errcode.Errorf(errcode.ValidationFailed, `the response is not protojson of a type ledgerd knows ({"@type": "type.googleapis.com/…", …}): %v; give its bytes in base64 with its type URL instead`, err)
			}
			break
		}
		url := strings.TrimSpace(form("type_url"))
		if !strings.Contains(url, "/") || strings.HasSuffix(url, "/") {
			return nil, errcode.Errorf(errcode.ValidationFailed, "the response's type URL %q is not one such as type.googleapis.com/billing.v1.Invoice", url)
		}
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(form("value_base64")))
		if err != nil {
			return nil, errcode.Errorf(errcode.ValidationFailed, "the response's bytes are not base64: %v", err)
		}
		a = &anypb.Any{TypeUrl: url, Value: b}
	}
	return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: a}}, nil
}
