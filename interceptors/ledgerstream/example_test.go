package ledgerstream_test

import (
	"fmt"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	_ "github.com/idemledger/idemledger/gen/idemledger/examples/invoice/v1" // registers InvoiceService
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/idempotency"
	"github.com/idemledger/idemledger/interceptors/ledgerstream"
)

// A write service sends its ledger calls over one stream, with its bearer
// token on the stream, and protects CreateInvoice with it. Nothing is
// dialed until the first call.
func ExampleNew() {
	conn, err := grpc.NewClient("ledgerd.internal:7070", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ledger := ledgerstream.New(ledgerv1.NewLedgerServiceClient(conn),
		ledgerstream.WithMetadata(metadata.Pairs("authorization", "Bearer "+"<token>")))
	defer ledger.Close()
	icpt, err := idempotency.UnaryServerInterceptor(ledger,
		idempotency.WithMethod("/idemledger.examples.invoice.v1.InvoiceService/CreateInvoice", idempotency.Policy{}),
		idempotency.WithKeyField("request_id"))
	if err != nil {
		log.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(icpt))
	defer gs.Stop()
	fmt.Println("built")
	// Output: built
}
