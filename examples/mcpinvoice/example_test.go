package mcpinvoice_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

type invoiceArgs struct {
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

func createInvoiceTool(context.Context, *mcp.CallToolRequest, invoiceArgs) (*mcp.CallToolResult, map[string]any, error) {
	return nil, map[string]any{"id": "inv_1"}, nil
}

// An MCP server guards its create_invoice tool: the README shows this
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

	// g is the guard (guard.New(ledger), as above). The key travels in _meta
	// or in the idempotency_key argument; the tenant comes from the X-Tenant
	// header.
	mg, err := mcpguard.New(g,
		mcpguard.WithTool("create_invoice", mcpguard.NewTool(guard.Policy{Lease: 30 * time.Second})),
		mcpguard.WithTenant(mcpguard.TenantFromHeader("X-Tenant")))
	if err != nil {
		log.Fatal(err)
	}
	in, _ := jsonschema.For[invoiceArgs](nil)
	server := mcp.NewServer(&mcp.Implementation{Name: "invoices", Version: "v1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "create_invoice", InputSchema: mcpguard.KeySchema(in, "")}, createInvoiceTool)
	server.AddReceivingMiddleware(mg.Middleware())
	fmt.Println("guarded")
	// Output: guarded
}
