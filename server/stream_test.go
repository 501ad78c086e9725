package server_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// streamClient is a ledgerclient client whose streams carry token.
func streamClient(t testing.TB, conn grpc.ClientConnInterface, token string) *ledgerclient.Client {
	c := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn), ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+token)))
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestStreamResponsesAsUnary runs one script of calls against two identical
// ledgers, one over unary calls and one over a Stream, and compares every
// answer: responses field for field, errors as whole statuses (code,
// message, details).
func TestStreamResponsesAsUnary(t *testing.T) {
	t.Parallel()
	type answer struct {
		Res, Status proto.Message // one of them
	}
	run := func(stream bool) []answer {
		f := newFixture(t)
		client := f.client
		other := f.client // another caller: refunds, every tenant
		ctx, otherCtx := as(t, "billing-token"), as(t, "refunds-token")
		if stream {
			client, other = streamClient(t, f.conn, "billing-token"), streamClient(t, f.conn, "refunds-token")
		}
		var answers []answer
		record := func(res proto.Message, err error) {
			a := answer{Res: res}
			if err != nil {
				a.Res, a.Status = nil, status.Convert(err).Proto()
			}
			answers = append(answers, a)
		}
		out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte{7}}}}
		begin, err := client.Begin(ctx, beginReq("k"))
		record(begin, err)
		token := begin.GetClaim().GetToken()
		record(client.Begin(ctx, beginReq("k"))) // IN_PROGRESS
		reused := beginReq("k")
		reused.Fingerprint = ledgertest.Fingerprint("other")
		record(client.Begin(ctx, reused)) // KEY_REUSED
		f.clock.Advance(time.Second)
		record(client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "k", Token: token, Lease: durationpb.New(time.Minute)}))
		record(client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: token + 1, Outcome: out})) // LEASE_LOST
		record(client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: token, Outcome: out}))
		record(client.Begin(ctx, beginReq("k"))) // replay
		record(client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}))
		record(client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "absent"})) // NOT_FOUND
		record(client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: "bad key"}))  // KEY_INVALID
		record(client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "initech", Key: "k"}))     // PERMISSION_DENIED
		record(other.Lookup(otherCtx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}))  // another namespace: NOT_FOUND
		released, err := client.Begin(ctx, beginReq("r"))
		record(released, err)
		record(client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "r", Token: released.GetClaim().GetToken()}))
		record(client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "r", Token: 99})) // LEASE_LOST
		// A large outcome: the stream client sends it as a unary call,
		// with the stream's credentials.
		big, err := client.Begin(ctx, beginReq("big"))
		record(big, err)
		large := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: make([]byte, 100<<10)}}}
		record(client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "big", Token: big.GetClaim().GetToken(), Outcome: large}))
		record(client.Begin(ctx, beginReq("big"))) // its replay
		return answers
	}
	unary, stream := run(false), run(true)
	if d := cmp.Diff(unary, stream, protocmp.Transform()); d != "" {
		t.Fatalf("stream answers differ from unary answers (-unary +stream):\n%s", d)
	}
	errs := 0
	for _, a := range unary {
		if a.Status != nil {
			errs++
		}
	}
	if errs != 8 {
		t.Fatalf("%d of %d calls failed, want 8: the script did not run as written", errs, len(unary))
	}
}

