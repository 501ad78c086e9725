package idempotency_test

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/idempotency"
	testpb "github.com/idemledger/idemledger/internal/testpb"
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
	icpt, err := idempotency.UnaryServerInterceptor(ledgerv1.NewLedgerServiceClient(ledgerConn),
		idempotency.WithMethod("/idemledger.testing.v1.InvoiceService/CreateInvoice",
			idempotency.Policy{Lease: 30 * time.Second, Retention: 24 * time.Hour}),
		idempotency.WithKeyField("request_id"),
		idempotency.WithTenant(idempotency.TenantFromField("tenant")))
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

// The key field is left out of the fingerprint: two retries of one intent
// print alike whatever key they carry, and another payload prints apart.
func ExampleFingerprint() {
	const method = "/idemledger.testing.v1.InvoiceService/CreateInvoice"
	req := &testpb.CreateInvoiceRequest{RequestId: "k-1", Tenant: "acme", CustomerId: "cus_1", Currency: "EUR"}
	a := idempotency.Fingerprint(method, req, "request_id")
	req.RequestId = "k-2"
	b := idempotency.Fingerprint(method, req, "request_id")
	req.Currency = "USD"
	c := idempotency.Fingerprint(method, req, "request_id")
	fmt.Println(a[:3], len(a), a == b, a == c)
	// Output: v1: 67 true false
}
