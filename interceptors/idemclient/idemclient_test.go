package idemclient_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	testpb "github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const createInvoice = "/idemledger.testing.v1.InvoiceService/CreateInvoice"

// attempt is what the write service saw of one call.
type attempt struct {
	key string
	at  time.Time
}

// invoices fails the first len(failures) runs with those errors, then
// writes invoice number n.
type invoices struct {
	testpb.UnimplementedInvoiceServiceServer
	mu       sync.Mutex
	seen     []attempt
	runs     atomic.Int64
	failures []error
	hold     time.Duration
}

func (s *invoices) CreateInvoice(ctx context.Context, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
	claim, _ := guard.ClaimFromContext(ctx)
	s.mu.Lock()
	s.seen = append(s.seen, attempt{key: claim.Key, at: time.Now()})
	s.mu.Unlock()
	n := s.runs.Add(1)
	if int(n) <= len(s.failures) {
		return nil, s.failures[n-1]
	}
	time.Sleep(s.hold) // the handler holds its call for real: the client's deadline and retries are the subject
	return &testpb.CreateInvoiceResponse{Invoice: &testpb.Invoice{Id: fmt.Sprintf("inv_%d", n), Tenant: req.GetTenant(), Number: n}}, nil
}

// client runs svc behind the server interceptor and a real ledger, and
// returns a client whose connection has the idemclient interceptor.
func client(t *testing.T, svc *invoices, opts ...idemclient.Option) testpb.InvoiceServiceClient {
	t.Helper()
	ledgerConn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("billing"))).Dial(t)
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(ledgerConn))
	if err != nil {
		t.Fatal(err)
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g, grpcguard.WithMethod(createInvoice, grpcguard.Method{Policy: guard.Policy{}}))
	if err != nil {
		t.Fatal(err)
	}
	// The test ends once every run has: a run outlives a caller whose
	// deadline passed, and may still be storing or releasing its outcome.
	srv := servertest.NewServer(t, func(gs *grpc.Server) { testpb.RegisterInvoiceServiceServer(gs, svc) }, grpc.UnaryInterceptor(icpt), grpc.WaitForHandlers(true))
	return testpb.NewInvoiceServiceClient(srv.Dial(t, grpc.WithUnaryInterceptor(idemclient.UnaryClientInterceptor(append([]idemclient.Option{idemclient.WithBackoff(time.Millisecond, 20*time.Millisecond)}, opts...)...))))
}

func request() *testpb.CreateInvoiceRequest {
	return &testpb.CreateInvoiceRequest{Tenant: "acme", CustomerId: "cus_1", Currency: "EUR"}
}

func typed(code errcode.Code, retryAfter time.Duration) error {
	return ledgerstatus.Err(&errcode.Error{Code: code, Message: code.String(), RetryAfter: retryAfter})
}

// TestOneKeyAcrossRetriesAndRetryAfter: the service answers RATE_LIMITED
// with a 150 ms retry-after twice; the interceptor retries with the same
// key, waits at least the hint each time, and the third attempt writes.
func TestOneKeyAcrossRetriesAndRetryAfter(t *testing.T) {
	t.Parallel()
	svc := &invoices{failures: []error{typed(errcode.RateLimited, 150*time.Millisecond), typed(errcode.RateLimited, 150*time.Millisecond)}}
	c := client(t, svc)
	res, err := c.CreateInvoice(t.Context(), request())
	if err != nil || res.GetInvoice().GetNumber() != 3 {
		t.Fatalf("CreateInvoice = %v, %v; want the third attempt's invoice", res, err)
	}
	if len(svc.seen) != 3 {
		t.Fatalf("%d attempts, want 3", len(svc.seen))
	}
	for i, a := range svc.seen {
		if a.key == "" || a.key != svc.seen[0].key {
			t.Fatalf("attempt %d key %q, first %q: want one key", i, a.key, svc.seen[0].key)
		}
		if i > 0 && a.at.Sub(svc.seen[i-1].at) < 150*time.Millisecond {
			t.Fatalf("attempt %d came %v after the last, before the 150 ms retry-after", i, a.at.Sub(svc.seen[i-1].at))
		}
	}
}

