package grpcguard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	testpb "github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server/servertest"
)

// The policies (WAIT, REJECT, HOLD and its resolution), end to end: a
// write service behind the interceptor, over gRPC, calling a real
// LedgerService (the server package on the memory store), through both
// ledger APIs.

// gated is a handler whose write waits for open, and that answers
// UNAVAILABLE (transient) on the runs that fail says: a duplicate
// arrives, and waits or is refused, while the first attempt runs.
func gated(open <-chan struct{}, fail func(n int64) bool) func(context.Context, int64, *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
	return func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		<-open
		if fail != nil && fail(n) {
			return nil, status.Error(codes.Unavailable, "the invoice database is failing over")
		}
		return written(n, req), nil
	}
}

// waitedLedger is ledgerConn with its ledger, whose waiting duplicates a
// test counts (Waiters).
func waitedLedger(t *testing.T) (*grpc.ClientConn, *ledger.Ledger) {
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	return servertest.NewServer(t, servertest.Ledger(servertest.LedgerServer("billing", l))).Dial(t), l
}

// answers are the answers to a call and its duplicate.
type answers struct {
	first, dup       *testpb.CreateInvoiceResponse
	firstErr, dupErr error
	header           metadata.MD // the duplicate's
}

// duplicate calls CreateInvoice with req and, once svc's handler runs it
// (the first attempt holds the claim), again with ctx. The first
// attempt's write (gated on open) goes on once the duplicate waits in
// waitsIn or, when waitsIn is nil, once the duplicate is answered.
func duplicate(ctx context.Context, t *testing.T, client testpb.InvoiceServiceClient, svc *invoices, req *testpb.CreateInvoiceRequest, open chan<- struct{}, waitsIn *ledger.Ledger) answers {
	t.Helper()
	var a answers
	var first, dup sync.WaitGroup
	first.Go(func() { a.first, a.firstErr = client.CreateInvoice(t.Context(), req) })
	<-svc.firstRun()
	dup.Go(func() { a.dup, a.dupErr = client.CreateInvoice(ctx, req, grpc.Header(&a.header)) })
	if waitsIn != nil {
		ledgertest.Eventually(t, 10*time.Second, func() bool { return waitsIn.Waiters() == 1 }, "the duplicate waits in the ledger")
	} else {
		dup.Wait()
	}
	close(open)
	dup.Wait()
	first.Wait()
	return a
}

// TestWaitReplaysTheFirstOutcome: under the zero policy (WAIT is the
// default, on gRPC as on every transport) a duplicate of a running
// attempt gets that attempt's answer, replayed.
func TestWaitReplaysTheFirstOutcome(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testWaitReplaysTheFirstOutcome)
}

func testWaitReplaysTheFirstOutcome(t *testing.T, api ledgerAPI) {
	open := make(chan struct{})
	svc := &invoices{create: gated(open, nil)}
	conn, l := waitedLedger(t)
	client := serve(t, api.client(t, conn), svc, protect(grpcguard.Method{})...)
	a := duplicate(t.Context(), t, client, svc, request("k"), open, l)
	first, dup, err1, err2, header := a.first, a.dup, a.firstErr, a.dupErr, a.header
	if err1 != nil || err2 != nil {
		t.Fatalf("first: %v; duplicate: %v", err1, err2)
	}
	if d := cmp.Diff(first, dup, protocmp.Transform()); d != "" {
		t.Fatalf("the duplicate's answer (-first +duplicate):\n%s", d)
	}
	if got := header.Get(grpcguard.ReplayedHeader); len(got) != 1 || got[0] != "true" {
		t.Fatalf("replayed header = %v", got)
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

func TestWaitClaimsWhenTheFirstReleases(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testWaitClaimsWhenTheFirstReleases)
}

func testWaitClaimsWhenTheFirstReleases(t *testing.T, api ledgerAPI) {
	open := make(chan struct{})
	svc := &invoices{create: gated(open, func(n int64) bool { return n == 1 })}
	conn, l := waitedLedger(t)
	client := serve(t, api.client(t, conn), svc, protect(grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Wait}})...)
	a := duplicate(t.Context(), t, client, svc, request("k"), open, l)
	dup, err1, err2, header := a.dup, a.firstErr, a.dupErr, a.header
	if status.Code(err1) != codes.Unavailable {
		t.Fatalf("first = %v, want its handler's UNAVAILABLE", err1)
	}
	if err2 != nil || dup.GetInvoice().GetNumber() != 2 || len(header.Get(grpcguard.ReplayedHeader)) != 0 {
		t.Fatalf("duplicate = %v, %v (header %v); want a fresh run of its own", dup, err2, header)
	}
}

