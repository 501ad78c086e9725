package main

import (
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestHandlerTransport: an answer streams as the handler writes it; the
// client closing the body ends the handler's context; a handler that
// panics cuts its answer off (before its head: a 500), as net/http's
// server does, and the process goes on.
func TestHandlerTransport(t *testing.T) {
	wrote, left := make(chan struct{}), make(chan struct{})
	client := &http.Client{Transport: newHandlerTransport(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			_, _ = io.WriteString(w, "first")
			close(wrote)
			<-r.Context().Done()
			close(left)
		case "/abort":
			_, _ = io.WriteString(w, "part")
			panic(http.ErrAbortHandler)
		case "/panic":
			panic("a bug")
		}
	}))}

	res, err := client.Get("http://in-process/stream")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(res.Body, buf); err != nil || string(buf) != "first" {
		t.Fatalf("the first write: %q, %v", buf, err)
	}
	<-wrote
	_ = res.Body.Close()
	<-left // the handler saw its client leave

	res, err = client.Get("http://in-process/abort")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(body) != "part" || err == nil || !strings.Contains(err.Error(), "abort Handler") {
		t.Fatalf("an answer the handler aborted: %d %q, %v; want the part written, then an error", res.StatusCode, body, err)
	}
	res, err = client.Get("http://in-process/panic")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(res.Body); res.StatusCode != http.StatusInternalServerError || err == nil || !strings.Contains(err.Error(), "a bug") {
		t.Fatalf("a handler that panicked: %d, %v; want a 500 cut off", res.StatusCode, err)
	}
}

// TestEnvelopeOfTheBytesItWasReadFrom: an envelope carried across an
// in-process hop is taken for the bytes it was read from alone; a body
// rewritten on the way is read again.
func TestEnvelopeOfTheBytesItWasReadFrom(t *testing.T) {
	msg := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a"}}`)
	e, _ := readEnvelope(msg)
	ctx := withEnvelope(t.Context(), msg, e)
	if got, ok := envelopeOf(ctx, []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"b"}}`)); !ok || got.view.name != "b" {
		t.Fatalf("a rewritten body: the tool %q (%v); want b", got.view.name, ok)
	}
	if _, ok := envelopeOf(ctx, []byte(`[]`)); ok {
		t.Fatal("a batch read as the carried envelope")
	}
	if got, ok := envelopeOf(ctx, append([]byte(nil), msg...)); !ok || got.view.name != "a" {
		t.Fatalf("the same bytes: the tool %q (%v); want a", got.view.name, ok)
	}
}

// TestCallCarriesItsRequestsEnvelope: the envelope a guarded call's
// request carries to the stdio bridge is the one the bridge would read
// from the request's bytes, whatever the params hold.
func TestCallCarriesItsRequestsEnvelope(t *testing.T) {
	for _, params := range []string{
		`{"name":"create_invoice","arguments":{"amount_cents":1},"_meta":{"progressToken":"p","io.idemledger/claim":{"token":"7"}}}`,
		`{"name":"a","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"},"arguments":{"level":3e0,"who":null}}`,
		` {"name":"spaced" , "arguments" : {} } `,
		`{}`,
		`{"name":"a","name":"b"}`,
	} {
		for _, id := range []string{`1`, `"idemproxy-9"`} {
			body := request(json.RawMessage(id), json.RawMessage(params))
			want, ok := readEnvelope(body)
			if !ok {
				t.Fatalf("%s: not read", body)
			}
			got, ok := envelopeOf(withCall(t.Context(), body, json.RawMessage(id), json.RawMessage(params)), body)
			if !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("%s: carried %+v, read %+v", body, got, want)
			}
		}
	}
}

// BenchmarkHandlerTransport: a request and its answer through the
// in-process transport, whose handler runs as deep as a guarded call's
// does (the front, the guard, the ledger's client, gRPC and protobuf:
// about 16 KiB of stack).
func BenchmarkHandlerTransport(b *testing.B) {
	t := newHandlerTransport(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strconv.Itoa(deep(64)))
	}))
	defer t.Close()
	client := &http.Client{Transport: t}
	for b.Loop() {
		res, err := client.Get("http://in-process/")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, res.Body); err != nil {
			b.Fatal(err)
		}
		_ = res.Body.Close()
	}
}

// deep goes n frames down, each holding 256 bytes of stack, and returns
// the sum of 0 to n.
//
//go:noinline
func deep(n int) int {
	var frame [32]int
	frame[n%len(frame)] = n
	if n == 0 {
		return 0
	}
	return frame[n%len(frame)] + deep(n-1)
}
