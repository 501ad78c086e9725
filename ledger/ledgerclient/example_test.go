package ledgerclient_test

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	_ "github.com/idemledger/idemledger/internal/testpb" // registers InvoiceService
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// A write service sends its ledger calls over one stream, with its bearer
// token on the stream, and protects CreateInvoice with it. Nothing is
// dialed until the first call.
func ExampleNew() {
	conn, err := grpc.NewClient("ledgerd.internal:7070", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn),
		ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+"<token>")))
	defer ledger.Close()
	g, err := guard.New(ledger)
	if err != nil {
		fmt.Println(err)
		return
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod("/idemledger.testing.v1.InvoiceService/CreateInvoice", grpcguard.Method{Policy: guard.Policy{}}),
		grpcguard.WithKeyField("request_id"))
	if err != nil {
		fmt.Println(err)
		return
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(icpt))
	defer gs.Stop()
	fmt.Println("built")
	// Output: built
}
