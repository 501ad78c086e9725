package grpcguard_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	testpb "github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const createInvoice = "/idemledger.testing.v1.InvoiceService/CreateInvoice"

// invoices is a write service whose CreateInvoice runs create and counts
// its runs.
type invoices struct {
	testpb.UnimplementedInvoiceServiceServer
	runs   atomic.Int64
	create func(ctx context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error)

	startOnce, closeOnce sync.Once
	started              chan struct{} // closed when the first run starts (firstRun)
}

// firstRun is closed once the handler's first run has started: the
// first attempt holds its claim.
func (s *invoices) firstRun() <-chan struct{} {
	s.startOnce.Do(func() { s.started = make(chan struct{}) })
	return s.started
}

func (s *invoices) CreateInvoice(ctx context.Context, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
	n := s.runs.Add(1)
	if n == 1 {
		s.closeOnce.Do(func() { s.firstRun(); close(s.started) })
	}
	if s.create != nil {
		return s.create(ctx, n, req)
	}
	return written(n, req), nil
}

func written(n int64, req *testpb.CreateInvoiceRequest) *testpb.CreateInvoiceResponse {
	return &testpb.CreateInvoiceResponse{Invoice: &testpb.Invoice{
		Id: fmt.Sprintf("inv_%04d", n), Tenant: req.GetTenant(), Number: n, CustomerId: req.GetCustomerId(),
		Currency: req.GetCurrency(), TotalMicros: 42_000_000 * n, CreatedAt: timestamppb.New(time.Now()),
	}}
}

// ledgerConn is a real LedgerService over bufconn, on the memory store.
func ledgerConn(t *testing.T) *grpc.ClientConn {
	return servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("billing"))).Dial(t)
}

// clockedLedger is ledgerConn on a clock of the test's own, started at the
// wall clock's now: leases and retention run out when the test advances
// it.
func clockedLedger(t *testing.T) (*grpc.ClientConn, *ledgertest.Clock) {
	clock := ledgertest.NewClock(time.Now())
	return servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("billing", clock.Now))).Dial(t), clock
}

// ledgerAPI is how the interceptor calls the ledger: unary calls, or calls
// on a Stream (ledger/ledgerclient).
type ledgerAPI string

const (
	unaryAPI  ledgerAPI = "Unary"
	streamAPI ledgerAPI = "Stream"
)

// client is a ledger client over conn that calls the ledger as api says.
func (api ledgerAPI) client(t *testing.T, conn *grpc.ClientConn) ledgerv1.LedgerServiceClient {
	raw := ledgerv1.NewLedgerServiceClient(conn)
	if api == unaryAPI {
		return raw
	}
	c := ledgerclient.New(raw)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// forEachAPI runs test once with each ledger API.
func forEachAPI(t *testing.T, test func(*testing.T, ledgerAPI)) {
	for _, api := range []ledgerAPI{unaryAPI, streamAPI} {
		t.Run(string(api), func(t *testing.T) { test(t, api) })
	}
}

// serve runs svc behind the interceptor (with recovery outside it, as a
// write service would) and returns a client of it.
func serve(t *testing.T, ledger ledgerv1.LedgerServiceClient, svc *invoices, opts ...grpcguard.Option) testpb.InvoiceServiceClient {
	t.Helper()
	return serveGuard(t, newGuard(t, ledger), svc, opts...)
}

// newGuard is a guard over ledger with opts.
func newGuard(t testing.TB, ledger ledgerv1.LedgerServiceClient, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(ledger, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// serveGuard is serve with a guard of the test's own.
func serveGuard(t *testing.T, g *guard.Guard, svc *invoices, opts ...grpcguard.Option) testpb.InvoiceServiceClient {
	t.Helper()
	icpt, err := grpcguard.UnaryServerInterceptor(g, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// The test ends once every run has: a run outlives its caller, and
	// may still be storing its outcome (trying a Complete again whose
	// answer was lost) when the caller's retry already replays it.
	conn := servertest.NewServer(t, func(gs *grpc.Server) { testpb.RegisterInvoiceServiceServer(gs, svc) },
		grpc.WaitForHandlers(true),
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Internal, "internal error")
		})), icpt)).Dial(t)
	return testpb.NewInvoiceServiceClient(conn)
}

