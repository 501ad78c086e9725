package fingerprint_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/idemledger/idemledger/interceptors/fingerprint"
)

// TestPointer: RFC 6901's examples (section 5), and what has no value.
func TestPointer(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"foo":["bar","baz"],"":0,"a/b":1,"c%d":2,"e^f":3,"g|h":4,"i\\j":5,"k\"l":6," ":7,"m~n":8}`)
	for ptr, want := range map[string]string{
		"": string(doc), "/foo": `["bar","baz"]`, "/foo/0": `"bar"`, "/": "0", "/a~1b": "1", "/c%d": "2", "/e^f": "3",
		"/g|h": "4", "/i\\j": "5", "/k\"l": "6", "/\x20": "7", "/m~0n": "8",
	} {
		got, ok, err := fingerprint.Pointer(doc, ptr)
		if err != nil || !ok || string(got) != want {
			t.Errorf("%q: %s %v %v, want %s", ptr, got, ok, err, want)
		}
	}
	for _, ptr := range []string{"/nope", "/foo/2", "/foo/-", "/foo/01", "/foo/0/x", "/m~0n/x"} {
		if got, ok, err := fingerprint.Pointer(doc, ptr); ok || err != nil {
			t.Errorf("%q: %s %v %v, want no value", ptr, got, ok, err)
		}
	}
	for _, ptr := range []string{"foo", "/a~2b", "/a~"} {
		if err := fingerprint.CheckPointer(ptr); !errors.Is(err, fingerprint.ErrBadPointer) {
			t.Errorf("%q: %v, want ErrBadPointer", ptr, err)
		}
	}
	if _, _, err := fingerprint.Pointer([]byte(`{"a":`), "/a"); !errors.Is(err, fingerprint.ErrNotJSON) {
		t.Errorf("a document that is not JSON: %v", err)
	}
}

// TestJSONParts: the named parts alone make the fingerprint; absent is
// not null; the method counts.
func TestJSONParts(t *testing.T) {
	t.Parallel()
	ptrs := []string{"/amount", "/currency"}
	fp := func(method, v string) string {
		t.Helper()
		s, err := fingerprint.JSONParts(method, []byte(v), ptrs)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a := fp("m", `{"amount":1,"currency":"EUR","note":"x"}`)
	if b := fp("m", `{"note":"y","currency":"EUR","amount":1.0}`); b != a {
		t.Errorf("a change outside the parts changed the print: %s, %s", a, b)
	}
	if b := fp("m", `{"amount":2,"currency":"EUR"}`); b == a {
		t.Error("a change in a part did not change the print")
	}
	if fp("m", `{"amount":1}`) == fp("m", `{"amount":1,"currency":null}`) {
		t.Error("an absent part printed as null")
	}
	if fp("n", `{"amount":1,"currency":"EUR"}`) == a {
		t.Error("the method does not count")
	}
}

// FuzzPointer: any document and pointer give a value, none or an error,
// never a panic; a value found is JSON.
func FuzzPointer(f *testing.F) {
	f.Add(`{"a":{"b":[1,{"c":"d"}]}}`, "/a/b/1/c")
	f.Add(`{"a/b":1,"m~n":2}`, "/a~1b")
	f.Add(`[1,2]`, "/01")
	f.Add(`"s"`, "")
	f.Fuzz(func(t *testing.T, doc, ptr string) {
		v, ok, err := fingerprint.Pointer([]byte(doc), ptr)
		if err != nil {
			if !errors.Is(err, fingerprint.ErrBadPointer) && !errors.Is(err, fingerprint.ErrNotJSON) {
				t.Fatalf("%q %q: %v", doc, ptr, err)
			}
			return
		}
		if ok && !json.Valid(v) {
			t.Fatalf("%q %q: %q is not JSON", doc, ptr, v)
		}
	})
}
