package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// From 2026-07-28 on, Streamable HTTP mirrors parts of a request's body into
// its headers so that what routes on headers sees what the server runs:
// MCP-Protocol-Version (the _meta envelope's version), Mcp-Method, Mcp-Name
// (the tool's or prompt's name, the resource's URI), and an Mcp-Param-*
// header for each argument a tool's input schema marks with x-mcp-header.
// A server that reads the body must refuse a request whose headers and body
// disagree: 400 with the JSON-RPC error HeaderMismatch. An HTTP upstream
// checks its own requests; in front of a stdio upstream, which sees no
// headers, the bridge checks them (checkHeaders).

// The _meta keys and error codes of the 2026-07-28 revision the bridge
// reads and answers.
const (
	metaProtocolVersion    = "io.modelcontextprotocol/protocolVersion"
	metaSubscriptionID     = "io.modelcontextprotocol/subscriptionId"
	metaClientCapabilities = "io.modelcontextprotocol/clientCapabilities"
	metaClientInfo         = "io.modelcontextprotocol/clientInfo"
	modernRevision         = "2026-07-28"
	codeHeaderMismatch     = -32020
	codeMissingCapability  = -32021
	codeUnsupportedVersion = -32022
	codeMethodNotFound     = -32601
)

// The sentinel of a header value carried in base64 (non-ASCII, control
// characters, surrounding blanks, or a value that looks like the sentinel).
const (
	base64Open  = "=?base64?"
	base64Close = "?="
)

// paramHeader binds an argument of a tool, at a path of property names,
// to its header Mcp-Param-<name>.
type paramHeader struct {
	path []string
	name string
}

// paramHeaders are the x-mcp-header bindings of a tool's input schema,
// its members read by their exact names, as the SDKs read them: an
// "X-MCP-HEADER" binds nothing a client mirrors.
func paramHeaders(inputSchema []byte) []paramHeader {
	var root schemaNode
	if !readObject(inputSchema, &root) {
		return nil
	}
	return root.bindings(nil, nil)
}

// toolList is what the proxy reads of a tools/list result, by exact names
// (readObject): each tool's name and input schema, and the next cursor.
type toolList struct {
	Tools []struct {
		Name        string         `json:"name"`
		InputSchema jsontext.Value `json:"inputSchema"`
	} `json:"tools"`
	Next string `json:"nextCursor"`
}

// schemaNode is what a binding reads of a JSON Schema: its properties, and
// its own header name.
type schemaNode struct {
	Header     jsontext.Value `json:"x-mcp-header"`
	Properties jsontext.Value `json:"properties"`
}

// bindings appends the bindings of n's properties, at path, to out. A
// property's schema that is not an object (true, false) binds nothing and
// leaves its siblings' bindings as they are.
func (n schemaNode) bindings(path []string, out []paramHeader) []paramHeader {
	var props map[string]jsontext.Value
	if !readObject(n.Properties, &props) {
		return out
	}
	for name, raw := range props {
		var prop schemaNode
		if !readObject(raw, &prop) {
			continue
		}
		p := slices.Concat(path, []string{name})
		var header string
		if json.Unmarshal(prop.Header, &header) == nil && header != "" {
			out = append(out, paramHeader{path: p, name: header})
		}
		out = prop.bindings(p, out)
	}
	return out
}

// modernMessage reports whether a posted message claims the 2026-07-28
// revision or a later one: by its MCP-Protocol-Version header, or by the
// version in its _meta envelope.
func modernMessage(h http.Header, e envelope) bool {
	if v := h.Get("MCP-Protocol-Version"); v != "" {
		return v >= modernRevision
	}
	_, ok := e.view.version()
	return ok
}

// checkEnvelope reports what the per-request _meta envelope of a request of
// the 2026-07-28 revision lacks, "" when nothing: a request without it
// must not reach a stdio child, which would take it for a client of the
// 2025 revisions falling back after its probe.
func checkEnvelope(e envelope) string {
	meta := e.view.meta
	if meta == nil {
		return "the request is missing the per-request envelope (_meta)"
	}
	if version, _ := e.view.version(); version == "" {
		return "the envelope's " + metaProtocolVersion + " is missing"
	}
	var caps map[string]json.RawMessage
	if json.Unmarshal(meta[metaClientCapabilities], &caps) != nil || caps == nil {
		return "the envelope's " + metaClientCapabilities + " is missing"
	}
	return ""
}

// checkHeaders reports how the standard headers of a request of the
// 2026-07-28 revision (MCP-Protocol-Version, Mcp-Method, Mcp-Name)
// disagree with its body e, "" when they agree.
func checkHeaders(h http.Header, e envelope) string {
	version := strings.TrimSpace(h.Get("MCP-Protocol-Version"))
	if version == "" {
		return "the MCP-Protocol-Version header is missing"
	}
	if body, ok := e.view.version(); ok && body != version {
		return fmt.Sprintf("the MCP-Protocol-Version header says %q, the body's _meta %q", version, body)
	}
	method := strings.TrimSpace(h.Get("Mcp-Method"))
	switch {
	case method == "":
		return fmt.Sprintf("the body names method %s but the Mcp-Method header is missing", e.Method)
	case method != e.Method:
		return fmt.Sprintf("the Mcp-Method header names %q, the body %q", method, e.Method)
	}
	named, ok := bodyName(e)
	if !ok {
		return ""
	}
	header, present := headerValue(h, "Mcp-Name")
	switch {
	case !present:
		return fmt.Sprintf("the body names %q but the Mcp-Name header is missing", named)
	case header != named:
		return fmt.Sprintf("the Mcp-Name header names %q, the body %q", header, named)
	}
	return ""
}