func TestRetriesOnlyRetryable(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		err  error
		runs int64
	}{
		"TypedPermanent":     {typed(errcode.ValidationFailed, 0), 1},
		"ForeignPermanent":   {status.Error(codes.InvalidArgument, "bad currency"), 1},
		"TypedTransient":     {typed(errcode.Unavailable, 0), 2},
		"ForeignTransient":   {status.Error(codes.Unavailable, "failing over"), 2},
		"ForeignAborted":     {status.Error(codes.Aborted, "conflict"), 2},
		"ForeignInternal":    {status.Error(codes.Internal, "bug"), 1},
		"ForeignPrecondtion": {status.Error(codes.FailedPrecondition, "closed account"), 1},
	} {
		t.Run(name, func(t *testing.T) {
			svc := &invoices{failures: []error{tt.err}}
			_, err := client(t, svc).CreateInvoice(t.Context(), request())
			if svc.runs.Load() != tt.runs {
				t.Fatalf("%d runs, want %d (last error %v)", svc.runs.Load(), tt.runs, err)
			}
			if tt.runs == 2 && err != nil {
				t.Fatalf("the retry failed: %v", err)
			}
		})
	}
}

func TestCapsAttempts(t *testing.T) {
	t.Parallel()
	unavailable := typed(errcode.Unavailable, 0)
	svc := &invoices{failures: []error{unavailable, unavailable, unavailable, unavailable, unavailable, unavailable, unavailable}}
	_, err := client(t, svc).CreateInvoice(t.Context(), request())
	if ledgerstatus.FromError(err).Code != errcode.Unavailable || svc.runs.Load() != 5 {
		t.Fatalf("%d runs ending in %v; want 5 (the default) ending in UNAVAILABLE", svc.runs.Load(), err)
	}
	svc = &invoices{failures: []error{unavailable, unavailable, unavailable}}
	if _, err := client(t, svc, idemclient.WithMaxAttempts(2)).CreateInvoice(t.Context(), request()); err == nil || svc.runs.Load() != 2 {
		t.Fatalf("WithMaxAttempts(2): %d runs, %v", svc.runs.Load(), err)
	}
}

func TestStopsAtTheDeadline(t *testing.T) {
	t.Parallel()
	unavailable := typed(errcode.Unavailable, 0) // no hint: the backoff alone paces the retries
	svc := &invoices{failures: slices.Repeat([]error{unavailable}, 100)}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client(t, svc, idemclient.WithMaxAttempts(100)).CreateInvoice(ctx, request())
	if status.Code(err) != codes.DeadlineExceeded || time.Since(start) > 5*time.Second || svc.runs.Load() < 2 {
		t.Fatalf("after %v and %d runs: %v; want retries, then DEADLINE_EXCEEDED at the deadline", time.Since(start), svc.runs.Load(), err)
	}
}

// TestHintPastTheDeadlineAnswersAtOnce: when the server says IN_PROGRESS,
// retry after 2 s, and the call has 500 ms left, the caller gets the typed
// IN_PROGRESS at once, not DEADLINE_EXCEEDED after a useless wait.
func TestHintPastTheDeadlineAnswersAtOnce(t *testing.T) {
	t.Parallel()
	svc := &invoices{failures: []error{typed(errcode.InProgress, 2*time.Second)}}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client(t, svc).CreateInvoice(ctx, request())
	le := ledgertest.WantStatus(t, err, errcode.InProgress)
	if took := time.Since(start); took > 250*time.Millisecond || le.RetryAfter != 2*time.Second || svc.runs.Load() != 1 {
		t.Fatalf("after %v and %d runs: %+v; want IN_PROGRESS with its 2s hint at once", took, svc.runs.Load(), le)
	}
}

