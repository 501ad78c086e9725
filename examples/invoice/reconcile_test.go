package invoice_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestReconcileAfterACrash: the handler writes its invoice and crashes
// before the ledger hears of it. The retry takes over once the lease ran
// out; with the service's Reconcile, the interceptor finds the row by key
// and answers with it: one row, the handler ran once, and the store had
// no fence. Without Reconcile (the control), the unfenced store gets a
// second row.
func TestReconcileAfterACrash(t *testing.T) {
	for name, reconcile := range map[string]bool{"Reconciled": true, "NotReconciled": false} {
		t.Run(name, func(t *testing.T) {
			store := invoice.NewStore()
			store.Unfenced = true
			svc := &invoice.Service{Store: store}
			var runs int
			svc.AfterWrite = func(ctx context.Context) {
				runs++
				if c, _ := guard.ClaimFromContext(ctx); c.Attempt == 1 {
					panic("the process dies after the invoice row committed")
				}
			}
			policy := grpcguard.Method{Policy: guard.Policy{Lease: 200 * time.Millisecond}}
			if reconcile {
				policy.Reconcile = svc.Reconcile
			}
			clock := ledgertest.NewClock(time.Now())
			client := invoiceClient(t, svc, policy, clock.Now)
			req := &invoicev1.CreateInvoiceRequest{
				RequestId: "k-1", Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
				LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: 3, UnitAmountMicros: 14_000_000}},
			}
			if _, err := client.CreateInvoice(t.Context(), req); status.Code(err) != codes.Internal {
				t.Fatalf("the crashing attempt = %v", err)
			}
			clock.Advance(300 * time.Millisecond) // its lease runs out
			res, err := client.CreateInvoice(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			rows := store.Rows()
			if !reconcile {
				if len(rows) != 2 || runs != 2 {
					t.Fatalf("without Reconcile: %d rows, %d runs; want the duplicate an unfenced store suffers", len(rows), runs)
				}
				return
			}
			if len(rows) != 1 || runs != 1 || !proto.Equal(res.GetInvoice(), rows[0].Invoice) {
				t.Fatalf("reconciled: %d rows, %d runs, answer %v; want the first row, once", len(rows), runs, res)
			}
			again, err := client.CreateInvoice(t.Context(), req)
			if err != nil || !proto.Equal(again, res) || len(store.Rows()) != 1 {
				t.Fatalf("the replay: %v, %v", again, err)
			}
		})
	}
}

// invoiceClient serves svc behind the interceptor with policy on
// CreateInvoice, against a LedgerService on the memory store whose clock
// is now.
func invoiceClient(t *testing.T, svc *invoice.Service, policy grpcguard.Method, now func() time.Time) invoicev1.InvoiceServiceClient {
	t.Helper()
	ledgerConn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("billing", now))).Dial(t)
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(ledgerConn))
	if err != nil {
		t.Fatal(err)
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod(invoice.CreateInvoiceMethod, policy), grpcguard.WithKeyField("request_id"))
	if err != nil {
		t.Fatal(err)
	}
	recovered := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (_ any, err error) {
		defer func() {
			if recover() != nil {
				err = status.Error(codes.Internal, "internal error")
			}
		}()
		return h(ctx, req)
	}
	conn := servertest.NewServer(t, func(gs *grpc.Server) { invoicev1.RegisterInvoiceServiceServer(gs, svc) },
		grpc.ChainUnaryInterceptor(recovered, icpt)).Dial(t)
	return invoicev1.NewInvoiceServiceClient(conn)
}
