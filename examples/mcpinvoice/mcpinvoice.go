// Package mcpinvoice is the example MCP tool server: create_invoice,
// get_invoice and list_invoices over an invoice table of its own
// (invoicedb.DB), and charge, which asks the user to confirm before it
// charges, with create_invoice and charge made idempotent by the ledger's
// MCP adapter (package mcpguard). A takeover of create_invoice is
// reconciled by looking for the earlier attempt's row by key, so a crash
// between the write and its Complete never writes a second invoice. It
// serves both eras of MCP (Handler): 2026-07-28, stateless, and the 2025
// revisions.
package mcpinvoice

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

// CreateArgs are create_invoice's arguments (besides the key).
type CreateArgs struct {
	Customer    string `json:"customer" jsonschema:"the customer's id"`
	Currency    string `json:"currency" jsonschema:"ISO 4217 code, such as EUR"`
	AmountCents int64  `json:"amount_cents" jsonschema:"the amount, in cents"`
}

// InvoiceResult is what create_invoice and get_invoice answer.
type InvoiceResult struct {
	Invoice invoicedb.Invoice `json:"invoice"`
}

// ChargeArgs are charge's arguments (besides the key).
type ChargeArgs struct {
	Customer    string `json:"customer" jsonschema:"the customer's id"`
	AmountCents int64  `json:"amount_cents" jsonschema:"the amount, in cents"`
}

// ChargeResult is what charge answers.
type ChargeResult struct {
	ID          string `json:"id"`
	Customer    string `json:"customer"`
	AmountCents int64  `json:"amount_cents"`
}

// ListResult is what list_invoices answers.
type ListResult struct {
	Invoices []invoicedb.Invoice `json:"invoices"`
}

// Tools is the tool server.
type Tools struct {
	Store invoicedb.DB
	// Tenant finds the tenant of a call (the same function the guard
	// uses).
	Tenant mcpguard.TenantFunc
	// Lease is create_invoice's lease; 0 means 10 s.
	Lease time.Duration
	// BeforeWrite and AfterWrite, when set, run around create_invoice's
	// write; the lab's demo crashes the server there.
	BeforeWrite, AfterWrite func(ctx context.Context)

	mu      sync.Mutex
	charges []ChargeResult
}

// Policy is create_invoice's protection: a duplicate waits for the first
// attempt's answer. On Postgres the invoice is fenced, and a takeover
// finds an earlier attempt's commit in the fence; on a File, a takeover
// is reconciled by key.
func (t *Tools) Policy() mcpguard.Tool {
	lease := t.Lease
	if lease <= 0 {
		lease = 10 * time.Second
	}
	tool := mcpguard.NewTool(guard.Policy{Lease: lease})
	if f := t.Store.Fence(); f != nil {
		tool.Policy.Fence = f
	} else {
		tool.Reconcile = t.Reconcile
	}
	tool.StructuredOutput = true
	return tool
}

// Guard returns the MCP adapter that protects create_invoice and charge
// under g.
func (t *Tools) Guard(g *guard.Guard, opts ...mcpguard.Option) (*mcpguard.Guard, error) {
	charge := mcpguard.NewTool(guard.Policy{Lease: 10 * time.Second})
	charge.StructuredOutput = true
	return mcpguard.New(g, append([]mcpguard.Option{
		mcpguard.WithTenant(t.Tenant),
		mcpguard.WithTool("create_invoice", t.Policy()),
		mcpguard.WithTool("charge", charge),
	}, opts...)...)
}

// Server returns the MCP server with the three tools, guarded by g.
func (t *Tools) Server(g *mcpguard.Guard) (*mcp.Server, error) {
	s := mcp.NewServer(&mcp.Implementation{Name: "invoices", Version: "v1"}, &mcp.ServerOptions{
		// It reads SEP-3182's idempotencyKey parameter, served through
		// mcpguard.Handler (Streamable HTTP) or mcpguard.Transport (stdio).
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{},
			Experimental: map[string]any{mcpguard.IdempotencyCapability: map[string]any{}}},
	})
	in, err := jsonschema.For[CreateArgs](nil)
	if err != nil {
		return nil, err
	}
	mcp.AddTool(s, &mcp.Tool{
		Name:        "create_invoice",
		Description: "Create an invoice for a customer. Pass an idempotency key: the same key on every retry of one invoice, a new key for a new invoice.",
		InputSchema: mcpguard.KeySchema(in, ""),
	}, t.create)
	charge, err := jsonschema.For[ChargeArgs](nil)
	if err != nil {
		return nil, err
	}
	mcp.AddTool(s, &mcp.Tool{
		Name:        "charge",
		Description: "Charge a customer, once the user confirms. Pass an idempotency key: the same key on every retry of one charge.",
		InputSchema: mcpguard.KeySchema(charge, ""),
	}, t.charge)
	mcp.AddTool(s, &mcp.Tool{Name: "get_invoice", Description: "Get an invoice by id."}, t.get)
	mcp.AddTool(s, &mcp.Tool{Name: "list_invoices", Description: "List the invoices."}, t.list)
	s.AddReceivingMiddleware(g.Middleware())
	return s, nil
}

