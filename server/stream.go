package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/streamcall"
	"github.com/idemledger/idemledger/internal/workers"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// The bounds of one Stream's calls in flight. Past MaxStreamCalls calls
// other than Lookups, the server stops reading the stream until one ends,
// and HTTP/2 flow control holds the client back. Lookups count apart: one
// that waits holds no goroutine, and however many wait, the stream's
// other calls go on being read and run. Past MaxStreamLookups Lookups, a
// Lookup is answered RATE_LIMITED at once (retryable, after a second), as
// the ledger answers one past its waiters' bounds.
const (
	MaxStreamCalls   = 1024
	MaxStreamLookups = 16384
)

// streamWorkerIdle ends a stream's worker that has waited this long for
// a call: a burst leaves no goroutines behind on a stream that stays open.
// Until then as many wait as the stream runs calls at once
// (MaxStreamCalls), so that each call of a burst that comes back finds a
// worker whose stack its call grew before.
const streamWorkerIdle = 10 * time.Second

// Stream implements LedgerService.Stream. Each call runs on a goroutine
// of its own while it runs (one of the stream's workers), as its unary
// counterpart (the same authentication, rate limit, validation, metrics
// and typed errors), under the stream's credentials and the call's
// timeout, and is answered with its id.
//
// The stream ends when the client closes its side and every call is
// answered (OK), or when it breaks (the calls in flight are canceled). When
// the server drains (Drain) or the stream is older than
// Config.StreamMaxAge, it sends a drain notice and goes on answering until
// the client closes its side; a client that has not done so after
// DrainGrace gets no new call started, and the stream ends once the calls
// started are answered.
func (s *Server) Stream(stream ledgerv1.LedgerService_StreamServer) error {
	// A call on a stream has no trailers of its own: its retry-after
	// travels in its status details only.
	ctx := grpc.NewContextWithServerTransportStream(stream.Context(), noTrailers{})
	ctx, cancelAll := context.WithCancel(ctx)
	defer cancelAll()
	st := &callStream{s: s, stream: stream, room: make(chan struct{}, 1), inFlight: map[uint64]inFlight{}, workers: &workers.Pool{IdleFor: streamWorkerIdle, MaxIdle: MaxStreamCalls}}
	defer st.workers.Close() // after answered: no call starts any more
	recvErr := st.receive(ctx)
	drain := st.drainSignals()
	defer drain.stop()
	for {
		select {
		case err := <-recvErr:
			if !errors.Is(err, io.EOF) {
				cancelAll() // the stream is broken: nobody hears the answers
			}
			st.answered()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			// The stream ended under us (its client went away) while the
			// reader was held back by a full stream: nobody hears the
			// answers, so end the calls and free the stream now. A client
			// that goes away is a normal end: CANCELED, not UNKNOWN.
			cancelAll()
			st.answered()
			return status.FromContextError(ctx.Err()).Err()
		case <-drain.drain:
			st.sendDrain(drain)
		case <-drain.age:
			st.sendDrain(drain)
		case <-drain.grace:
			// The client did not close its side: start nothing more. The
			// calls it sends from now on get no answer, and its client
			// knows them not run when the stream ends with OK.
			st.answered()
			return nil
		}
	}
}

// callStream is one Stream as Stream serves it: the calls in flight, by
// id, and the answers not yet written (send). Its reader hands each call
// to a worker as it reads it, and each call forgets itself as it is
// answered, so that a call passes through no goroutine but the one it
// runs on.
type callStream struct {
	s      *Server
	stream ledgerv1.LedgerService_StreamServer

	sendMu  sync.Mutex                 // guards queued and writing
	queued  []*ledgerv1.StreamResponse // the answers not yet written
	writing bool                       // a caller of send is writing them

	calls sync.WaitGroup // the calls started and not yet answered
	room  chan struct{}  // a call ended: the reader may go on

	workers *workers.Pool // run the calls (internal/workers)

	mu       sync.Mutex // guards the fields below
	inFlight map[uint64]inFlight
	lookups  int  // of inFlight
	stopped  bool // no call starts any more
}

// inFlight is a call started and not yet answered.
type inFlight struct {
	cancel context.CancelFunc
	lookup bool
}

// forget forgets the answered call id, before its answer is sent: a
// client that has the answer may use the id again at once.
func (st *callStream) forget(id uint64) {
	st.mu.Lock()
	if st.inFlight[id].lookup {
		st.lookups--
	}
	delete(st.inFlight, id)
	st.mu.Unlock()
	select {
	case st.room <- struct{}{}: // the reader may be waiting for room
	default:
	}
}

