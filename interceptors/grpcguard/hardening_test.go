package grpcguard_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/syncbuf"
	"github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestOutcomeTooLargeNeverRunsTwice: an answer the ledger cannot keep
// (over its outcome limit, or over its gRPC receive limit, or over the
// interceptor's own limit) reaches the caller of that attempt, and every
// retry gets a typed, permanent OUTCOME_TOO_LARGE that says the call ran:
// the handler never runs a second time, also after the lease ran out.
func TestOutcomeTooLargeNeverRunsTwice(t *testing.T) {
	t.Parallel()
	// The ledger keeps 64 KiB and its gRPC server takes 128 KiB (ledgerd's
	// limits are the same shape: the outcome plus 64 KiB).
	const limit = 64 << 10
	for name, tt := range map[string]struct {
		memo int            // bytes of the answer's memo
		opts []guard.Option // the guard's own limit
	}{
		"OverTheLedgersLimit":        {memo: limit + 1000}, // the ledger's typed refusal
		"OverTheLedgersReceiveLimit": {memo: 4 * limit},    // gRPC's refusal, untyped on the wire
		"OverTheInterceptorsLimit":   {memo: 2 << 10, opts: []guard.Option{guard.WithMaxOutcomeBytes(1 << 10)}},
		"UnderEveryLimit":            {memo: 1 << 10}, // the control: replayed
	} {
		t.Run(name, func(t *testing.T) {
			forEachAPI(t, func(t *testing.T, api ledgerAPI) {
				auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
					return server.Principal{Namespace: "billing", Tenants: []string{"*"}}, nil
				})
				clock := ledgertest.NewClock(time.Now())
				srv := server.New(ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{MaxOutcomeBytes: limit}), server.Config{Auth: auth})
				conn := servertest.NewServer(t, servertest.Ledger(srv), grpc.MaxRecvMsgSize(2*limit)).Dial(t)
				svc := &invoices{create: func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
					res := written(n, req)
					res.Invoice.CustomerId = strings.Repeat("x", tt.memo)
					return res, nil
				}}
				g := newGuard(t, api.client(t, conn), tt.opts...)
				client := serveGuard(t, g, svc, protect(grpcguard.Method{Policy: guard.Policy{Lease: 200 * time.Millisecond}})...)
				res, err := client.CreateInvoice(t.Context(), request("big"))
				if err != nil || len(res.GetInvoice().GetCustomerId()) != tt.memo {
					t.Fatalf("the first attempt: %v; want its real answer", err)
				}
				clock.Advance(300 * time.Millisecond) // past the lease
				if tt.memo == 1<<10 {
					again, err := client.CreateInvoice(t.Context(), request("big"))
					if err != nil || again.GetInvoice().GetId() != res.GetInvoice().GetId() || svc.runs.Load() != 1 {
						t.Fatalf("a small answer: %v, %v; want it replayed", again, err)
					}
					return
				}
				for range 2 {
					_, err = client.CreateInvoice(t.Context(), request("big"))
					le := ledgertest.WantStatus(t, err, errcode.OutcomeTooLarge)
					if le.Retryable() || le.Metadata["applied"] != "true" || !strings.Contains(le.Message, "the call ran") {
						t.Fatalf("a retry got %+v; want a permanent OUTCOME_TOO_LARGE that says the call ran", le)
					}
				}
				if n := svc.runs.Load(); n != 1 {
					t.Fatalf("the handler ran %d times, want 1", n)
				}
				look, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "big"})
				if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_COMPLETED {
					t.Fatalf("the record = %v, %v; want COMPLETED", look, err)
				}
			})
		})
	}
}

// TestFailClosedIsOneAnswer: with the ledger down, a protected call gets
// the same answer (UNAVAILABLE, its message, a 1 s retry-after) and the
// service logs one line, whether the interceptor calls the ledger with
// unary calls or over a Stream; the handler does not run.
func TestFailClosedIsOneAnswer(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	_ = lis.Close() // nothing listens there now
	answers := map[ledgerAPI]string{}
	forEachAPI(t, func(t *testing.T, api ledgerAPI) {
		conn, err := grpc.NewClient(down, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		var logs syncbuf.Buffer
		svc := &invoices{}
		g := newGuard(t, api.client(t, conn), guard.WithLogger(slog.New(slog.NewJSONHandler(&logs, nil))))
		client := serveGuard(t, g, svc, protect(grpcguard.Method{Policy: guard.Policy{}})...)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err = client.CreateInvoice(ctx, request("k"))
		le := ledgertest.WantStatus(t, err, errcode.Unavailable)
		if !le.Retryable() || le.RetryAfter != time.Second {
			t.Fatalf("%+v: want retryable after 1s", le)
		}
		answers[api] = fmt.Sprintf("%s %q %s", le.Code, le.Message, le.RetryAfter)
		if n := strings.Count(logs.String(), "failing closed"); n != 1 {
			t.Fatalf("%d log lines, want 1:\n%s", n, logs.String())
		}
		if svc.runs.Load() != 0 {
			t.Fatal("the handler ran without a claim")
		}
	})
	if answers[unaryAPI] != answers[streamAPI] {
		t.Fatalf("unary: %s; stream: %s; want one answer", answers[unaryAPI], answers[streamAPI])
	}
}