func protect(p grpcguard.Method) []grpcguard.Option {
	return []grpcguard.Option{grpcguard.WithMethod(createInvoice, p), grpcguard.WithKeyField("request_id")}
}

func request(key string) *testpb.CreateInvoiceRequest {
	return &testpb.CreateInvoiceRequest{
		RequestId: key, Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*testpb.LineItem{{Description: "seats", Quantity: 3, UnitAmountMicros: 14_000_000}},
		Labels:    map[string]string{"team": "growth", "quarter": "q4"},
	}
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDuplicateReplaysIdenticalBytes(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testDuplicateReplaysIdenticalBytes)
}

func testDuplicateReplaysIdenticalBytes(t *testing.T, api ledgerAPI) {
	svc := &invoices{}
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
	first, err := client.CreateInvoice(t.Context(), request("k-1"))
	if err != nil {
		t.Fatal(err)
	}
	var header metadata.MD
	again, err := client.CreateInvoice(t.Context(), request("k-1"), grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(first, again, protocmp.Transform()); d != "" {
		t.Fatalf("replay (-first +replay):\n%s", d)
	}
	if string(marshal(t, first)) != string(marshal(t, again)) {
		t.Fatal("the replay's bytes differ from the first response's")
	}
	if got := header.Get(grpcguard.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("replayed header = %v", got)
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	// The key may also come in the header.
	req := request("")
	hdr := metadata.AppendToOutgoingContext(t.Context(), grpcguard.KeyHeader, "k-2")
	a, err := client.CreateInvoice(hdr, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.CreateInvoice(hdr, req)
	if err != nil || a.GetInvoice().GetId() != b.GetInvoice().GetId() || svc.runs.Load() != 2 {
		t.Fatalf("header key: %v then %v (%v), %d runs", a, b, err, svc.runs.Load())
	}
}

func TestChangedPayloadIsKeyReused(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testChangedPayloadIsKeyReused)
}

func testChangedPayloadIsKeyReused(t *testing.T, api ledgerAPI) {
	svc := &invoices{}
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
	if _, err := client.CreateInvoice(t.Context(), request("k")); err != nil {
		t.Fatal(err)
	}
	changed := request("k")
	changed.LineItems[0].Quantity = 4
	_, err := client.CreateInvoice(t.Context(), changed)
	le := ledgertest.WantStatus(t, err, errcode.KeyReused)
	if le.Metadata["method"] != createInvoice || le.Retryable() {
		t.Fatalf("KEY_REUSED metadata %v retryable %v", le.Metadata, le.Retryable())
	}
	if svc.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", svc.runs.Load())
	}
}

func TestParallelDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testParallelDuplicatesRunOnce)
}

func testParallelDuplicatesRunOnce(t *testing.T, api ledgerAPI) {
	release := make(chan struct{})
	svc := &invoices{create: func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		<-release
		return written(n, req), nil
	}}
	// Under REJECT the 49 duplicates are answered IN_PROGRESS at once.
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Reject}})...)
	var wg sync.WaitGroup
	results := make([]*testpb.CreateInvoiceResponse, 50)
	errs := make([]error, 50)
	answered := make(chan struct{}, 50)
	for i := range 50 {
		wg.Go(func() {
			results[i], errs[i] = client.CreateInvoice(t.Context(), request("same"))
			answered <- struct{}{}
		})
	}
	// 49 answer IN_PROGRESS while the winner's handler is held.
	for range 49 {
		<-answered
	}
	close(release)
	wg.Wait()
	won, inProgress := 0, 0
	for i := range 50 {
		switch {
		case errs[i] == nil:
			won++
		case ledgerstatus.FromError(errs[i]).Code == errcode.InProgress:
			inProgress++
			if le := ledgerstatus.FromError(errs[i]); !le.Retryable() || le.RetryAfter <= 0 {
				t.Fatalf("IN_PROGRESS without a retry-after: %v", errs[i])
			}
		default:
			t.Fatalf("call %d: %v", i, errs[i])
		}
	}
	if won != 1 || inProgress != 49 || svc.runs.Load() != 1 {
		t.Fatalf("%d answered, %d IN_PROGRESS, handler ran %d times; want 1, 49, 1", won, inProgress, svc.runs.Load())
	}
	again, err := client.CreateInvoice(t.Context(), request("same"))
	if err != nil || again.GetInvoice().GetId() != "inv_0001" {
		t.Fatalf("after the winner: %v, %v", again, err)
	}
}