// rawStream opens a Stream as billing.
func rawStream(t *testing.T, conn grpc.ClientConnInterface) ledgerv1.LedgerService_StreamClient {
	t.Helper()
	s, err := ledgerv1.NewLedgerServiceClient(conn).Stream(as(t, "billing-token"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// answers reads a Stream's answers one at a time, however the server put
// them in messages.
type answers struct {
	stream ledgerv1.LedgerService_StreamClient
	left   []*ledgerv1.StreamResponse
}

func (r *answers) next() (*ledgerv1.StreamResponse, error) {
	for len(r.left) == 0 {
		res, err := r.stream.Recv()
		if err != nil {
			return nil, err
		}
		r.left = append([]*ledgerv1.StreamResponse{res}, res.GetMore()...)
		res.More = nil
	}
	a := r.left[0]
	r.left = r.left[1:]
	return a, nil
}

func wantStreamCode(t *testing.T, res *ledgerv1.StreamResponse, id uint64, code errcode.Code) {
	t.Helper()
	if res.GetId() != id {
		t.Fatalf("answer for call %d, want %d", res.GetId(), id)
	}
	e := res.GetError()
	if e == nil {
		t.Fatalf("call %d = %v, want %s", id, res, code)
	}
	le := ledgerstatus.FromError(ledgerstatus.FromFields(e).Err())
	if le.Code != code {
		t.Fatalf("call %d failed with %s (%s), want %s", id, le.Code, le.Message, code)
	}
}

// TestStreamProtocol: bad calls on a stream get typed errors and the
// stream goes on; a call's timeout bounds it on the server; a cancel
// cancels it there.
func TestStreamProtocol(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	s := rawStream(t, f.conn)
	send := func(req *ledgerv1.StreamRequest) {
		t.Helper()
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	in := &answers{stream: s}
	recv := func() *ledgerv1.StreamResponse {
		t.Helper()
		res, err := in.next()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if _, err := f.client.Begin(as(t, "billing-token"), beginReq("held")); err != nil {
		t.Fatal(err)
	}
	waitFor := func(id uint64, timeout *durationpb.Duration) *ledgerv1.StreamRequest {
		return &ledgerv1.StreamRequest{Id: id, Timeout: timeout, Call: &ledgerv1.StreamRequest_Lookup{
			Lookup: &ledgerv1.LookupRequest{Tenant: "acme", Key: "held", Wait: durationpb.New(time.Minute)}}}
	}

	send(&ledgerv1.StreamRequest{Id: 1})
	wantStreamCode(t, recv(), 1, errcode.ValidationFailed) // no call
	send(&ledgerv1.StreamRequest{Id: 2, Timeout: durationpb.New(-time.Second), Call: &ledgerv1.StreamRequest_Begin{Begin: beginReq("x")}})
	wantStreamCode(t, recv(), 2, errcode.ValidationFailed)                                                        // bad timeout
	send(&ledgerv1.StreamRequest{Id: 3, Call: &ledgerv1.StreamRequest_Cancel{Cancel: &ledgerv1.CancelRequest{}}}) // nothing to cancel: no answer

	// A lookup that would wait a minute, bounded by its timeout on the
	// server (the fixture's clock is fake: only the context can end it).
	start := time.Now()
	send(waitFor(4, durationpb.New(100*time.Millisecond)))
	// The same id again while it is in flight.
	send(waitFor(4, nil))
	wantStreamCode(t, recv(), 4, errcode.ValidationFailed)
	wantStreamCode(t, recv(), 4, errcode.UpstreamTimeout)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the call's timeout took %s", d)
	}

	// A cancel ends a call in flight.
	// The server starts a call before it reads the next message, so the
	// cancel finds call 5 in flight.
	send(waitFor(5, nil))
	send(&ledgerv1.StreamRequest{Id: 5, Call: &ledgerv1.StreamRequest_Cancel{Cancel: &ledgerv1.CancelRequest{}}})
	wantStreamCode(t, recv(), 5, errcode.UpstreamTimeout)

	// An id answered is free again at once: the server forgets a call
	// before it sends the answer.
	for range 500 {
		send(&ledgerv1.StreamRequest{Id: 7, Call: &ledgerv1.StreamRequest_Lookup{Lookup: &ledgerv1.LookupRequest{Tenant: "acme", Key: "missing"}}})
		wantStreamCode(t, recv(), 7, errcode.NotFound)
	}

	// The stream still works, and ends with OK when the client closes it.
	send(&ledgerv1.StreamRequest{Id: 6, Call: &ledgerv1.StreamRequest_Begin{Begin: beginReq("fresh")}})
	if res := recv(); res.GetId() != 6 || res.GetBegin().GetClaim().GetToken() != 1 {
		t.Fatalf("call 6 = %v", res)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if res, err := in.next(); !errors.Is(err, io.EOF) {
		t.Fatalf("after close: %v, %v; want the stream to end with OK", res, err)
	}
}

// TestStreamDrainLosesNoCall: streams drained by age (every 20 ms) and by
// Drain, under 8 concurrent callers: every call is answered, none fails,
// and the callers moved to new streams.
func TestStreamDrainLosesNoCall(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	srv := server.New(l, server.Config{Auth: testAuth, StreamMaxAge: 20 * time.Millisecond})
	var streams atomic.Int64
	conn := servertest.NewServer(t, servertest.Ledger(srv), grpc.StreamInterceptor(func(s any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		streams.Add(1)
		return h(s, ss)
	})).Dial(t)
	client := streamClient(t, conn, "billing-token")
	ctx := t.Context()
	pairs := func(worker, n int) {
		for i := range n {
			key := fmt.Sprintf("w%d-%d", worker, i)
			res, err := client.Begin(ctx, beginReq(key))
			if err != nil {
				t.Errorf("Begin %s: %v", key, err)
				return
			}
			out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}}}
			if _, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: res.GetClaim().GetToken(), Outcome: out}); err != nil {
				t.Errorf("Complete %s: %v", key, err)
				return
			}
		}
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() { pairs(w, 300) })
	}
	wg.Wait()
	if streams.Load() < 3 {
		t.Fatalf("%d streams for 4,800 calls drained every 20 ms", streams.Load())
	}
	t.Logf("%d streams", streams.Load())

	// Drain (as at shutdown): calls still get answers, on fresh streams
	// that are drained in turn.
	srv.Drain()
	for w := range 4 {
		wg.Go(func() { pairs(100+w, 50) })
	}
	wg.Wait()
}