// replyNow answers at once a call that runs nothing. Once the stream
// stopped it answers nothing: the handler may have returned, and nothing
// may be sent after it.
func (st *callStream) replyNow(res *ledgerv1.StreamResponse) {
	st.mu.Lock()
	if st.stopped {
		st.mu.Unlock()
		return
	}
	st.calls.Add(1)
	st.mu.Unlock()
	st.send(res)
	st.calls.Done()
}

// full reports whether the stream has MaxStreamCalls calls other than
// Lookups in flight.
func (st *callStream) full() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return len(st.inFlight)-st.lookups >= MaxStreamCalls
}

// receive reads the calls and starts each, until the stream ends, and
// then says why on recvErr. Past MaxStreamCalls calls in flight it reads
// nothing until one ends; it stops early when ctx ends.
func (st *callStream) receive(ctx context.Context) (recvErr <-chan error) {
	errs := make(chan error, 1)
	go func() {
		for {
			for st.full() {
				select {
				case <-st.room:
				case <-ctx.Done():
					return
				}
			}
			req, err := st.stream.Recv()
			if err != nil {
				errs <- err
				return
			}
			st.start(ctx, req)
		}
	}()
	return errs
}

// maxBatch bounds the answers' bytes one message carries: an answer
// larger than this goes alone, and a client's limit on what it receives
// (gRPC's 4 MiB by default) is never passed by answers that each pass it.
const maxBatch = 64 << 10

// send writes res, with every answer queued while it does. The first
// caller to find nobody writing writes until the queue is empty, a
// message at a time: the first answer queued, with the others queued
// since the last message in its more (up to maxBatch bytes). A caller
// that finds someone writing leaves its answer to them. Calls that end
// while a message is written, as calls that shared a sync of the store
// do, so cost one write together. Whoever writes is a call not yet
// counted answered, or Stream's own goroutine (the drain notice), so
// Stream does not return before every queued answer is written. A failed
// Send breaks the stream; Recv reports it.
func (st *callStream) send(res *ledgerv1.StreamResponse) {
	st.sendMu.Lock()
	st.queued = append(st.queued, res)
	if st.writing {
		st.sendMu.Unlock()
		return
	}
	st.writing = true
	for len(st.queued) > 0 {
		n := batchLen(st.queued)
		msg := st.queued[0]
		if n > 1 {
			msg.More = slices.Clone(st.queued[1:n])
		}
		st.queued = slices.Delete(st.queued, 0, n)
		st.sendMu.Unlock()
		_ = st.stream.Send(msg)
		st.sendMu.Lock()
	}
	st.writing = false
	st.sendMu.Unlock()
}

// batchLen is how many of the queued answers, from the first, the next
// message carries: as many as fit in maxBatch bytes, and at least one. A
// lone answer, as every answer at one caller, is not sized.
func batchLen(queued []*ledgerv1.StreamResponse) int {
	if len(queued) == 1 {
		return 1
	}
	size := 0
	for n, a := range queued {
		size += proto.Size(a)
		if n > 0 && size > maxBatch {
			return n
		}
	}
	return len(queued)
}

// sendDrain sends the drain notice and starts its grace period.
func (st *callStream) sendDrain(d *drainSignals) {
	st.send(&ledgerv1.StreamResponse{Result: &ledgerv1.StreamResponse_Drain{Drain: &ledgerv1.Drain{}}})
	d.noticeSent()
}

// answered starts no more calls, and waits until every call started is
// answered.
func (st *callStream) answered() {
	st.mu.Lock()
	st.stopped = true
	st.mu.Unlock()
	st.calls.Wait()
}