// checkParams reports how the Mcp-Param-* headers of a tools/call e
// disagree with its arguments, "" when they agree. bindings is the
// x-mcp-header bindings of the tool it names.
func checkParams(h http.Header, e envelope, bindings []paramHeader) string {
	if e.Method != "tools/call" || len(bindings) == 0 {
		return ""
	}
	args := e.arguments()
	for _, b := range bindings {
		if why := checkParam(h, b, args); why != "" {
			return why
		}
	}
	return ""
}

// checkParam reports how the header of one x-mcp-header binding disagrees
// with the argument it mirrors, "" when it agrees. As the SDKs' servers
// check it: an argument that is null or absent, or has no header form
// (mirrored), expects no header, and one sent is not read.
func checkParam(h http.Header, b paramHeader, args map[string]json.RawMessage) string {
	arg, given := argument(args, b.path)
	var v any
	if !given || json.Unmarshal(arg, &v) != nil || !mirrored(v) {
		return ""
	}
	name := "Mcp-Param-" + b.name
	header, present := headerValue(h, name)
	switch {
	case !present:
		return fmt.Sprintf("the argument %s is set, but the %s header is missing", strings.Join(b.path, "."), name)
	case header == "\x00":
		return fmt.Sprintf("the %s header is not valid base64", name)
	case !sameValue(header, v):
		return fmt.Sprintf("the %s header says %q, which is not the argument's value", name, header)
	}
	return ""
}

// headerValue is a header's value with its surrounding blanks trimmed and
// its base64 sentinel decoded; "\x00" when the sentinel does not decode.
func headerValue(h http.Header, name string) (string, bool) {
	values := h.Values(name)
	if len(values) == 0 {
		return "", false
	}
	v := strings.TrimSpace(values[0])
	if inner, ok := strings.CutPrefix(v, base64Open); ok {
		if inner, ok = strings.CutSuffix(inner, base64Close); ok {
			b, err := base64.StdEncoding.DecodeString(inner)
			if err != nil {
				return "\x00", true
			}
			return string(b), true
		}
	}
	return v, true
}

// headerText is a header's value for text: as it is when it is printable
// ASCII without surrounding blanks, else in the base64 sentinel.
func headerText(s string) string {
	plain := s == strings.TrimSpace(s) && !strings.HasPrefix(s, base64Open)
	for i := 0; plain && i < len(s); i++ {
		plain = s[i] >= 0x20 && s[i] < 0x7f
	}
	if plain {
		return s
	}
	return base64Open + base64.StdEncoding.EncodeToString([]byte(s)) + base64Close
}

// paramText is the header value of an argument: a string as it is, a
// number in decimal without an exponent (3e0 is 3, which a server compares
// as a number; its JSON spelling it may not), any other value as its JSON.
func paramText(arg json.RawMessage) string {
	var v any
	_ = json.Unmarshal(arg, &v) // not JSON: nil, written as it is
	switch v := v.(type) {
	case string:
		return headerText(v)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return headerText(string(arg))
}

// bodyName is the name a request's Mcp-Name header must carry: a tool's or
// a prompt's name, or a resource's URI.
func bodyName(e envelope) (string, bool) {
	switch e.Method {
	case "tools/call", "prompts/get":
		return e.view.name, true
	case "resources/read":
		return e.view.uri, true
	}
	return "", false
}

// arguments are a tool call's arguments by name; nil when they are not
// an object.
func (e envelope) arguments() map[string]json.RawMessage {
	var args map[string]json.RawMessage
	_ = json.Unmarshal(e.view.arguments, &args)
	return args
}

// argument is the value at path in a call's arguments; absent for JSON null.
func argument(args map[string]json.RawMessage, path []string) (json.RawMessage, bool) {
	cur := args
	for i, key := range path {
		raw, ok := cur[key]
		if !ok || string(raw) == "null" {
			return nil, false
		}
		if i == len(path)-1 {
			return raw, true
		}
		cur = nil
		if json.Unmarshal(raw, &cur) != nil {
			return nil, false
		}
	}
	return nil, false
}

// maxSafeInteger is the largest integer a JSON number holds exactly in
// the SDKs' languages (2^53 − 1).
const maxSafeInteger = 1<<53 - 1

// mirrored reports whether an argument's decoded value v has a header
// form: a string, a boolean, or a number that is not an integer past
// ±maxSafeInteger. A client mirrors no other value, nor does the
// TypeScript SDK's server expect one.
func mirrored(v any) bool {
	switch v := v.(type) {
	case string, bool:
		return true
	case float64:
		return v != math.Trunc(v) || math.Abs(v) <= maxSafeInteger
	}
	return false
}

// decimal is a number as a header spells it to be compared as one.
var decimal = regexp.MustCompile(`^-?[0-9]+(\.[0-9]+)?$`)

// sameValue reports whether a header's (decoded) value mirrors an
// argument's decoded value v: a string as it is, a boolean as true or
// false, a number spelled in decimal and compared as a number (42.0 is 42).
func sameValue(header string, v any) bool {
	switch v := v.(type) {
	case string:
		return header == v
	case bool:
		return header == strconv.FormatBool(v)
	case float64:
		n, err := strconv.ParseFloat(header, 64)
		return err == nil && decimal.MatchString(header) && n == v
	}
	return false
}

// modernStatus is the HTTP status of the answer to a request of the
// 2026-07-28 revision that failed with code: 404 for a method the server
// does not have, 400 for the revision's errors of the request itself.
func modernStatus(code int64) int {
	switch code {
	case codeMethodNotFound:
		return http.StatusNotFound
	case codeHeaderMismatch, codeMissingCapability, codeUnsupportedVersion:
		return http.StatusBadRequest
	}
	return http.StatusOK
}
