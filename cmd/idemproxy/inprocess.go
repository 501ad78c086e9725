package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/idemledger/idemledger/internal/workers"
)

// handlerTransport is an http.RoundTripper that serves each request with a
// handler of this process: no connection, no listener, and neither the
// request nor its answer encoded. The proxy reaches its stdio bridge this
// way, and over stdio its own endpoint: a hop between two parts of one
// process costs what the handler costs.
//
// The handler sees what a server would give it: the request's context
// ends when the caller closes the answer's body (a client that left), and
// the answer streams as the handler writes it, each Write handed to the
// reader before it returns.
//
// Each request's handler runs on a worker (internal/workers) rather than
// a new goroutine: the front's handler of a guarded call runs deep (the
// guard, the ledger's client, gRPC, protobuf), and a new goroutine's
// stack grew two or three times on the way, each growth a copy of it.
type handlerTransport struct {
	h       http.Handler
	workers *workers.Pool
}

// newHandlerTransport serves requests with h; Close ends its idle workers.
func newHandlerTransport(h http.Handler) handlerTransport {
	return handlerTransport{h: h, workers: &workers.Pool{}}
}

// Close ends the transport's idle workers; a handler still running ends
// as it does, and its worker with it.
func (t handlerTransport) Close() { t.workers.Close() }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	in := req.Clone(ctx)
	in.RequestURI = req.URL.RequestURI()
	in.Host = cmp.Or(req.Host, req.URL.Host)
	in.RemoteAddr = "in-process"
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, head: make(chan struct{})}
	t.workers.Go(func() {
		defer func() {
			// A handler that panics (httputil.ReverseProxy does, with
			// http.ErrAbortHandler, when its upstream breaks off) cuts its
			// answer off, as net/http's server does, and ends nothing else.
			if p := recover(); p != nil {
				w.WriteHeader(http.StatusInternalServerError) // when the head was not written
				_ = pw.CloseWithError(fmt.Errorf("the handler stopped: %v", p))
			}
			w.WriteHeader(http.StatusOK) // when the handler wrote nothing
			_ = pw.Close()
			_ = in.Body.Close()
		}()
		t.h.ServeHTTP(w, in)
	})
	select {
	case <-w.head:
	case <-ctx.Done():
		cancel()
		_ = pr.Close()
		return nil, ctx.Err()
	}
	return &http.Response{
		Status: strconv.Itoa(w.status) + " " + http.StatusText(w.status), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: &handlerBody{ReadCloser: pr, cancel: cancel}, ContentLength: -1, Request: req,
	}, nil
}

// handlerBody is an answer's body: closing it is the client leaving.
type handlerBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *handlerBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// pipeResponse is the handler's ResponseWriter: the head once written,
// the body through a pipe.
type pipeResponse struct {
	header http.Header
	body   *io.PipeWriter

	once   sync.Once
	head   chan struct{} // closed once the head is written
	status int
	sent   http.Header // the header as it was when the head was written
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(status int) {
	if status < 200 {
		return // informational: not a transport's concern here
	}
	w.once.Do(func() {
		w.status, w.sent = status, w.header.Clone()
		close(w.head)
	})
}

func (w *pipeResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush does nothing: each Write reaches the reader before it returns.
func (w *pipeResponse) Flush() {}

// A message that crosses an in-process hop is read once: the side that
// read it puts its envelope on the request's context, with the bytes it
// was read from (withEnvelope), and the handler takes it when the body it
// reads is those bytes (envelopeOf). A guarded call's request, which the
// front writes around the params the guard gave it, carries the envelope
// of those params (withCall). A message that came over a connection is
// read where it arrives.
type envelopeKey struct{}

type readMessage struct {
	msg      []byte
	envelope func() envelope // msg's, made when a handler takes it
}

// withEnvelope is ctx carrying e, the envelope read from msg.
func withEnvelope(ctx context.Context, msg []byte, e envelope) context.Context {
	return context.WithValue(ctx, envelopeKey{}, readMessage{msg: msg, envelope: func() envelope { return e }})
}

// withCall is ctx carrying the envelope of request(id, params), made from
// id and params, not read from the request: only the params are read, and
// only when the handler is in process.
func withCall(ctx context.Context, msg []byte, id, params json.RawMessage) context.Context {
	return context.WithValue(ctx, envelopeKey{}, readMessage{msg: msg, envelope: func() envelope {
		return envelope{ID: id, Method: "tools/call", Params: bytes.TrimSpace(params)}.viewed()
	}})
}

// envelopeOf is msg's envelope: the one ctx carries for these bytes, or
// else read from them (ok is false when msg is not a JSON object).
func envelopeOf(ctx context.Context, msg []byte) (e envelope, ok bool) {
	if m, found := ctx.Value(envelopeKey{}).(readMessage); found && bytes.Equal(m.msg, msg) {
		return m.envelope(), true
	}
	return readEnvelope(msg)
}
