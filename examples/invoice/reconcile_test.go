package invoice_test

import (
	"context"
	"sync/atomic"
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
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestACrashAfterTheCommit: the handler writes its invoice and crashes
// before the ledger hears of it. The retry takes over once the lease ran
// out. On PostgreSQL with the fence, the takeover finds the fence and
// answers with the first invoice; in memory, the service's Reconcile
// finds the row by key. Either way: one row, the handler ran once. Without
// either (the controls), the retry writes a second row.
func TestACrashAfterTheCommit(t *testing.T) {
	for _, tt := range []struct {
		name                       string
		postgres, fence, reconcile bool
		rows                       int
	}{
		{name: "Fenced", postgres: true, fence: true, rows: 1},
		{name: "Reconciled", reconcile: true, rows: 1},
		{name: "NeitherOnPostgres", postgres: true, rows: 2},
		{name: "NeitherInMemory", rows: 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			policy := grpcguard.Method{Policy: guard.Policy{Lease: 200 * time.Millisecond}}
			svc := &invoice.Service{}
			if tt.postgres {
				db, err := invoice.OpenPostgres(t.Context(), pgtest.NewDatabase(t))
				if err == nil {
					err = db.Migrate(t.Context())
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(db.Close)
				db.Unfenced = !tt.fence
				if tt.fence {
					policy.Policy.Fence = db.Fence()
				}
				svc.Store = db
			} else {
				store := invoice.NewStore()
				store.Unfenced = true
				svc.Store = store
			}
			if tt.reconcile {
				policy.Reconcile = svc.Reconcile
			}
			var runs atomic.Int64 // the handler goroutine writes; the test reads after its answer came over the network
			svc.AfterWrite = func(ctx context.Context) {
				runs.Add(1)
				if c, _ := guard.ClaimFromContext(ctx); c.Attempt == 1 {
					panic("the process dies after the invoice row committed")
				}
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
			rows, err := svc.Store.Rows(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(rows) != tt.rows || runs.Load() != int64(tt.rows) {
				t.Fatalf("%d rows, %d runs; want %d", len(rows), runs.Load(), tt.rows)
			}
			if tt.rows == 2 {
				return
			}
			if !proto.Equal(res.GetInvoice(), rows[0].Invoice) {
				t.Fatalf("the retry answered %v; want the first row's invoice", res)
			}
			again, err := client.CreateInvoice(t.Context(), req)
			if rows, _ := svc.Store.Rows(t.Context()); err != nil || !proto.Equal(again, res) || len(rows) != 1 {
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

func TestMain(m *testing.M) { pgtest.Main(m) }