// start starts one call under ctx, the stream's, or answers at once a
// call the codec let through with bad UTF-8, a bad timeout, a duplicate
// id or a Lookup past MaxStreamLookups; a cancel ends its call and is not
// answered. Once the stream stopped it starts and answers nothing.
func (st *callStream) start(ctx context.Context, req *ledgerv1.StreamRequest) {
	id := req.GetId()
	if req.GetCancel() != nil {
		st.mu.Lock()
		c, ok := st.inFlight[id]
		st.mu.Unlock()
		if ok {
			c.cancel()
		}
		return
	}
	if hasBadUTF8(req) {
		// Codec let it through: answer it typed, as its unary call.
		bad := takeBadUTF8(req)
		if _, err := st.s.principal(ctx); err != nil {
			bad = err
		}
		st.replyNow(streamError(id, bad))
		return
	}
	callCtx, cancel, err := callContext(ctx, req)
	if err != nil {
		st.replyNow(streamError(id, err))
		return
	}
	lookup := req.GetLookup()
	var refused error
	st.mu.Lock()
	switch {
	case st.stopped:
		st.mu.Unlock()
		cancel()
		return
	case st.inFlight[id].cancel != nil:
		refused = errcode.Errorf(errcode.ValidationFailed, "call %d is already in flight on this stream", id)
	case lookup != nil && st.lookups >= MaxStreamLookups:
		refused = tooManyLookups
	default:
		st.inFlight[id] = inFlight{cancel: cancel, lookup: lookup != nil}
		if lookup != nil {
			st.lookups++
		}
	}
	st.calls.Add(1)
	st.mu.Unlock()
	if refused != nil {
		cancel()
		st.send(streamError(id, refused))
		st.calls.Done()
		return
	}
	answer := func(res *ledgerv1.StreamResponse) {
		cancel()
		st.forget(id)
		st.send(res)
		st.calls.Done()
	}
	if lookup != nil {
		// A Lookup may wait: it holds no goroutine while it does.
		go st.s.lookup(callCtx, lookup, func(res *ledgerv1.LookupResponse, err error) {
			if err != nil {
				answer(&ledgerv1.StreamResponse{Id: id, Result: &ledgerv1.StreamResponse_Error{Error: callStatus(err)}})
				return
			}
			answer(&ledgerv1.StreamResponse{Id: id, Result: &ledgerv1.StreamResponse_Lookup{Lookup: res}})
		})
		return
	}
	st.workers.Go(func() { answer(st.s.streamCall(callCtx, req)) })
}

// tooManyLookups answers a Lookup past MaxStreamLookups.
var tooManyLookups = &errcode.Error{Code: errcode.RateLimited, Message: fmt.Sprintf("this stream has %d Lookups in flight already", MaxStreamLookups), RetryAfter: time.Second}

// drainSignals are what ends a stream gently: the server's drain or the
// stream's age ask for the drain notice; DrainGrace after it, the stream
// ends. A channel is nil once it has done its part.
type drainSignals struct {
	drain  <-chan struct{}
	age    <-chan time.Time
	grace  <-chan time.Time
	timers []*time.Timer
}

func (st *callStream) drainSignals() *drainSignals {
	d := &drainSignals{drain: st.s.drain}
	if st.s.streamMaxAge > 0 {
		t := time.NewTimer(st.s.streamMaxAge)
		d.timers, d.age = append(d.timers, t), t.C
	}
	return d
}

// noticeSent starts the grace period: the notice is not asked for again.
func (d *drainSignals) noticeSent() {
	t := time.NewTimer(DrainGrace)
	d.drain, d.age, d.grace, d.timers = nil, nil, t.C, append(d.timers, t)
}

func (d *drainSignals) stop() {
	for _, t := range d.timers {
		t.Stop()
	}
}

// DrainGrace is how long a stream waits, after its drain notice, for the
// client to close its side.
const DrainGrace = 10 * time.Second

// callContext is the context of one call: the stream's, with the call's
// timeout.
func callContext(ctx context.Context, req *ledgerv1.StreamRequest) (context.Context, context.CancelFunc, error) {
	timeout, err := optionalDuration("timeout", req.GetTimeout())
	if err != nil {
		return nil, nil, err
	}
	if timeout > 0 {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		return ctx, cancel, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	return ctx, cancel, nil
}

// streamSpan are the options of a stream call's span, made once: a span
// that no provider records then costs no allocation for them.
var streamSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
	trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.Bool("idemledger.stream", true))}