func TestWaitIsBounded(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testWaitIsBounded)
}

func testWaitIsBounded(t *testing.T, api ledgerAPI) {
	for name, tt := range map[string]struct {
		policy grpcguard.Method
		ctx    func() (context.Context, context.CancelFunc)
	}{
		"ByMaxWait": {
			policy: grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Wait, MaxWait: 200 * time.Millisecond}},
			ctx:    func() (context.Context, context.CancelFunc) { return context.WithCancel(t.Context()) },
		},
		"ByTheCallersDeadline": {
			policy: grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Wait}},
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(t.Context(), 300*time.Millisecond)
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			open := make(chan struct{})
			svc := &invoices{create: gated(open, nil)}
			client := serve(t, api.client(t, ledgerConn(t)), svc, protect(tt.policy)...)
			ctx, cancel := tt.ctx()
			defer cancel()
			a := duplicate(ctx, t, client, svc, request("k"), open, nil)
			err1, err2 := a.firstErr, a.dupErr
			if err1 != nil {
				t.Fatal(err1)
			}
			// IN_PROGRESS, retryable with a hint, before the caller's
			// deadline: not DEADLINE_EXCEEDED.
			if le := ledgertest.WantStatus(t, err2, errcode.InProgress); !le.Retryable() || le.RetryAfter <= 0 {
				t.Fatalf("IN_PROGRESS retryable=%v retry-after=%v", le.Retryable(), le.RetryAfter)
			}
		})
	}
}

func TestRejectAnswersAtOnce(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testRejectAnswersAtOnce)
}

func testRejectAnswersAtOnce(t *testing.T, api ledgerAPI) {
	open := make(chan struct{})
	svc := &invoices{create: gated(open, nil)}
	client := serve(t, api.client(t, ledgerConn(t)), svc, protect(grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Reject, Lease: 5 * time.Second}})...)
	a := duplicate(t.Context(), t, client, svc, request("k"), open, nil)
	if a.firstErr != nil {
		t.Fatal(a.firstErr)
	}
	le := ledgertest.WantStatus(t, a.dupErr, errcode.InProgress)
	// The hint is the time left on the lease, capped by the ledger (2 s).
	if le.RetryAfter < time.Second || le.RetryAfter > 5*time.Second {
		t.Fatalf("retry-after %v, want the lease's time left, capped", le.RetryAfter)
	}
}

// resolvable sets up a HOLD method whose first attempt crashes after its
// write: its record turns OUTCOME_UNKNOWN when the lease runs out.
func resolvable(t *testing.T, api ledgerAPI) (client testpb.InvoiceServiceClient, ops ledgerv1.LedgerServiceClient, svc *invoices) {
	t.Helper()
	conn, clock := clockedLedger(t)
	svc = &invoices{create: func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		if n == 1 {
			panic("the process dies after the provider charged the card")
		}
		return written(n, req), nil
	}}
	client = serve(t, api.client(t, conn), svc, protect(grpcguard.Method{Policy: guard.Policy{Lease: 200 * time.Millisecond, OnLeaseExpiry: guard.Hold}})...)
	if _, err := client.CreateInvoice(t.Context(), request("k")); status.Code(err) != codes.Internal {
		t.Fatalf("the crashing attempt = %v", err)
	}
	clock.Advance(300 * time.Millisecond)
	for range 2 {
		_, err := client.CreateInvoice(t.Context(), request("k"))
		le := ledgertest.WantStatus(t, err, errcode.OutcomeUnknown)
		if le.Retryable() || le.Metadata["attempt"] != "1" || le.Metadata["leaseExpiredAt"] == "" {
			t.Fatalf("OUTCOME_UNKNOWN retryable=%v metadata=%v", le.Retryable(), le.Metadata)
		}
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times under HOLD, want 1", n)
	}
	return client, ledgerv1.NewLedgerServiceClient(conn), svc
}

func TestHoldThenResolveApplied(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testHoldThenResolveApplied)
}