func TestTransientErrorReleases(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testTransientErrorReleases)
}

func testTransientErrorReleases(t *testing.T, api ledgerAPI) {
	svc := &invoices{create: func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		if n == 1 {
			return nil, status.Error(codes.Unavailable, "the invoice database is failing over")
		}
		return written(n, req), nil
	}}
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
	_, err := client.CreateInvoice(t.Context(), request("k"))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("first attempt = %v, want the handler's UNAVAILABLE", err)
	}
	res, err := client.CreateInvoice(t.Context(), request("k"))
	if err != nil || res.GetInvoice().GetNumber() != 2 || svc.runs.Load() != 2 {
		t.Fatalf("the retry = %v, %v after %d runs; want a fresh run", res, err, svc.runs.Load())
	}
}

func TestPermanentErrorIsReplayed(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testPermanentErrorIsReplayed)
}

func testPermanentErrorIsReplayed(t *testing.T, api ledgerAPI) {
	declined, err := status.New(codes.FailedPrecondition, "the customer's account is closed").WithDetails(&errdetails.ErrorInfo{Reason: "ACCOUNT_CLOSED", Domain: "billing.example"})
	if err != nil {
		t.Fatal(err)
	}
	svc := &invoices{create: func(context.Context, int64, *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		return nil, declined.Err()
	}}
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
	_, first := client.CreateInvoice(t.Context(), request("k"))
	var header metadata.MD
	_, again := client.CreateInvoice(t.Context(), request("k"), grpc.Header(&header))
	if d := cmp.Diff(status.Convert(first).Proto(), status.Convert(again).Proto(), protocmp.Transform()); d != "" || status.Code(again) != codes.FailedPrecondition {
		t.Fatalf("replayed error (-first +again):\n%s", d)
	}
	if svc.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", svc.runs.Load())
	}
	if got := header.Get(grpcguard.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("replayed header on an error replay = %v", got)
	}
}

func TestPanicLeavesTheLeaseToExpire(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testPanicLeavesTheLeaseToExpire)
}

func testPanicLeavesTheLeaseToExpire(t *testing.T, api ledgerAPI) {
	var claims []guard.Claim
	var mu sync.Mutex
	svc := &invoices{create: func(ctx context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		c, ok := guard.ClaimFromContext(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no claim in the handler's context")
		}
		mu.Lock()
		claims = append(claims, c)
		mu.Unlock()
		if n == 1 {
			panic("crash mid-handler")
		}
		return written(n, req), nil
	}}
	conn, clock := clockedLedger(t)
	client := serve(t, api.client(t, conn), svc, protect(grpcguard.Method{Policy: guard.Policy{Lease: 300 * time.Millisecond, OnInProgress: guard.Reject}})...)
	if _, err := client.CreateInvoice(t.Context(), request("k")); status.Code(err) != codes.Internal {
		t.Fatalf("the panicking attempt = %v", err)
	}
	_, err := client.CreateInvoice(t.Context(), request("k"))
	ledgertest.WantStatus(t, err, errcode.InProgress)
	clock.Advance(400 * time.Millisecond)
	res, err := client.CreateInvoice(t.Context(), request("k"))
	if err != nil || res.GetInvoice().GetNumber() != 2 {
		t.Fatalf("the attempt after the lease ran out = %v, %v", res, err)
	}
	if len(claims) != 2 || claims[1].Token <= claims[0].Token || claims[1].Attempt != 2 || claims[0].Key != "k" || claims[0].Tenant != "acme" {
		t.Fatalf("claims = %+v; want a takeover with a higher token and attempt 2", claims)
	}
}

func TestLedgerDownFailsClosed(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testLedgerDownFailsClosed)
}