// streamCall runs one call as its unary counterpart. A panic becomes a
// typed INTERNAL answer, as the recovery interceptor makes it on a unary
// call.
func (s *Server) streamCall(ctx context.Context, req *ledgerv1.StreamRequest) (res *ledgerv1.StreamResponse) {
	res = &ledgerv1.StreamResponse{Id: req.GetId()}
	// The call's span continues the trace the client sent with it.
	if tc := req.GetTraceContext(); len(tc) > 0 {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.MapCarrier(tc))
	}
	ctx, span := tracer.Start(ctx, streamcall.Name(req), streamSpan...)
	defer func() {
		if e := res.GetError(); e != nil {
			span.SetAttributes(attribute.Int("rpc.grpc.status_code", int(e.GetCode())))
			if c := codes.Code(e.GetCode()); c == codes.Internal || c == codes.Unavailable || c == codes.Unknown {
				span.SetStatus(otelcodes.Error, e.GetMessage())
			}
		}
		span.End()
	}()
	defer func() {
		if p := recover(); p != nil {
			s.log.ErrorContext(ctx, "stream call panicked", "panic", fmt.Sprint(p))
			res = streamError(req.GetId(), errcode.Errorf(errcode.Internal, "internal error"))
		}
	}()
	handle := func(ctx context.Context, _ any) (any, error) { return res, s.dispatch(ctx, req, res) }
	var err error
	if s.intercept != nil {
		_, err = s.intercept(ctx, req, &grpc.UnaryServerInfo{Server: s, FullMethod: streamcall.FullMethod(req)}, handle)
	} else {
		_, err = handle(ctx, req)
	}
	if err != nil {
		return &ledgerv1.StreamResponse{Id: req.GetId(), Result: &ledgerv1.StreamResponse_Error{Error: callStatus(err)}}
	}
	return res
}

// dispatch runs req's call as its unary method and puts its response in
// res: one line a kind of call.
func (s *Server) dispatch(ctx context.Context, req *ledgerv1.StreamRequest, res *ledgerv1.StreamResponse) error {
	switch c := req.GetCall().(type) {
	case *ledgerv1.StreamRequest_Begin:
		return runCall(ctx, s.Begin, c.Begin, func(r *ledgerv1.BeginResponse) { res.Result = &ledgerv1.StreamResponse_Begin{Begin: r} })
	case *ledgerv1.StreamRequest_Complete:
		return runCall(ctx, s.Complete, c.Complete, func(r *ledgerv1.CompleteResponse) { res.Result = &ledgerv1.StreamResponse_Complete{Complete: r} })
	case *ledgerv1.StreamRequest_Release:
		return runCall(ctx, s.Release, c.Release, func(r *ledgerv1.ReleaseResponse) { res.Result = &ledgerv1.StreamResponse_Release{Release: r} })
	case *ledgerv1.StreamRequest_Extend:
		return runCall(ctx, s.Extend, c.Extend, func(r *ledgerv1.ExtendResponse) { res.Result = &ledgerv1.StreamResponse_Extend{Extend: r} })
	case *ledgerv1.StreamRequest_Lookup:
		return runCall(ctx, s.Lookup, c.Lookup, func(r *ledgerv1.LookupResponse) { res.Result = &ledgerv1.StreamResponse_Lookup{Lookup: r} })
	case *ledgerv1.StreamRequest_Resolve:
		return runCall(ctx, s.Resolve, c.Resolve, func(r *ledgerv1.ResolveResponse) { res.Result = &ledgerv1.StreamResponse_Resolve{Resolve: r} })
	}
	return ledgerstatus.Err(errcode.Errorf(errcode.ValidationFailed, "the call is missing"))
}

// runCall runs one call with method and hands its response to set.
func runCall[Req, Res any](ctx context.Context, method func(context.Context, Req) (Res, error), req Req, set func(Res)) error {
	r, err := method(ctx, req)
	if err == nil {
		set(r)
	}
	return err
}

// streamError is the answer to call id that failed with a ledger error.
func streamError(id uint64, err error) *ledgerv1.StreamResponse {
	return &ledgerv1.StreamResponse{Id: id, Result: &ledgerv1.StreamResponse_Error{Error: callStatus(ledgerstatus.Err(errcode.As(err)))}}
}

// callStatus is the status of err, as a unary call would fail with it.
func callStatus(err error) *ledgerv1.CallStatus {
	return ledgerstatus.ToCall(status.Convert(err))
}

// noTrailers is the transport stream of a call on a Stream: it has no
// headers or trailers of its own.
type noTrailers struct{}

func (noTrailers) Method() string               { return ledgerv1.LedgerService_Stream_FullMethodName }
func (noTrailers) SetHeader(metadata.MD) error  { return nil }
func (noTrailers) SendHeader(metadata.MD) error { return nil }
func (noTrailers) SetTrailer(metadata.MD) error { return nil }

// tracer makes the spans of the calls on a Stream (otelgrpc makes the
// unary calls').
var tracer = otel.Tracer("github.com/idemledger/idemledger/server")