func testHoldThenResolveApplied(t *testing.T, api ledgerAPI) {
	client, ops, svc := resolvable(t, api)
	// An operator finds the charge at the provider and settles the key
	// with the answer the write would have given.
	settled := written(7, request("k"))
	value, err := proto.MarshalOptions{Deterministic: true}.Marshal(settled)
	if err != nil {
		t.Fatal(err)
	}
	applied := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{
		TypeUrl: "type.googleapis.com/idemledger.testing.v1.CreateInvoiceResponse", Value: value,
	}}}
	if _, err := ops.Resolve(t.Context(), &ledgerv1.ResolveRequest{Tenant: "acme", Key: "k", Resolution: &ledgerv1.ResolveRequest_Applied{Applied: applied}}); err != nil {
		t.Fatal(err)
	}
	var header metadata.MD
	res, err := client.CreateInvoice(t.Context(), request("k"), grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(settled, res, protocmp.Transform()); d != "" || len(header.Get(grpcguard.ReplayedHeader)) != 1 {
		t.Fatalf("after Resolve(applied) (-settled +got):\n%s (header %v)", d, header)
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	// A settled record is not resolved twice.
	_, err = ops.Resolve(t.Context(), &ledgerv1.ResolveRequest{Tenant: "acme", Key: "k", Resolution: &ledgerv1.ResolveRequest_NotApplied{NotApplied: &ledgerv1.NotApplied{}}})
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)
}

func TestHoldThenResolveNotApplied(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testHoldThenResolveNotApplied)
}

func testHoldThenResolveNotApplied(t *testing.T, api ledgerAPI) {
	client, ops, svc := resolvable(t, api)
	if _, err := ops.Resolve(t.Context(), &ledgerv1.ResolveRequest{Tenant: "acme", Key: "k", Resolution: &ledgerv1.ResolveRequest_NotApplied{NotApplied: &ledgerv1.NotApplied{}}}); err != nil {
		t.Fatal(err)
	}
	res, err := client.CreateInvoice(t.Context(), request("k"))
	if err != nil || res.GetInvoice().GetNumber() != 2 || svc.runs.Load() != 2 {
		t.Fatalf("after Resolve(not_applied): %v, %v, %d runs; want a fresh claim that runs", res, err, svc.runs.Load())
	}
}

// ledgerRows is the write service's own database: invoices by key, as the
// example invoice service keeps them.
type ledgerRows struct {
	mu   sync.Mutex
	rows map[string]*testpb.CreateInvoiceResponse
}

func (db *ledgerRows) put(key string, r *testpb.CreateInvoiceResponse) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.rows[key] = r
}

func (db *ledgerRows) get(key string) *testpb.CreateInvoiceResponse {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.rows[key]
}

func TestReconcile(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testReconcile)
}

