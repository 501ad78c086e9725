// Command mcp-invoice-server serves the example MCP invoice tools
// (create_invoice, get_invoice, list_invoices), create_invoice guarded by
// the idempotency ledger, over Streamable HTTP or stdio.
//
//	mcp-invoice-server --listen 127.0.0.1:8090 --ledger 127.0.0.1:7070 [--data invoices.jsonl] [--tenant-header X-Tenant]
//	mcp-invoice-server --stdio --ledger 127.0.0.1:7070 --tenant acme
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/examples/mcpinvoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

type config struct {
	listen, ledger, tokenFile, data, databaseURL, tenant, tenantHeader string
	stdio, migrate                                                     bool
}

func main() {
	var c config
	flag.StringVar(&c.listen, "listen", "127.0.0.1:8090", "Streamable HTTP address (the endpoint is /mcp)")
	flag.BoolVar(&c.stdio, "stdio", false, "serve MCP on stdin and stdout instead")
	flag.StringVar(&c.ledger, "ledger", "127.0.0.1:7070", "ledgerd's gRPC address")
	flag.StringVar(&c.tokenFile, "ledger-token-file", "", "file holding the bearer token for ledgerd; empty for dev mode")
	flag.StringVar(&c.databaseURL, "database-url", "", "the PostgreSQL or CockroachDB URL of the invoice tables: every invoice is written with its key's fence")
	flag.BoolVar(&c.migrate, "migrate", false, "apply the invoice tables and the fence table's migration to --database-url before serving")
	flag.StringVar(&c.data, "data", "", "without --database-url, the invoice table's file (JSON lines); empty keeps it in memory")
	flag.StringVar(&c.tenant, "tenant", "acme", "the tenant every call acts for, without --tenant-header")
	flag.StringVar(&c.tenantHeader, "tenant-header", "", "the HTTP header that names a call's tenant")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx, c, nil, log)
	stop()
	if err != nil {
		log.Error("mcp-invoice-server stopped", "error", err)
		os.Exit(1)
	}
}

// run serves until ctx ends. lis, when not nil, replaces --listen.
func run(ctx context.Context, c config, lis net.Listener, log *slog.Logger) error {
	var opts []ledgerclient.Option
	if c.tokenFile != "" {
		b, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return fmt.Errorf("ledger token: %w", err)
		}
		opts = append(opts, ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+strings.TrimSpace(string(b)))))
	}
	conn, err := grpc.NewClient(c.ledger, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn), opts...)
	defer ledger.Close()
	store, err := openDB(ctx, c)
	if err != nil {
		return err
	}
	defer store.Close()
	tenant := mcpguard.Tenant(c.tenant)
	if c.tenantHeader != "" {
		tenant = mcpguard.TenantFromHeader(c.tenantHeader)
	}
	tools := &mcpinvoice.Tools{Store: store, Tenant: tenant}
	gd, err := guard.New(ledger, guard.WithLogger(log))
	if err != nil {
		return err
	}
	g, err := tools.Guard(gd)
	if err != nil {
		return err
	}
	srv, err := tools.Server(g)
	if err != nil {
		return err
	}
	if c.stdio {
		err := srv.Run(ctx, mcpguard.Transport(&mcp.StdioTransport{}))
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}
	if lis == nil {
		if lis, err = net.Listen("tcp", c.listen); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpinvoice.Handler(srv))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	log.InfoContext(ctx, "mcp-invoice-server listening", "http", "http://"+lis.Addr().String()+"/mcp", "ledger", c.ledger)
	if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// openDB opens the invoice database: PostgreSQL with --database-url, or
// the file of --data.
func openDB(ctx context.Context, c config) (invoicedb.DB, error) {
	if c.databaseURL != "" {
		db, err := invoicedb.OpenPostgres(ctx, c.databaseURL)
		if err != nil {
			return nil, err
		}
		if c.migrate {
			if err := db.Migrate(ctx); err != nil {
				_ = db.Close()
				return nil, err
			}
		}
		return db, nil
	}
	return invoicedb.OpenFile(c.data)
}