// TestStreamBreakIsUnavailable: calls in flight when the connection breaks
// fail UNAVAILABLE, retryable, and the client fails fast after.
func TestStreamBreakIsUnavailable(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	srv := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth})))
	client := streamClient(t, srv.Dial(t), "billing-token")
	ctx := t.Context()
	if _, err := client.Begin(ctx, beginReq("held")); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "held", Wait: durationpb.New(time.Minute)})
		errc <- err
	}()
	ledgertest.Eventually(t, 5*time.Second, func() bool { return l.Waiters() > 0 }, "the Lookup waits at the server")
	srv.Stop()
	select {
	case err := <-errc:
		if le := ledgertest.WantStatus(t, err, errcode.Unavailable); !le.Retryable() {
			t.Fatal("UNAVAILABLE must be retryable")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call in flight was not failed when the connection broke")
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := client.Begin(cctx, beginReq("after"))
	if code := ledgerstatus.FromError(err).Code; code != errcode.Unavailable && code != errcode.UpstreamTimeout {
		t.Fatalf("a call with the server gone = %v, want UNAVAILABLE or a timeout", err)
	}
}

// panicky is a store that panics when a claim's key is "boom".
type panicky struct{ ledger.Store }

func (p panicky) Claim(ctx context.Context, c ledger.ClaimParams) (ledger.ClaimResult, error) {
	if c.Scope.Key == "boom" {
		panic("boom")
	}
	return p.Store.Claim(ctx, c)
}

// TestStreamCallPanicIsInternal: a panic in one call answers it INTERNAL;
// the stream and the server go on.
func TestStreamCallPanicIsInternal(t *testing.T) {
	t.Parallel()
	l := ledger.New(panicky{memory.New(memory.Config{})}, ledger.Config{})
	client := streamClient(t, servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth}))).Dial(t), "billing-token")
	_, err := client.Begin(t.Context(), beginReq("boom"))
	ledgertest.WantStatus(t, err, errcode.Internal)
	if res, err := client.Begin(t.Context(), beginReq("fine")); err != nil || res.GetClaim().GetToken() != 1 {
		t.Fatalf("after a panic: %v, %v", res, err)
	}
}

// TestStreamCallsAreLimitedAndCounted: each call on a stream takes a token
// of its namespace's rate limit and counts its decision, as a unary call
// does; RATE_LIMITED carries its retry-after in its details.
func TestStreamCallsAreLimitedAndCounted(t *testing.T) {
	t.Parallel()
	var metrics decisions
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	conn := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth, RateLimit: server.NewRateLimit(0.5, 3), Observe: metrics.observe}))).Dial(t)
	client := streamClient(t, conn, "billing-token")
	ctx := t.Context()
	if _, err := client.Begin(ctx, beginReq("a")); err != nil {
		t.Fatal(err)
	}
	_, err := client.Begin(ctx, beginReq("a"))
	ledgertest.WantStatus(t, err, errcode.InProgress)
	if _, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "a"}); err != nil {
		t.Fatal(err)
	}
	_, err = client.Begin(ctx, beginReq("b"))
	if le := ledgertest.WantStatus(t, err, errcode.RateLimited); !le.Retryable() || le.RetryAfter < time.Second || le.RetryAfter > 2*time.Second {
		t.Fatalf("RATE_LIMITED retryable=%v retry-after=%v; want retryable and about 2s", le.Retryable(), le.RetryAfter)
	}
	metrics.want(t, map[string]int{"billing claimed": 1, "billing in_progress": 1, "billing rate_limited": 1})
}

