package main

import (
	"encoding/json"
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
