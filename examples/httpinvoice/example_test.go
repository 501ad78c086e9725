package httpinvoice_test

import (
	"fmt"
	"log"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

var createInvoiceHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusCreated) })

// An HTTP API protects POST /v1/invoices: the README shows part of this
// function's body (a test keeps the two alike).
func Example() {
	conn, err := grpc.NewClient("127.0.0.1:7070", append(ledgerclient.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	defer ledger.Close()

	g, err := guard.New(ledger)
	if err != nil {
		log.Fatal(err)
	}

	// g is the guard, as above. The route is the ServeMux pattern; the key
	// is the Idempotency-Key header, the tenant the X-Tenant header.
	hg, err := httpguard.New(g,
		httpguard.WithRoute("POST /v1/invoices", httpguard.Route{Policy: guard.Policy{Lease: 30 * time.Second}}),
		httpguard.WithTenant(httpguard.TenantFromHeader("X-Tenant")))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/invoices", hg.Middleware(createInvoiceHandler))
	fmt.Println("protected")
	// Output: protected
}
