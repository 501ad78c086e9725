package ledgerclient_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seen records what a real ledger server received: the calls on streams
// and the unary calls.
type seen struct {
	mu     sync.Mutex
	stream []*ledgerv1.StreamRequest
	unary  []string
}

func (s *seen) streamed() []*ledgerv1.StreamRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*ledgerv1.StreamRequest(nil), s.stream...)
}

type recordingStream struct {
	grpc.ServerStream
	seen *seen
}

func (r recordingStream) RecvMsg(m any) error {
	err := r.ServerStream.RecvMsg(m)
	if req, ok := m.(*ledgerv1.StreamRequest); ok && err == nil {
		r.seen.mu.Lock()
		r.seen.stream = append(r.seen.stream, req)
		r.seen.mu.Unlock()
	}
	return err
}

// start serves a real LedgerService (memory store, every caller billing)
// on a loopback address (addr, or a free port), with opts, and records
// what it receives.
func start(t *testing.T, addr string, opts ...grpc.ServerOption) (*grpc.Server, string, *seen) {
	t.Helper()
	rec := &seen{}
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "billing", Tenants: []string{"*"}}, nil
	})
	gs := grpc.NewServer(append(opts,
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, recordingStream{ss, rec})
		}),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			rec.mu.Lock()
			rec.unary = append(rec.unary, info.FullMethod)
			rec.mu.Unlock()
			return h(ctx, req)
		}),
	)...)
	ledgerv1.RegisterLedgerServiceServer(gs, server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: auth}))
	return gs, listen(t, addr, gs), rec
}

// serve serves srv on a free loopback port until the test ends.
func serve(t *testing.T, srv ledgerv1.LedgerServiceServer) (addr string) {
	t.Helper()
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, srv)
	return listen(t, "", gs)
}

// listen serves gs on addr (a free loopback port when empty) until the
// test ends, and returns the address.
func listen(t *testing.T, addr string, gs *grpc.Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", cmp.Or(addr, "127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) *ledgerclient.Client {
	t.Helper()
	c, _ := dialConn(t, addr, opts...)
	return c
}

// dialConn is dial, and the connection under the client.
func dialConn(t *testing.T, addr string, opts ...grpc.DialOption) (*ledgerclient.Client, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	c := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	t.Cleanup(func() {
		_ = c.Close()
		_ = conn.Close()
	})
	return c, conn
}

func begin(key string) *ledgerv1.BeginRequest {
	return &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
}

// TestCallsGoOnTheStream: calls travel as messages on one stream with their
// deadline as their timeout; a cancel follows a call its caller gave up
// on; a request over MaxStreamedBytes goes as a unary call.
func TestCallsGoOnTheStream(t *testing.T) {
	t.Parallel()
	_, addr, rec := start(t, "")
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := c.Begin(ctx, begin("k"))
	if err != nil || res.GetClaim().GetToken() != 1 {
		t.Fatalf("Begin = %v, %v", res, err)
	}
	if got := rec.streamed(); len(got) != 1 || got[0].GetBegin().GetKey() != "k" ||
		got[0].GetTimeout().AsDuration() <= 50*time.Second || got[0].GetTimeout().AsDuration() > time.Minute {
		t.Fatalf("the server received %v, want the Begin with a timeout of about a minute", got)
	}

	// A Lookup that waits, given up on by its caller: the server hears a
	// cancel for it.
	lctx, lcancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, lcancel)
	_, err = c.Lookup(lctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k", Wait: durationpb.New(time.Minute)})
	if status.Code(err) != codes.Canceled { // as a unary call's
		t.Fatalf("a canceled call = %v, want CANCELED", err)
	}
	ledgertest.Eventually(t, 5*time.Second, func() bool {
		got := rec.streamed()
		return len(got) == 3 && got[2].GetCancel() != nil && got[2].GetId() == got[1].GetId()
	}, "the server receives the Lookup, then a cancel of it")

	big := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x", Value: make([]byte, ledgerclient.MaxStreamedBytes)}}}
	if _, err := c.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: 1, Outcome: big}); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	unary := rec.unary
	rec.mu.Unlock()
	if len(unary) != 1 || unary[0] != ledgerv1.LedgerService_Complete_FullMethodName {
		t.Fatalf("unary calls %v, want the large Complete", unary)
	}
	if got, err := c.Begin(t.Context(), begin("k")); err != nil || got.GetReplay() == nil {
		t.Fatalf("after a large Complete, Begin = %v, %v; want the replay", got, err)
	}
}

// waiting holds a key and starts a Lookup that waits a minute on it, and
// returns once the server (rec) has it: its error comes on the channel.
func waiting(t *testing.T, c *ledgerclient.Client, rec *seen) <-chan error {
	t.Helper()
	if _, err := c.Begin(t.Context(), begin("held")); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "held", Wait: durationpb.New(time.Minute)})
		errc <- err
	}()
	ledgertest.Eventually(t, 5*time.Second, func() bool {
		return slices.ContainsFunc(rec.streamed(), func(r *ledgerv1.StreamRequest) bool { return r.GetLookup() != nil })
	}, "the Lookup reaches the server")
	return errc
}

