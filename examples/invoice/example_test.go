package invoice_test

import (
	"fmt"
	"log"
	"os"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// A write service protects CreateInvoice: the README shows this function's
// body (a test keeps the two alike). Nothing is dialed until the first call.
func Example() {
	// The ledger: ledgerd's address, its transport settings, and this
	// service's bearer token on the stream that carries the ledger's calls.
	conn, err := grpc.NewClient("127.0.0.1:7070", append(ledgerclient.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn),
		ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+os.Getenv("LEDGER_TOKEN"))))
	defer ledger.Close()

	// CreateInvoice is protected: the key is the request's request_id
	// (AIP-155), the tenant its tenant field.
	g, err := guard.New(ledger)
	if err != nil {
		log.Fatal(err)
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod(invoice.CreateInvoiceMethod,
			grpcguard.Method{Policy: guard.Policy{Lease: 30 * time.Second, Retention: 24 * time.Hour}}),
		grpcguard.WithKeyField("request_id"),
		grpcguard.WithTenant(grpcguard.TenantFromField("tenant")))
	if err != nil {
		log.Fatal(err) // a protected method did not resolve in the registry
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(), icpt))
	invoicev1.RegisterInvoiceServiceServer(srv, &invoice.Service{Store: invoice.NewStore()})
	defer srv.Stop()
	fmt.Println("protected")
	// Output: protected
}
