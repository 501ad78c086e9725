package main

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestServesOverTheLedgerStream runs invoice-server against a real ledger
// that takes bearer tokens: with the right token file (and its invoices
// on PostgreSQL) a retried request gets the same invoice; with a wrong
// one (in memory) the write is refused.
func TestServesOverTheLedgerStream(t *testing.T) {
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("s3cret") + " invoices *\n"))
	if err != nil {
		t.Fatal(err)
	}
	ledgerLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ledgerSrv := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(ledgerSrv, server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: tokens}))
	go func() { _ = ledgerSrv.Serve(ledgerLis) }()
	t.Cleanup(ledgerSrv.Stop)

	serve := func(token, databaseURL string) invoicev1.InvoiceServiceClient {
		file := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- run(ctx, lis, ledgerLis.Addr().String(), file, databaseURL, true, slog.New(slog.DiscardHandler))
		}()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("invoice-server: %v", err)
			}
		})
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return invoicev1.NewInvoiceServiceClient(conn)
	}
	req := &invoicev1.CreateInvoiceRequest{RequestId: "req-1", Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: 2, UnitAmountMicros: 12_500_000}}}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	good := serve("s3cret", pgtest.NewDatabase(t)) // its invoices on PostgreSQL, fenced
	first, err := good.CreateInvoice(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := good.CreateInvoice(ctx, req)
	if err != nil || again.GetInvoice().GetId() != first.GetInvoice().GetId() {
		t.Fatalf("the retry = %v, %v; want invoice %s again", again, err, first.GetInvoice().GetId())
	}

	bad := serve("wrong", "")
	_, err = bad.CreateInvoice(ctx, &invoicev1.CreateInvoiceRequest{RequestId: "req-2", Tenant: "acme", CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: 1, UnitAmountMicros: 1}}})
	// The ledger refused the service (UNAUTHENTICATED); its caller is told
	// INTERNAL: the fault is the service's, not the caller's.
	if code := ledgerstatus.FromError(err).Code; code != errcode.Internal {
		t.Fatalf("a write service with a wrong ledger token: %v, want INTERNAL", err)
	}
}