func testReconcile(t *testing.T, api ledgerAPI) {
	db := &ledgerRows{rows: map[string]*testpb.CreateInvoiceResponse{}}
	var down bool // the service's database cannot answer
	var mu sync.Mutex
	svc := &invoices{create: func(ctx context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
		c, _ := guard.ClaimFromContext(ctx)
		res := written(n, req)
		if req.GetCustomerId() != "cus_unwritten" {
			db.put(c.Key, res)
		}
		if c.Attempt == 1 {
			panic("the process dies after its write, before Complete")
		}
		return res, nil
	}}
	reconcile := func(ctx context.Context, _ proto.Message) (proto.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return nil, errors.New("the invoice database is unreachable")
		}
		c, _ := guard.ClaimFromContext(ctx)
		if r := db.get(c.Key); r != nil {
			return r, nil
		}
		return nil, nil
	}
	policy := grpcguard.Method{Policy: guard.Policy{Lease: 200 * time.Millisecond}, Reconcile: reconcile}
	conn, clock := clockedLedger(t)
	client := serve(t, api.client(t, conn), svc, protect(policy)...)

	// Applied: the retry is answered from the service's own row, and the
	// handler does not run again; no fence was needed.
	if _, err := client.CreateInvoice(t.Context(), request("k")); status.Code(err) != codes.Internal {
		t.Fatalf("the crashing attempt = %v", err)
	}
	clock.Advance(300 * time.Millisecond)
	var header metadata.MD
	res, err := client.CreateInvoice(t.Context(), request("k"), grpc.Header(&header))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(db.get("k"), res, protocmp.Transform()); d != "" || svc.runs.Load() != 1 {
		t.Fatalf("reconciled answer (-row +got):\n%s; %d runs", d, svc.runs.Load())
	}
	again, err := client.CreateInvoice(t.Context(), request("k"))
	if err != nil || !proto.Equal(again, res) || svc.runs.Load() != 1 {
		t.Fatalf("the replay after reconcile: %v, %v, %d runs", again, err, svc.runs.Load())
	}

	// Not applied: the crash came before the write; the takeover runs.
	unwritten := request("k2")
	unwritten.CustomerId = "cus_unwritten"
	if _, err := client.CreateInvoice(t.Context(), unwritten); status.Code(err) != codes.Internal {
		t.Fatalf("the crashing attempt = %v", err)
	}
	clock.Advance(300 * time.Millisecond)
	res, err = client.CreateInvoice(t.Context(), unwritten)
	if err != nil || res.GetInvoice().GetNumber() != 3 || svc.runs.Load() != 3 {
		t.Fatalf("not applied: %v, %v, %d runs; want the handler to run", res, err, svc.runs.Load())
	}

	// Cannot tell: UNAVAILABLE, retryable, and the handler does not run;
	// once the database answers, the retry reconciles.
	if _, err := client.CreateInvoice(t.Context(), request("k3")); status.Code(err) != codes.Internal {
		t.Fatalf("the crashing attempt = %v", err)
	}
	clock.Advance(300 * time.Millisecond)
	mu.Lock()
	down = true
	mu.Unlock()
	_, err = client.CreateInvoice(t.Context(), request("k3"))
	if le := ledgertest.WantStatus(t, err, errcode.Unavailable); !le.Retryable() || svc.runs.Load() != 4 {
		t.Fatalf("cannot tell: retryable=%v, %d runs", le.Retryable(), svc.runs.Load())
	}
	mu.Lock()
	down = false
	mu.Unlock()
	clock.Advance(300 * time.Millisecond) // the claim left to run out
	res, err = client.CreateInvoice(t.Context(), request("k3"))
	if err != nil || !proto.Equal(res, db.get("k3")) || svc.runs.Load() != 4 {
		t.Fatalf("after the database came back: %v, %v, %d runs", res, err, svc.runs.Load())
	}
}

func TestTombstoneIsKeyExpired(t *testing.T) {
	t.Parallel()
	forEachAPI(t, testTombstoneIsKeyExpired)
}

func testTombstoneIsKeyExpired(t *testing.T, api ledgerAPI) {
	conn, clock := clockedLedger(t)
	svc := &invoices{}
	client := serve(t, api.client(t, conn), svc, protect(grpcguard.Method{Policy: guard.Policy{Lease: 100 * time.Millisecond, Retention: 300 * time.Millisecond}})...)
	if _, err := client.CreateInvoice(t.Context(), request("k")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(400 * time.Millisecond)
	_, err := client.CreateInvoice(t.Context(), request("k"))
	if le := ledgertest.WantStatus(t, err, errcode.KeyExpired); le.Retryable() {
		t.Fatal("KEY_EXPIRED is retryable")
	}
	changed := request("k")
	changed.Currency = "USD"
	_, err = client.CreateInvoice(t.Context(), changed)
	ledgertest.WantStatus(t, err, errcode.KeyReused)
	rec, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
	if err != nil || rec.GetRecord().GetState() != ledgerv1.State_STATE_EXPIRED || rec.GetRecord().GetOutcome() != nil {
		t.Fatalf("Lookup of a tombstone = %v, %v; want EXPIRED without an outcome", rec, err)
	}
	if n := svc.runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}

	// With tombstones off, the key is free again after the retention.
	off := serve(t, api.client(t, conn), svc, protect(grpcguard.Method{Policy: guard.Policy{Lease: 100 * time.Millisecond, Retention: 300 * time.Millisecond, NoTombstones: true}})...)
	if _, err := off.CreateInvoice(t.Context(), request("k-off")); err != nil {
		t.Fatal(err)
	}
	clock.Advance(400 * time.Millisecond)
	if res, err := off.CreateInvoice(t.Context(), request("k-off")); err != nil || svc.runs.Load() != 3 {
		t.Fatalf("without tombstones: %v, %v, %d runs", res, err, svc.runs.Load())
	}
}
