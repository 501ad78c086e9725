package main

import (
	"encoding/json"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestToolsAreListedByTheirExactNames: the bridge and the stdio adapter
// take a tools/list result's bindings as the SDKs read it, by exact names:
// a "NAME" or an "INPUTSCHEMA" beside a tool's own names no other tool and
// binds nothing.
func TestToolsAreListedByTheirExactNames(t *testing.T) {
	t.Parallel()
	const result = `{"tools":[{"name":"a","NAME":"b","inputSchema":{"properties":{"r":{"x-mcp-header":"R"}}},` +
		`"INPUTSCHEMA":{"properties":{"s":{"x-mcp-header":"S"}}}}],"nextCursor":"n","NEXTCURSOR":"N"}`
	want := map[string][]paramHeader{"a": {{path: []string{"r"}, name: "R"}}}
	b := &bridge{bindings: map[string][]paramHeader{}}
	if next := b.learn(json.RawMessage(result)); next != "n" || !reflect.DeepEqual(b.bindings, want) {
		t.Errorf("the bridge learned %v, next %q; want %v, next \"n\"", b.bindings, next, want)
	}
	a := &stdioAdapter{bindings: map[string][]paramHeader{}}
	if next := a.learn([]byte(`{"jsonrpc":"2.0","id":1,"result":` + result + `,"RESULT":{"tools":[]}}`)); next != "n" || !reflect.DeepEqual(a.bindings, want) {
		t.Errorf("the adapter learned %v, next %q; want %v, next \"n\"", a.bindings, next, want)
	}
}

// TestRoutesAndRevisionsAreReadByTheirExactNames: what the proxy takes
// from the upstream's messages to route them and to choose a revision,
// the client's initialize params it sends a new child again, and its
// metrics' label, it reads as the SDKs do, by exact names: a member in
// another letter case beside the real one (last, which encoding/json would
// have taken) changes nothing.
func TestRoutesAndRevisionsAreReadByTheirExactNames(t *testing.T) {
	t.Parallel()
	if got := progressTokenOf(json.RawMessage(`{"progressToken": "a" ,"PROGRESSTOKEN":"b"}`)); got != `"a"` {
		t.Errorf("progressTokenOf = %s, want \"a\"", got)
	}
	if got := progressTokenOf(json.RawMessage(`{"PROGRESSTOKEN":"b"}`)); got != "" {
		t.Errorf("progressTokenOf without progressToken = %s, want none", got)
	}
	sub := `{"_meta":{"` + metaSubscriptionID + `":"a"},"_META":{"` + metaSubscriptionID + `":"b"}}`
	if got := subscriptionOf(json.RawMessage(sub)); string(got) != `"a"` {
		t.Errorf("subscriptionOf = %s, want \"a\"", got)
	}
	if got := supportedVersions(json.RawMessage(`{"supportedVersions":["2026-07-28"],"SUPPORTEDVERSIONS":["1999-01-01"]}`)); !slices.Equal(got, []string{"2026-07-28"}) {
		t.Errorf("supportedVersions = %v, want [2026-07-28]", got)
	}
	if got := supportedVersions(json.RawMessage(`{"SUPPORTEDVERSIONS":["2026-07-28"]}`)); got != nil {
		t.Errorf("supportedVersions of a result without them = %v, want none", got)
	}
	a := &stdioAdapter{out: io.Discard}
	a.answer(envelope{Method: "initialize"}, []byte(`{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","PROTOCOLVERSION":"2026-07-28"}}`))
	if a.version != "2025-06-18" {
		t.Errorf("the adapter took revision %q from initialize, want 2025-06-18", a.version)
	}
	params, err := initializeParams([]byte(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"},"PARAMS":{"protocolVersion":"1999-01-01"}}`))
	if err != nil || params["protocolVersion"] != "2025-06-18" {
		t.Errorf("a child initialized again with %v, %v; want the client's params", params, err)
	}
	guarded := `{"content":[],"_meta":{"io.idemledger/replayed":true},"_META":{"io.idemledger/error":{"code":"CONFLICT"}}}`
	if got := result(json.RawMessage(guarded), nil); got != "replayed" {
		t.Errorf("a replay's label = %q, want replayed", got)
	}
}

// TestBindingsBesideABooleanSchema: a property whose schema is true or
// false (JSON Schema's boolean schemas; the Go SDK writes an empty
// property schema, an any field's, as true) binds nothing, and its
// siblings keep their bindings: the stdio adapter mirrors their headers,
// and the bridge checks them.
func TestBindingsBesideABooleanSchema(t *testing.T) {
	t.Parallel()
	got := paramHeaders([]byte(`{"type":"object","properties":{"note":true,"never":false,` +
		`"region":{"type":"string","x-mcp-header":"Region"},"address":{"type":"object","properties":{"any":true,"city":{"type":"string","x-mcp-header":"City"}}}}}`))
	slices.SortFunc(got, func(a, b paramHeader) int { return strings.Compare(a.name, b.name) })
	want := []paramHeader{{path: []string{"address", "city"}, name: "City"}, {path: []string{"region"}, name: "Region"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("paramHeaders = %v, want %v", got, want)
	}
}
