// Command invoice-server serves the example InvoiceService, protected by
// the idempotency interceptor against a ledgerd, for the compose file and
// the Kubernetes manifests under deploy/.
//
//	invoice-server --listen :8080 --ledger ledgerd:7070 [--ledger-token-file /run/secrets/ledger-token] [--database-url postgres://… --migrate]
//
// It serves gRPC reflection, so that grpcurl calls it without the
// service's .proto files.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

func main() {
	listen := flag.String("listen", envOr("INVOICE_LISTEN", "127.0.0.1:8080"), "gRPC address (INVOICE_LISTEN)")
	ledgerAddr := flag.String("ledger", envOr("INVOICE_LEDGER", "127.0.0.1:7070"), "ledgerd address (INVOICE_LEDGER)")
	tokenFile := flag.String("ledger-token-file", os.Getenv("INVOICE_LEDGER_TOKEN_FILE"), "file holding the bearer token for ledgerd (INVOICE_LEDGER_TOKEN_FILE); empty for dev mode")
	databaseURL := flag.String("database-url", os.Getenv("INVOICE_DATABASE_URL"), "PostgreSQL or CockroachDB URL of the invoice tables (INVOICE_DATABASE_URL): each invoice is written with its key's fence; empty keeps them in memory")
	migrate := flag.Bool("migrate", false, "apply the invoice tables and the fence table's migration to --database-url before serving")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	lis, err := net.Listen("tcp", *listen)
	if err == nil {
		err = run(ctx, lis, *ledgerAddr, *tokenFile, *databaseURL, *migrate, log)
	}
	stop()
	if err != nil {
		log.Error("invoice-server stopped", "error", err)
		os.Exit(1)
	}
}

// run serves on lis until ctx ends.
func run(ctx context.Context, lis net.Listener, ledgerAddr, tokenFile, databaseURL string, migrate bool, log *slog.Logger) error {
	// The ledger's calls go on a Stream (ledger/ledgerclient), which
	// carries the token.
	var opts []ledgerclient.Option
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("ledger token: %w", err)
		}
		opts = append(opts, ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+strings.TrimSpace(string(b)))))
	}
	conn, err := grpc.NewClient(ledgerAddr, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ledgerClient := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn), opts...)
	defer ledgerClient.Close()
	// A duplicate waits for the first attempt's answer. On PostgreSQL each
	// invoice is written with its key's fence, and a takeover finds an
	// earlier attempt's commit there; in memory, a takeover looks for the
	// earlier attempt's invoice row by key.
	method := grpcguard.Method{Policy: guard.Policy{Lease: 30 * time.Second, Retention: 24 * time.Hour}}
	svc := &invoice.Service{}
	if databaseURL != "" {
		db, err := invoice.OpenPostgres(ctx, databaseURL)
		if err != nil {
			return err
		}
		defer db.Close()
		if migrate {
			if err := db.Migrate(ctx); err != nil {
				return err
			}
		}
		svc.Store, method.Policy.Fence = db, db.Fence()
	} else {
		svc.Store, method.Reconcile = invoice.NewStore(), svc.Reconcile
	}
	g, err := guard.New(ledgerClient, guard.WithLogger(log))
	if err != nil {
		return err
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod(invoice.CreateInvoiceMethod, method),
		grpcguard.WithKeyField("request_id"))
	if err != nil {
		return err
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(icpt))
	invoicev1.RegisterInvoiceServiceServer(gs, svc)
	h := health.NewServer()
	healthpb.RegisterHealthServer(gs, h)
	reflection.Register(gs) // grpcurl, as the README shows, needs no .proto files
	go func() {
		<-ctx.Done()
		h.Shutdown()
		gs.GracefulStop()
	}()
	log.InfoContext(ctx, "invoice-server listening", "grpc", lis.Addr().String(), "ledger", ledgerAddr)
	return gs.Serve(lis)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
