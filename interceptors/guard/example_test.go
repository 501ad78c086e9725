package guard_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/fingerprint"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/server/servertest"
)

// Receipt is what the example's charge returns, and what Do stores.
type Receipt struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// A job (not a handler) charges a card once per intent: the first Do runs
// the charge and stores its receipt; a second Do with the same key, as a
// retry of the job would make it, gets the receipt without charging again.
func ExampleDo() {
	ledger, stop := exampleLedger() // a ledger client: ledgerclient.New over a connection to ledgerd
	defer stop()
	g, err := guard.New(ledger)
	if err != nil {
		fmt.Println(err)
		return
	}
	charges := 0
	call := guard.Call{
		Method:      "job:charge-invoice",
		Key:         "invoice-42-charge", // one key per intent, the same on every retry
		Tenant:      "acme",
		Fingerprint: fingerprint.Bytes("job:charge-invoice", "text/plain", []byte("invoice 42: 1200 EUR")),
		Policy:      guard.Policy{Lease: 30 * time.Second, Retention: 24 * time.Hour},
	}
	charge := func(ctx context.Context) (Receipt, error) {
		charges++ // the card is charged here
		return Receipt{ID: "ch_1", Amount: 1200}, nil
	}
	for range 2 {
		r, err := guard.Do(context.Background(), g, call, charge)
		fmt.Println(r.ID, r.Amount, err)
	}
	fmt.Println("charged", charges, "time")
	// Output:
	// ch_1 1200 <nil>
	// ch_1 1200 <nil>
	// charged 1 time
}

// exampleLedger is a ledger on loopback, in memory, for the example, and
// what stops it.
func exampleLedger() (ledgerv1.LedgerServiceClient, func()) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, servertest.MemoryLedgerAt("billing", nil))
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	return ledgerv1.NewLedgerServiceClient(conn), func() { _ = conn.Close(); gs.Stop() }
}