func testLedgerDownFailsClosed(t *testing.T, api ledgerAPI) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close() // nothing listens there now
	down, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close() })
	svc := &invoices{}
	client := serve(t, api.client(t, down), svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
	var trailer metadata.MD
	_, err = client.CreateInvoice(t.Context(), request("k"), grpc.Trailer(&trailer))
	le := ledgertest.WantStatus(t, err, errcode.Unavailable)
	if !le.Retryable() || le.RetryAfter <= 0 || len(trailer.Get(ledgerstatus.PushbackTrailer)) != 1 {
		t.Fatalf("UNAVAILABLE retryable=%v retry-after=%v trailer=%v", le.Retryable(), le.RetryAfter, trailer)
	}
	if svc.runs.Load() != 0 {
		t.Fatal("the handler ran with the ledger down")
	}
}

func TestLongHandlerKeepsItsLease(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testLongHandlerKeepsItsLease)
}

func testLongHandlerKeepsItsLease(t *testing.T, api ledgerAPI) {
	conn, clock := clockedLedger(t)
	ledger := extensions{LedgerServiceClient: api.client(t, conn), granted: make(chan time.Time, 16)}
	open := make(chan struct{})
	svc := &invoices{create: func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		<-open
		return written(n, req), nil
	}}
	const lease = 200 * time.Millisecond
	client := serve(t, ledger, svc, protect(grpcguard.Method{Policy: guard.Policy{Lease: lease, OnInProgress: guard.Reject}})...)
	done := make(chan error, 1)
	go func() { _, err := client.CreateInvoice(t.Context(), request("k")); done <- err }()
	<-svc.firstRun()
	// The guard extends the lease every half lease of real time; the
	// ledger's clock is the test's. Each round moves it to just short of
	// the newest extension's end: three rounds are more than a lease past
	// the claim, and without the extensions the duplicate would take over.
	for range 3 {
		for end := range ledger.granted {
			if end.Sub(clock.Now()) > lease/2 { // granted since the clock last moved
				clock.Advance(end.Sub(clock.Now()) - lease/4)
				break
			}
		}
		_, err := client.CreateInvoice(t.Context(), request("k"))
		ledgertest.WantStatus(t, err, errcode.InProgress)
	}
	close(open)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	res, err := client.CreateInvoice(t.Context(), request("k"))
	if err != nil || res.GetInvoice().GetNumber() != 1 || svc.runs.Load() != 1 {
		t.Fatalf("after the long handler: %v, %v, %d runs; want its replay", res, err, svc.runs.Load())
	}
}

// extensions is a ledger client that sends the end of each lease the
// ledger extends on granted (dropping what a full channel cannot take).
type extensions struct {
	ledgerv1.LedgerServiceClient
	granted chan time.Time
}

func (e extensions) Extend(ctx context.Context, req *ledgerv1.ExtendRequest, opts ...grpc.CallOption) (*ledgerv1.ExtendResponse, error) {
	res, err := e.LedgerServiceClient.Extend(ctx, req, opts...)
	if err == nil {
		select {
		case e.granted <- res.GetLeaseExpiresAt().AsTime():
		default:
		}
	}
	return res, err
}

func TestKeysAndTenants(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testKeysAndTenants)
}

