package main

import (
	"encoding/json"
	"testing"
)

// TestResultLabel: a guarded call's answer is labelled by its _meta,
// however the JSON spells the names there; an answer that cannot hold them
// is not decoded.
func TestResultLabel(t *testing.T) {
	for res, want := range map[string]string{
		`{"content":[{"type":"text","text":"{\"id\":\"inv_1\"}"}],"structuredContent":{"id":"inv_1"}}`: "ran",
		`{"content":[],"_meta":{"io.idemledger/replayed":true}}`:                                       "replayed",
		`{"content":[],"_meta":{"io.idemledger\/replayed":true}}`:                                      "replayed",
		`{"content":[],"_meta":{"io.idemledger\u002freplayed":true}}`:                                  "replayed",
		`{"isError":true,"_meta":{"io.idemledger/error":{"code":"KEY_REUSED"}}}`:                       "key_reused",
		`{"content":[{"type":"text","text":"io.idemledger/replayed"}]}`:                                "ran",
	} {
		if got := result(json.RawMessage(res), nil); got != want {
			t.Errorf("result(%s) = %q, want %q", res, got, want)
		}
	}
}
