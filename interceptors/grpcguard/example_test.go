package grpcguard_test

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
)

// A write service protects CreateInvoice with a 30 s lease and a day of
// retention, taking the key from the request's request_id field.
func ExampleUnaryServerInterceptor() {
	ledgerConn, err := grpc.NewClient("ledgerd.internal:7070", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ledgerConn.Close()
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(ledgerConn))
	if err != nil {
		fmt.Println(err)
		return
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod("/idemledger.testing.v1.InvoiceService/CreateInvoice",
			grpcguard.Method{Policy: guard.Policy{Lease: 30 * time.Second, Retention: 24 * time.Hour}}),
		grpcguard.WithKeyField("request_id"),
		grpcguard.WithTenant(grpcguard.TenantFromField("tenant")))
	if err != nil {
		fmt.Println(err) // a protected method did not resolve
		return
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(icpt))
	defer gs.Stop()
	// testpb.RegisterInvoiceServiceServer(gs, service); gs.Serve(lis)
	fmt.Println("built")
	// Output: built
}