// TestIntentKey: calls in one intent share a key (and get one invoice);
// calls without an intent each get a key of their own.
func TestIntentKey(t *testing.T) {
	t.Parallel()
	svc := &invoices{}
	c := client(t, svc)
	ctx := idemclient.WithIntent(t.Context())
	a, err := c.CreateInvoice(ctx, request())
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateInvoice(ctx, request())
	if err != nil || a.GetInvoice().GetId() != b.GetInvoice().GetId() || svc.runs.Load() != 1 {
		t.Fatalf("one intent: %v then %v (%v), %d runs", a, b, err, svc.runs.Load())
	}
	key, _ := idemclient.KeyFromContext(ctx)
	if svc.seen[0].key != key {
		t.Fatalf("the service saw key %q, the intent has %q", svc.seen[0].key, key)
	}
	for range 2 {
		if _, err := c.CreateInvoice(t.Context(), request()); err != nil {
			t.Fatal(err)
		}
	}
	if svc.runs.Load() != 3 {
		t.Fatalf("two calls without an intent ran %d times in all, want 3", svc.runs.Load())
	}
}

// TestKeyField: with WithKeyField the key goes into request_id when it is
// empty and is taken from it when the caller set it.
func TestKeyField(t *testing.T) {
	t.Parallel()
	svc := &invoices{}
	c := client(t, svc, idemclient.WithKeyField("request_id"))
	req := request()
	if _, err := c.CreateInvoice(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	if req.GetRequestId() == "" || svc.seen[0].key != req.GetRequestId() {
		t.Fatalf("request_id %q, the service saw %q", req.GetRequestId(), svc.seen[0].key)
	}
	mine := request()
	mine.RequestId = "0193c6f4-my-own-key"
	if _, err := c.CreateInvoice(idemclient.WithIntent(t.Context()), mine); err != nil {
		t.Fatal(err)
	}
	if svc.seen[1].key != "0193c6f4-my-own-key" {
		t.Fatalf("the service saw %q, want the request's own key", svc.seen[1].key)
	}
}

// TestParallelDuplicatesConverge: 50 goroutines retry one intent at once;
// the handler runs once and every one of them gets that invoice.
func TestParallelDuplicatesConverge(t *testing.T) {
	t.Parallel()
	svc := &invoices{hold: 100 * time.Millisecond}
	c := client(t, svc, idemclient.WithMaxAttempts(50))
	ctx := idemclient.WithIntent(t.Context())
	var wg sync.WaitGroup
	ids := make([]string, 50)
	errs := make([]error, 50)
	for i := range 50 {
		wg.Go(func() {
			res, err := c.CreateInvoice(ctx, request())
			ids[i], errs[i] = res.GetInvoice().GetId(), err
		})
	}
	wg.Wait()
	for i := range 50 {
		if errs[i] != nil || ids[i] != "inv_1" {
			t.Fatalf("caller %d: %q, %v", i, ids[i], errs[i])
		}
	}
	if svc.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times", svc.runs.Load())
	}
}

func TestNewKey(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		k := idemclient.NewKey()
		if seen[k] || len(k) != 36 || ledger.ValidateKey(k, ledger.MaxKeyBytes) != nil {
			t.Fatalf("NewKey = %q: repeated or not a valid key", k)
		}
		seen[k] = true
	}
}

// TestWithMethods: a method not listed gets neither a key nor retries.
func TestWithMethods(t *testing.T) {
	t.Parallel()
	svc := &invoices{failures: []error{typed(errcode.Unavailable, 0)}}
	c := client(t, svc, idemclient.WithMethods("/some.v1.Other/Method"))
	_, err := c.CreateInvoice(t.Context(), request())
	if ledgerstatus.FromError(err).Code != errcode.KeyMissing || svc.runs.Load() != 0 {
		t.Fatalf("an unlisted method: %v after %d runs; want KEY_MISSING from the server, no key sent", err, svc.runs.Load())
	}
	svc = &invoices{failures: []error{typed(errcode.Unavailable, 0)}}
	c = client(t, svc, idemclient.WithMethods(createInvoice))
	if _, err := c.CreateInvoice(t.Context(), request()); err != nil || svc.runs.Load() != 2 {
		t.Fatalf("a listed method: %v after %d runs; want a retry with a key", err, svc.runs.Load())
	}
}
