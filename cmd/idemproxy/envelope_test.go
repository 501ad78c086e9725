package main

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// readEnvelopeAsMaps reads a message with encoding/json into maps,
// members by their exact names: readEnvelope must read every message as it
// does.
func readEnvelopeAsMaps(msg []byte) (envelope, bool) {
	var members map[string]json.RawMessage
	if json.Unmarshal(msg, &members) != nil || members == nil {
		return envelope{}, false
	}
	e := envelope{ID: members["id"], Params: members["params"], Result: members["result"]}
	_ = json.Unmarshal(members["method"], &e.Method)
	var rpcErr map[string]json.RawMessage
	if json.Unmarshal(members["error"], &rpcErr) == nil && rpcErr != nil {
		e.Error = &rpcError{Data: rpcErr["data"]}
		_ = json.Unmarshal(rpcErr["code"], &e.Error.Code)
		_ = json.Unmarshal(rpcErr["message"], &e.Error.Message)
	}
	if e.Method != "" && len(e.Params) > 0 {
		var params map[string]json.RawMessage
		if json.Unmarshal(e.Params, &params) == nil {
			e.view = paramsView{arguments: params["arguments"], requestID: params["requestId"]}
			_ = json.Unmarshal(params["_meta"], &e.view.meta)
			_ = json.Unmarshal(params["name"], &e.view.name)
			_ = json.Unmarshal(params["uri"], &e.view.uri)
		}
	}
	return e, true
}

// envelopeSeeds are messages whose reading could differ: names in other
// cases and escaped, members twice, nulls, members of other types,
// invalid UTF-8 and lone surrogates, numbers, nesting, whitespace, and
// what is not one object.
var envelopeSeeds = []string{
	`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_invoice","arguments":{"amount_cents":1},"_meta":{"progressToken":"p","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`,
	`{"jsonrpc":"2.0","ID":1,"Method":"tools/call","params":{"NAME":"x","name":"y"}}`,
	`{"id":1,"id":2,"method":"a","method":"tools/call","params":{"name":"a","name":"b","_meta":{"k":1,"k":2}}}`,
	`{"\u0069d":"\u0031","m\u0065thod":"tools\/call","params":{"n\u0061me":"\u0063reate"}}`,
	`{"id":null,"method":null,"params":null,"result":null,"error":null}`,
	`{"id":1,"method":5,"params":[1,2]}`,
	`{"id":1,"method":"x","params":{"_meta":[],"name":7,"uri":{"a":1},"requestId":null,"arguments":"s"}}`,
	`{"id":1,"method":"x","params":{"_meta":null}}`,
	"{\"id\":1,\"method\":\"a\xffb\",\"params\":{\"name\":\"n\xfe\"}}",
	`{"id":"\ud800","method":"tools/call","params":{"name":"\udc00x","_meta":{"\ud800":1}}}`,
	`{"id":1e400,"method":"x","params":{"arguments":{"n":-0.0e-0,"big":123456789012345678901234567890}}}`,
	`{"id":-0,"result":{"content":[{"type":"text","text":"a\"b\\c\/d\b\f\n\r\t\u00e9"}]}}`,
	`{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"bad","data":{"x":[]}}}`,
	`{"jsonrpc":"2.0","id":2,"error":{"CODE":1,"Message":"m"}}`,
	`{"jsonrpc":"2.0","id":2,"error":"not an object"}`,
	`{"jsonrpc":"2.0","id":2,"error":{"code":-32000,"CODE":-32603,"message":"m","MESSAGE":"M","DATA":1}}`,
	`{"jsonrpc":"2.0","id":2,"error":{"code":"x","message":"m","data":null}}`,
	`{"jsonrpc":"2.0","id":2,"error":{"code":1.5,"message":7,"data":[1]}}`,
	`{"jsonrpc":"2.0","id":2,"error":{"code":1e3,"message":"\ud800"}}`,
	`{"jsonrpc":"2.0","id":2,"error":{"code":-0,"code":99999999999999999999}}`,
	`{"jsonrpc":"2.0","id":2,"error":[]}`,
	`{"jsonrpc":"2.0","id":2,"error":{}}`,
	" \t\r\n{ \"id\" : 1 , \"method\" : \"x\" , \"params\" : { \"name\" : \"y\" } } \n",
	`{}`, `{"params":{}}`, `null`, `[]`, `[{"id":1}]`, `"s"`, `1`, ``, ` `, `{`, `{"id":1,}`, `{"id":1} x`,
	`{"id":1}{"id":2}`, `{"id":01}`, `{"id":1,"params":{"a":[1,2,]}}`, `{"id":"\x"}`, "{\"id\":\"\x01\"}", `{"id":tru}`,
	"\ufeff{\"id\":1}",
	`{"id":1,"method":"x","params":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`,
	`{"id":1,"method":"x","params":{"arguments":` + strings.Repeat(`{"a":`, 500) + `1` + strings.Repeat(`}`, 500) + `}}`,
}

// TestReadEnvelopeAsMapsDid: readEnvelope reads each seed as encoding/json
// into maps did.
func TestReadEnvelopeAsMapsDid(t *testing.T) {
	for _, msg := range envelopeSeeds {
		sameEnvelope(t, []byte(msg))
	}
}

// FuzzReadEnvelope: the same for any message (go test -fuzz
// FuzzReadEnvelope ./cmd/idemproxy).
func FuzzReadEnvelope(f *testing.F) {
	for _, msg := range envelopeSeeds {
		f.Add([]byte(msg))
	}
	f.Fuzz(func(t *testing.T, msg []byte) { sameEnvelope(t, msg) })
}

func sameEnvelope(t *testing.T, msg []byte) {
	t.Helper()
	got, ok := readEnvelope(msg)
	want, wantOK := readEnvelopeAsMaps(msg)
	if ok != wantOK || !reflect.DeepEqual(got, want) {
		short := string(msg)
		if len(short) > 200 {
			short = short[:200] + "…"
		}
		t.Errorf("%q:\n read %v %+v\n want %v %+v", short, ok, got, wantOK, want)
	}
}

// BenchmarkReadEnvelope: a guarded call's message read as the proxy reads
// it, and as encoding/json into maps read it, side by side.
func BenchmarkReadEnvelope(b *testing.B) {
	msg := []byte(envelopeSeeds[0])
	for _, c := range []struct {
		name string
		read func([]byte) (envelope, bool)
	}{{"v2", readEnvelope}, {"maps", readEnvelopeAsMaps}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := c.read(msg); !ok {
					b.Fatal("not read")
				}
			}
		})
	}
}