func testKeysAndTenants(t *testing.T, api ledgerAPI) {
	svc := &invoices{}
	strict := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
	_, err := strict.CreateInvoice(t.Context(), request(""))
	ledgertest.WantStatus(t, err, errcode.KeyMissing)
	_, err = strict.CreateInvoice(t.Context(), request("bad key"))
	ledgertest.WantStatus(t, err, errcode.KeyInvalid)
	noTenant := request("k")
	noTenant.Tenant = ""
	_, err = strict.CreateInvoice(t.Context(), noTenant)
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)
	old := metadata.AppendToOutgoingContext(t.Context(), grpcguard.FirstAttemptHeader, time.Now().Add(-9*24*time.Hour).Format(time.RFC3339Nano))
	_, err = strict.CreateInvoice(old, request("k-old"))
	ledgertest.WantStatus(t, err, errcode.RetryTooLate)
	bad := metadata.AppendToOutgoingContext(t.Context(), grpcguard.FirstAttemptHeader, "yesterday")
	_, err = strict.CreateInvoice(bad, request("k-bad"))
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)
	if svc.runs.Load() != 0 {
		t.Fatalf("the handler ran %d times on refused calls", svc.runs.Load())
	}

	// The tenant from a header instead of the request.
	byHeader := serve(t, api.client(t, ledgerConn(t)), svc, append(protect(grpcguard.Method{Policy: guard.Policy{}}), grpcguard.WithTenant(grpcguard.TenantFromHeader("x-tenant")))...)
	_, err = byHeader.CreateInvoice(t.Context(), request("k-h"))
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)
	hctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "globex")
	if _, err := byHeader.CreateInvoice(hctx, request("k-h")); err != nil || svc.runs.Load() != 1 {
		t.Fatalf("tenant from the header: %v, %d runs", err, svc.runs.Load())
	}
	if _, err := byHeader.CreateInvoice(hctx, request("k-h")); err != nil || svc.runs.Load() != 1 {
		t.Fatalf("replay with the tenant from the header: %v, %d runs", err, svc.runs.Load())
	}
	svc.runs.Store(0)

	lax := serve(t, api.client(t, ledgerConn(t)), svc, grpcguard.WithMethod(createInvoice, grpcguard.Method{Policy: guard.Policy{KeyOptional: true}}))
	for range 2 {
		if _, err := lax.CreateInvoice(t.Context(), request("")); err != nil {
			t.Fatal(err)
		}
	}
	if svc.runs.Load() != 2 {
		t.Fatalf("KeyOptional without a key ran %d times, want 2 (unprotected)", svc.runs.Load())
	}
}

func TestRefusesToBuild(t *testing.T) {
	t.Parallel()
	client := ledgerv1.NewLedgerServiceClient(ledgerConn(t))
	for name, opts := range map[string][]grpcguard.Option{
		"UnknownService": {grpcguard.WithMethod("/nope.v1.Nope/Create", grpcguard.Method{Policy: guard.Policy{}})},
		"UnknownMethod":  {grpcguard.WithMethod("/idemledger.testing.v1.InvoiceService/Delete", grpcguard.Method{Policy: guard.Policy{}})},
		"NotAFullName":   {grpcguard.WithMethod("CreateInvoice", grpcguard.Method{Policy: guard.Policy{}})},
		"NegativeLease":  {grpcguard.WithMethod(createInvoice, grpcguard.Method{Policy: guard.Policy{Lease: -time.Second}})},
		"NoTenantFunc":   {grpcguard.WithTenant(nil)},
		"Streaming":      {grpcguard.WithMethod("/grpc.health.v1.Health/Watch", grpcguard.Method{Policy: guard.Policy{}})},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := grpcguard.UnaryServerInterceptor(newGuard(t, client), opts...); err == nil {
				t.Fatal("built")
			}
		})
	}
}

// TestRunOutlivesItsCaller: a client whose deadline ends mid-handler does
// not end the handler: it finishes under its claim, its answer is
// stored, and the client's retry gets the replay; the write ran once.
func TestRunOutlivesItsCaller(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testRunOutlivesItsCaller)
}

func testRunOutlivesItsCaller(t *testing.T, api ledgerAPI) {
	release := make(chan struct{})
	finished := make(chan error, 1)
	svc := &invoices{create: func(ctx context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		<-release
		finished <- ctx.Err()
		return written(n, req), nil
	}}
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{})...)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { <-svc.firstRun(); cancel() }() // the client hangs up mid-run
	if _, err := client.CreateInvoice(ctx, request("k")); status.Code(err) != codes.Canceled {
		t.Fatalf("the call whose client hung up = %v, want Canceled", err)
	}
	close(release)
	if err := <-finished; err != nil {
		t.Fatalf("the handler's context ended with its caller: %v", err)
	}
	var header metadata.MD
	res, err := client.CreateInvoice(t.Context(), request("k"), grpc.Header(&header))
	if err != nil || res.GetInvoice().GetNumber() != 1 || svc.runs.Load() != 1 {
		t.Fatalf("the retry = %v, %v, %d runs; want the first run's answer", res, err, svc.runs.Load())
	}
	if got := header.Get(grpcguard.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("the retry's replayed header = %v", got)
	}
}