// TestServerRestart: a call in flight when the server goes away fails
// UNAVAILABLE (retryable); once a server is back, calls go through on a new
// stream.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	gs, addr, rec := start(t, "")
	c := dial(t, addr)
	errc := waiting(t, c, rec)
	gs.Stop()
	if le := ledgertest.WantStatus(t, <-errc, errcode.Unavailable); !le.Retryable() {
		t.Fatal("UNAVAILABLE must be retryable")
	}

	start(t, addr) // a new server, with a ledger of its own
	var res *ledgerv1.BeginResponse
	// Poll until the restarted server answers; every error meanwhile is retryable.
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		var err error
		if res, err = c.Begin(ctx, begin("after")); err != nil && !ledgerstatus.FromError(err).Retryable() {
			t.Fatalf("while the server comes back: %v, want a retryable error", err)
		}
		return err == nil
	}, "a call goes through after the server came back")
	if res.GetClaim().GetToken() != 1 {
		t.Fatalf("Begin on the new server = %v", res)
	}
}

// TestClose: Close fails the calls in flight and every later call,
// UNAVAILABLE, at once.
func TestClose(t *testing.T) {
	t.Parallel()
	_, addr, rec := start(t, "")
	c := dial(t, addr)
	errc := waiting(t, c, rec)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	ledgertest.WantStatus(t, <-errc, errcode.Unavailable)
	_, err := c.Begin(t.Context(), begin("later"))
	ledgertest.WantStatus(t, err, errcode.Unavailable)
}

// drainFirst is a client stream whose drain notice, the server's first
// message on a stream opened while it drains, is already read when the
// stream is handed to the client: the client learns of the drain before it
// can send the call that opened the stream.
type drainFirst struct {
	grpc.ClientStream
	first *ledgerv1.StreamResponse
	err   error
}

func (d *drainFirst) RecvMsg(m any) error {
	if d.first == nil && d.err == nil {
		return d.ClientStream.RecvMsg(m)
	}
	if d.err != nil {
		err := d.err
		d.err = nil
		return err
	}
	proto.Merge(m.(*ledgerv1.StreamResponse), d.first)
	d.first = nil
	return nil
}

// TestDrainingServerGetsEveryCall: a server that drains (as at shutdown)
// sends a drain notice on every stream as soon as it opens, and goes on
// answering calls until the client closes its side. Each call picks a
// stream and is sent on it, drain notice or not: none fails "not run".
func TestDrainingServerGetsEveryCall(t *testing.T) {
	t.Parallel()
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "billing", Tenants: []string{"*"}}, nil
	})
	srv := server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: auth})
	srv.Drain()
	var drains atomic.Int64
	c := dial(t, serve(t, srv), grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		d := &drainFirst{ClientStream: cs, first: &ledgerv1.StreamResponse{}}
		if d.err = cs.RecvMsg(d.first); d.err == nil && d.first.GetDrain() != nil {
			drains.Add(1)
		}
		if d.err != nil {
			d.first = nil
		}
		return d, nil
	}))
	for i := range 200 {
		if _, err := c.Begin(t.Context(), begin(fmt.Sprintf("drain-%d", i))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if n := drains.Load(); n < 100 {
		t.Fatalf("%d streams began with a drain notice; the test proves nothing", n)
	}
}

// pairedLedger answers a Stream's calls two at a time, both in one
// message, as ledgerd does with calls that end while it writes.
type pairedLedger struct {
	ledgerv1.UnimplementedLedgerServiceServer
}

func (pairedLedger) Stream(stream ledgerv1.LedgerService_StreamServer) error {
	for {
		var answers []*ledgerv1.StreamResponse
		for range 2 {
			req, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return nil // the client closed its side
			}
			if err != nil {
				return err
			}
			answers = append(answers, &ledgerv1.StreamResponse{Id: req.GetId(), Result: &ledgerv1.StreamResponse_Begin{Begin: &ledgerv1.BeginResponse{
				Result: &ledgerv1.BeginResponse_Claim{Claim: &ledgerv1.Claim{Token: 100 + uint64(len(req.GetBegin().GetKey()))}}}}})
		}
		answers[0].More = answers[1:]
		if err := stream.Send(answers[0]); err != nil {
			return err
		}
	}
}

// TestAnswersInOneMessage: each answer of a message that carries several
// answers its own call.
func TestAnswersInOneMessage(t *testing.T) {
	t.Parallel()
	c := dial(t, serve(t, pairedLedger{}))
	var wg sync.WaitGroup
	for _, key := range []string{"a", "bb", "ccc", "dddd"} {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			res, err := c.Begin(ctx, begin(key))
			if err != nil {
				t.Errorf("Begin %s: %v (its answer was not taken out of its message)", key, err)
				return
			}
			if got, want := res.GetClaim().GetToken(), 100+uint64(len(key)); got != want {
				t.Errorf("Begin %s got token %d, the answer to another call (want %d)", key, got, want)
			}
		})
	}
	wg.Wait()
}
