package mcpguard

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/interceptors/guard"
)

// FuzzClaimInMeta: the claim written into a call's params leaves every
// other member as it was, whatever the params' names and values, and the
// result is JSON that a server reads the claim from.
func FuzzClaimInMeta(f *testing.F) {
	for _, seed := range []string{
		`{"name":"create_invoice","arguments":{"customer":"c"}}`,
		`{"name":"t","_meta":{"io.idemledger/idempotency-key":"k","progressToken":7},"arguments":{"a":[1,2.50,{"b":null}]}}`,
		`{"name":"t","_meta":null}`,
		`{"n\u00e4me":"\u2028","\"quoted\"":"<&>","_meta":{"io.idemledger/claim":{"token":1}}}`,
		"{ \"name\" : \"spaced\" , \"arguments\" : { \"x\" : [ 1 , 2 ] } }",
		`{"name":"t","_meta":[]}`,
		"{\"name\":\"t\",\"_meta\":{ \t}}",
		"{\"name\":\"t\",\"_meta\":{\n\"a\":1,\"a\":2 }}",
		`{"name":"t","_meta":{"io.idemledger\/claim":{"token":9},"io.idemledger/claim":{"token":8}}}`,
		`[]`, `null`, `"params"`,
	} {
		f.Add(seed, uint64(3), uint32(2))
	}
	f.Fuzz(func(t *testing.T, params string, token uint64, attempt uint32) {
		// A claim's token and attempt count from 1; a server reads them as
		// JSON numbers, exact to 2^53.
		token, attempt = token%(1<<53)+1, max(attempt, 1)
		var before map[string]any
		if json.Unmarshal([]byte(params), &before) != nil || before == nil {
			t.Skip() // not an object: withClaimJSON returns it as it came
		}
		p, _, members, err := readCallParams(json.RawMessage(params))
		if err != nil {
			t.Skip() // ServeJSON answers bad params itself: nothing runs
		}
		out := withClaimJSON(json.RawMessage(params), members, p.Meta, guard.Claim{Token: token, Attempt: attempt})
		var after map[string]any
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("withClaimJSON(%s) = %s, not JSON: %v", params, out, err)
		}
		meta, _ := after["_meta"].(map[string]any)
		gotToken, gotAttempt, ok := ClaimFromMeta(meta)
		if !ok || gotToken != token || gotAttempt != attempt {
			t.Fatalf("the claim read from %s: %d, %d, %v; want %d, %d", out, gotToken, gotAttempt, ok, token, attempt)
		}
		delete(meta, ClaimMeta)
		if m, _ := before["_meta"].(map[string]any); m != nil {
			delete(m, ClaimMeta)
		} else {
			before["_meta"] = map[string]any{}
		}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("withClaimJSON changed more than the claim:\n%s\n%s", params, out)
		}
	})
}

// FuzzAppendName: a member's name is written as json.Marshal writes it.
func FuzzAppendName(f *testing.F) {
	for _, seed := range []string{"", "name", "io.idemledger/claim", "a\"b", `a\b`, "<&>", "tab\t", "\x7f", "\u2028", "ä", "\xff", "\xed\xa0\x80", "~ !#$%'()*+,-./:;=?@[]^_`{|}"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want, err := json.Marshal(name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := appendName([]byte("x"), name)
		if err != nil || string(got) != "x"+string(want) {
			t.Fatalf("appendName(%q) = %s, %v; want x%s", name, got, err, want)
		}
	})
}

// TestReadCallParamsReadsEveryMember: every member of the SDK's
// CallToolParamsRaw is read, so a field the SDK adds is not left unread.
func TestReadCallParamsReadsEveryMember(t *testing.T) {
	t.Parallel()
	var p mcp.CallToolParamsRaw
	var key any
	read := map[string]bool{}
	for _, m := range callParamsMembers(&p, &key) {
		read[m.name] = true
	}
	for f := range reflect.TypeFor[mcp.CallToolParamsRaw]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !read[name] {
			t.Errorf("readCallParams does not read the member %q (%s)", name, f.Name)
		}
	}
}

// BenchmarkClaimedParams: what ServeJSON does with a guarded call's params
// as JSON: read them, and write the claim into their _meta.
func BenchmarkClaimedParams(b *testing.B) {
	params := json.RawMessage(`{"name":"create_invoice","arguments":{"customer":"cus_123","amount":1200,"currency":"eur","lines":[{"sku":"a","qty":1},{"sku":"b","qty":2}]},` +
		`"_meta":{"io.idemledger/idempotency-key":"0b6f3a52-3f8e-4a7e-9d55-2f0c8f0e6c11","progressToken":7,` +
		`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}`)
	claim := guard.Claim{Token: 1 << 40, Attempt: 1}
	b.ReportAllocs()
	for b.Loop() {
		p, _, members, err := readCallParams(params)
		if err != nil {
			b.Fatal(err)
		}
		_ = withClaimJSON(params, members, p.Meta, claim)
	}
}