// Handler serves s over Streamable HTTP in both eras of MCP: a request of
// 2026-07-28 or later (by its MCP-Protocol-Version header) statelessly, as
// that revision is, one handler per request; a client of the 2025
// revisions in a session of its own, opened by initialize. SEP-3182's
// idempotencyKey parameter is read on either (mcpguard.Handler).
func Handler(s *mcp.Server) http.Handler {
	byRequest := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true})
	bySession := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
	return mcpguard.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("MCP-Protocol-Version") >= "2026-07-28" {
			byRequest.ServeHTTP(w, r)
			return
		}
		bySession.ServeHTTP(w, r)
	}))
}

func (t *Tools) create(ctx context.Context, req *mcp.CallToolRequest, args CreateArgs) (*mcp.CallToolResult, InvoiceResult, error) {
	c, ok := guard.ClaimFromContext(ctx)
	if !ok {
		return nil, InvoiceResult{}, fmt.Errorf("create_invoice runs behind the idempotency guard")
	}
	if args.Customer == "" || len(args.Currency) != 3 || args.AmountCents <= 0 {
		return nil, InvoiceResult{}, fmt.Errorf("an invoice needs a customer, a 3-letter currency and a positive amount")
	}
	if t.BeforeWrite != nil {
		t.BeforeWrite(ctx)
	}
	inv, err := t.Store.Insert(ctx, c.Tenant, c.Key, c.Token, func(n int64) invoicedb.Invoice {
		return invoicedb.Invoice{
			ID: fmt.Sprintf("inv_%s_%06d", c.Tenant, n), Number: n, Customer: args.Customer,
			Currency: args.Currency, AmountCents: args.AmountCents, CreatedAt: time.Now().UTC(),
		}
	}, func(inv invoicedb.Invoice) any {
		res, _ := Result(InvoiceResult{Invoice: inv}) // what the SDK answers for the tool's output
		return res
	})
	if err != nil {
		return nil, InvoiceResult{}, err
	}
	if t.AfterWrite != nil {
		t.AfterWrite(ctx)
	}
	return nil, InvoiceResult{Invoice: inv}, nil
}

// charge asks the user to confirm (an input_required round, or an
// elicitation the SDK pushes to a 2025 client), then charges: once per
// key, however many rounds and retries reach it.
func (t *Tools) charge(_ context.Context, req *mcp.CallToolRequest, args ChargeArgs) (*mcp.CallToolResult, *ChargeResult, error) {
	answer, _ := req.Params.InputResponses["confirm"].(*mcp.ElicitResult)
	if answer == nil || answer.Action != "accept" || answer.Content["confirm"] != true {
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{
			Message: fmt.Sprintf("Charge %s %d cents?", args.Customer, args.AmountCents),
			RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"confirm": map[string]any{"type": "boolean"}},
				"required": []string{"confirm"}},
		}}}, nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := ChargeResult{ID: fmt.Sprintf("ch_%06d", len(t.charges)+1), Customer: args.Customer, AmountCents: args.AmountCents}
	t.charges = append(t.charges, c)
	return nil, &c, nil
}

// Charges are the charges made.
func (t *Tools) Charges() []ChargeResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.charges)
}

// Reconcile is create_invoice's reconcile function: the earlier attempt's
// invoice, found by the claim's key, answered as create_invoice answers.
func (t *Tools) Reconcile(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	c, ok := guard.ClaimFromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("reconcile runs behind the idempotency guard")
	}
	inv, ok, err := t.Store.FindByKey(ctx, c.Tenant, c.Key)
	if !ok || err != nil {
		return nil, err
	}
	return Result(InvoiceResult{Invoice: inv})
}

// Result is the CallToolResult the SDK makes of a typed tool's output: the
// output as structuredContent and as JSON text.
func Result(out any) (*mcp.CallToolResult, error) {
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}, nil
}

type getArgs struct {
	ID string `json:"id"`
}

func (t *Tools) get(ctx context.Context, req *mcp.CallToolRequest, args getArgs) (*mcp.CallToolResult, InvoiceResult, error) {
	tenant, err := t.Tenant(ctx, req)
	if err != nil {
		return nil, InvoiceResult{}, err
	}
	inv, ok, err := t.Store.Get(ctx, tenant, args.ID)
	if err != nil {
		return nil, InvoiceResult{}, err
	}
	if !ok {
		return nil, InvoiceResult{}, fmt.Errorf("no invoice %q", args.ID)
	}
	return nil, InvoiceResult{Invoice: inv}, nil
}

func (t *Tools) list(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListResult, error) {
	tenant, err := t.Tenant(ctx, req)
	if err != nil {
		return nil, ListResult{}, err
	}
	invoices, err := t.Store.List(ctx, tenant)
	return nil, ListResult{Invoices: invoices}, err
}