// TestDeadStreamIsFreed: a client that queues more calls than a stream
// runs at once (Begins held by the store) and then dies leaves nothing
// behind: the stream's goroutines and calls are gone within seconds, not
// at the stream's maximum age.
//
//nolint:paralleltest // it counts the process's goroutines: the parallel tests wait until it is done
func TestDeadStreamIsFreed(t *testing.T) {
	st := &heldClaims{Store: memory.New(memory.Config{}), entered: make(chan struct{}, server.MaxStreamCalls)}
	l := ledger.New(st, ledger.Config{})
	srv := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth, StreamMaxAge: time.Hour})))
	baseline := runtime.NumGoroutine()
	conn := srv.Dial(t)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer billing-token"))
	stream, err := ledgerv1.NewLedgerServiceClient(conn).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const calls = server.MaxStreamCalls + 100
	for id := range uint64(calls) {
		req := &ledgerv1.StreamRequest{Id: id + 1, Call: &ledgerv1.StreamRequest_Begin{Begin: beginReq(fmt.Sprint("held-", id))}}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	// The server runs 1024 and holds the rest back.
	for range server.MaxStreamCalls {
		<-st.entered
	}
	cancel() // the client dies
	_ = conn.Close()
	ledgertest.Eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= baseline+5 && !streamsRunning() },
		"the dead stream's goroutines end after the client died (baseline %d)", baseline)
	if n := st.claims.Load(); n != server.MaxStreamCalls {
		t.Fatalf("the store saw %d claims, want %d: the stream ran past its bound", n, server.MaxStreamCalls)
	}
}

// heldClaims is a memory store whose claims wait for their call to end.
type heldClaims struct {
	*memory.Store
	claims  atomic.Int64
	entered chan struct{}
}

func (s *heldClaims) Claim(ctx context.Context, _ ledger.ClaimParams) (ledger.ClaimResult, error) {
	s.claims.Add(1)
	s.entered <- struct{}{}
	<-ctx.Done()
	return ledger.ClaimResult{}, ctx.Err()
}

// TestWaitingLookupsHoldNothingBack: Lookups waiting on a stream, more of
// them than the stream runs other calls at once, neither hold back its
// other calls nor each other: a Begin of another key is answered while
// they wait, and a Complete wakes its key's waiter. Past MaxStreamLookups
// a Lookup is RATE_LIMITED at once.
func TestWaitingLookupsHoldNothingBack(t *testing.T) {
	t.Parallel()
	const n = server.MaxStreamCalls + 100
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{MaxWaiters: 2 * server.MaxStreamLookups, MaxWaitersTotal: 2 * server.MaxStreamLookups})
	srv := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth})))
	client := streamClient(t, srv.Dial(t), "billing-token")
	tokens := make([]uint64, n)
	for i := range n {
		res, err := client.Begin(t.Context(), beginReq(fmt.Sprint("held-", i)))
		if err != nil {
			t.Fatal(err)
		}
		tokens[i] = res.GetClaim().GetToken()
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	woken := make(chan *ledgerv1.LookupResponse, 1)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			res, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: fmt.Sprint("held-", i), Wait: durationpb.New(time.Minute)})
			if i == 0 {
				if err != nil {
					t.Errorf("the woken Lookup: %v", err)
				}
				woken <- res
			}
		})
	}
	ledgertest.Eventually(t, 10*time.Second, func() bool { return l.Waiters() >= n }, "%d Lookups waiting", n)
	bctx, bcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer bcancel()
	if _, err := client.Begin(bctx, beginReq("fresh")); err != nil {
		t.Fatalf("a Begin behind %d waiting Lookups: %v", n, err)
	}
	if _, err := client.Complete(bctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held-0", Token: tokens[0], Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte{1}}}}}); err != nil {
		t.Fatal(err)
	}
	if res := <-woken; res.GetRecord().GetState() != ledgerv1.State_STATE_COMPLETED {
		t.Fatalf("the woken Lookup answered %v", res)
	}
	cancel()
	wg.Wait()

	// Past the bound, at once (held-0 is completed: its Lookups would not wait).
	raw, err := ledgerv1.NewLedgerServiceClient(srv.Dial(t)).Stream(as(t, "billing-token"))
	if err != nil {
		t.Fatal(err)
	}
	for id := range uint64(server.MaxStreamLookups + 1) {
		req := &ledgerv1.StreamRequest{Id: id + 1, Call: &ledgerv1.StreamRequest_Lookup{Lookup: &ledgerv1.LookupRequest{
			Tenant: "acme", Key: fmt.Sprint("held-", 1+id%(n-1)), Wait: durationpb.New(time.Minute)}}}
		if err := raw.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	res, err := (&answers{stream: raw}).next()
	if err != nil {
		t.Fatal(err)
	}
	wantStreamCode(t, res, server.MaxStreamLookups+1, errcode.RateLimited)
	if le := ledgerstatus.FromError(ledgerstatus.FromFields(res.GetError()).Err()); le.RetryAfter != time.Second {
		t.Fatalf("past the bound: retry after %v", le.RetryAfter)
	}
}

// streamsRunning reports whether a Stream handler is still running.
func streamsRunning() bool {
	buf := make([]byte, 1<<20)
	return bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("server.(*Server).Stream("))
}
