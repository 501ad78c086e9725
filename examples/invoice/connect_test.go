package invoice_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/connectguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestConnectFenced serves CreateInvoice over connect-go behind
// connectguard, its invoices on PostgreSQL with the fence. The first
// attempt commits its invoice and dies before Complete; once its lease
// ran out, the retry finds the fence: the first invoice, answered as a
// replay, one row.
func TestConnectFenced(t *testing.T) {
	db, err := invoice.OpenPostgres(t.Context(), pgtest.NewDatabase(t))
	if err == nil {
		err = db.Migrate(t.Context())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	var runs atomic.Int64 // the handler goroutine writes; the test reads after its answer came over the network
	svc := &invoice.Service{Store: db, AfterWrite: func(ctx context.Context) {
		runs.Add(1)
		if c, _ := guard.ClaimFromContext(ctx); c.Attempt == 1 {
			panic(http.ErrAbortHandler) // the process dies after the invoice row committed
		}
	}}
	clock := ledgertest.NewClock(time.Now())
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("billing", clock.Now))).Dial(t)))
	if err != nil {
		t.Fatal(err)
	}
	icpt, err := connectguard.New(g,
		connectguard.WithProcedure[invoicev1.CreateInvoiceResponse](invoice.CreateInvoiceMethod,
			connectguard.Procedure{Policy: guard.Policy{Lease: 200 * time.Millisecond, Fence: db.Fence()}}),
		connectguard.WithKeyField("request_id"),
		connectguard.WithTenant(func(_ context.Context, req connect.AnyRequest) (string, error) {
			return req.Any().(*invoicev1.CreateInvoiceRequest).GetTenant(), nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	method := invoicev1.File_idemledger_examples_invoice_v1_invoice_proto.Services().ByName("InvoiceService").Methods().ByName("CreateInvoice")
	mux := http.NewServeMux()
	mux.Handle(invoice.CreateInvoiceMethod, connect.NewUnaryHandler(invoice.CreateInvoiceMethod,
		func(ctx context.Context, req *connect.Request[invoicev1.CreateInvoiceRequest]) (*connect.Response[invoicev1.CreateInvoiceResponse], error) {
			res, err := svc.CreateInvoice(ctx, req.Msg)
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(res), nil
		},
		connect.WithSchema(method), connect.WithInterceptors(icpt)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	client := connect.NewClient[invoicev1.CreateInvoiceRequest, invoicev1.CreateInvoiceResponse](srv.Client(), srv.URL+invoice.CreateInvoiceMethod)
	req := connect.NewRequest(&invoicev1.CreateInvoiceRequest{RequestId: "k-1", Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: 3, UnitAmountMicros: 14_000_000}}})
	if res, err := client.CallUnary(t.Context(), req); err == nil {
		t.Fatalf("the crashing attempt answered %v", res.Msg)
	}
	clock.Advance(300 * time.Millisecond) // its lease runs out
	res, err := client.CallUnary(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Rows(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || runs.Load() != 1 || !proto.Equal(res.Msg.GetInvoice(), rows[0].Invoice) || res.Header().Get(connectguard.ReplayedHeader) != "true" {
		t.Fatalf("the retry: %v (replayed %q), %d rows, %d runs; want the committed invoice replayed, once", res.Msg, res.Header().Get(connectguard.ReplayedHeader), len(rows), runs.Load())
	}
}
