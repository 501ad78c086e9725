package mcpinvoice_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/examples/mcpinvoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/nodetest"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// serve starts the tool server over Streamable HTTP on loopback, against
// a LedgerService on the memory store, its invoices in a PostgreSQL
// database of the test's own, and returns its endpoint.
func serve(t *testing.T) (string, *mcpinvoice.Tools) {
	t.Helper()
	tools := &mcpinvoice.Tools{}
	return serveTools(t, tools, servertest.MemoryLedger("invoices")), tools
}

// serveTools serves tools, on a database of the test's own, against
// ledger.
func serveTools(t *testing.T, tools *mcpinvoice.Tools, ledgerService ledgerv1.LedgerServiceServer) string {
	t.Helper()
	ledger := ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(ledgerService)).Dial(t))
	store, err := invoicedb.OpenPostgres(t.Context(), pgtest.NewDatabase(t))
	if err == nil {
		err = store.Migrate(t.Context())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	tools.Store, tools.Tenant = store, mcpguard.Tenant("acme")
	gd, err := guard.New(ledger)
	if err != nil {
		t.Fatal(err)
	}
	g, err := tools.Guard(gd)
	if err != nil {
		t.Fatal(err)
	}
	s, err := tools.Server(g)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mcpinvoice.Handler(s))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAnInvoiceCommittedBeforeACrashIsReplayed: the first attempt commits
// its invoice with its fence and then hangs before the ledger hears of it,
// as a process that died there would; once its lease has run out, the
// retry finds the fence, and the key is completed with that invoice:
// replayed, not written twice.
func TestAnInvoiceCommittedBeforeACrashIsReplayed(t *testing.T) {
	clock := ledgertest.NewClock(time.Now())
	hung, release := make(chan struct{}), make(chan struct{})
	tools := &mcpinvoice.Tools{Lease: time.Minute, AfterWrite: func(ctx context.Context) {
		if c, _ := guard.ClaimFromContext(ctx); c.Attempt == 1 {
			close(hung)
			<-release
		}
	}}
	url := serveTools(t, tools, servertest.MemoryLedgerAt("invoices", clock.Now))
	session, err := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "v1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	call := func() (*mcp.CallToolResult, error) {
		return session.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice",
			Arguments: map[string]any{"customer": "cus_1", "currency": "EUR", "amount_cents": 4200},
			Meta:      mcp.Meta{mcpguard.KeyMeta: "inv-1"}})
	}
	first := make(chan error, 1)
	go func() { _, err := call(); first <- err }()
	<-hung
	clock.Advance(time.Minute + time.Second)
	res, err := call()
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	var got mcpinvoice.InvoiceResult
	b, _ := json.Marshal(res.StructuredContent)
	rows := storeRows(t, tools)
	if res.IsError || json.Unmarshal(b, &got) != nil || res.Meta[mcpguard.ReplayedMeta] != true || len(rows) != 1 || got.Invoice.ID != rows[0].Invoice.ID {
		t.Fatalf("the retry: %+v, rows %+v; want the committed invoice replayed", res, rows)
	}
	if err := <-first; err != nil {
		t.Logf("the hung attempt's caller: %v", err)
	}
}

// node runs a script of examples/mcp-ts with the official TypeScript SDK
// and returns its standard output. Without node or the npm packages
// (npm ci in examples/mcp-ts) it skips, except under CI=true.
func node(t *testing.T, script string, args ...string) []byte {
	t.Helper()
	bin, dir := nodetest.Node(t, "../mcp-ts", "@modelcontextprotocol/sdk")
	cmd := exec.CommandContext(t.Context(), bin, append([]string{filepath.Join(dir, script)}, args...)...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	return out
}

type tsResult struct {
	Meta              map[string]any    `json:"_meta"`
	Content           []json.RawMessage `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent"`
	IsError           bool              `json:"isError"`
}

// TestTypeScriptClient drives the Go tool server with the official
// TestTypeScriptClientSEP3182: the official TypeScript SDK's client sees
// the server advertise tools.idempotency, and sends its key as SEP-3182's
// idempotencyKey parameter: a call, its retry (the replay), a changed
// argument under that key (KEY_REUSED), and a key argument that wins over
// the parameter.
func TestTypeScriptClientSEP3182(t *testing.T) {
	url, tools := serve(t)
	var out struct {
		Experimental            map[string]any
		First, Retry, Changed   tsResult
		ArgumentWins, ParamOnly tsResult
	}
	if err := json.Unmarshal(node(t, "sep3182.mjs", url), &out); err != nil {
		t.Fatal(err)
	}
	if _, ok := out.Experimental[mcpguard.IdempotencyCapability]; !ok {
		t.Fatalf("the server's experimental capabilities, as the TypeScript client read them: %v", out.Experimental)
	}
	if out.First.IsError || out.Retry.Meta[mcpguard.ReplayedMeta] != true || string(out.Retry.StructuredContent) != string(out.First.StructuredContent) {
		t.Fatalf("first %+v, retry %+v: want the first result replayed", out.First, out.Retry)
	}
	if info, _ := out.Changed.Meta[mcpguard.ErrorMeta].(map[string]any); !out.Changed.IsError || info["code"] != "KEY_REUSED" {
		t.Fatalf("a changed argument under the parameter's key: %+v", out.Changed)
	}
	// The argument's key is the first call's: a replay, though the
	// parameter names another key; that other key alone then runs anew.
	if out.ArgumentWins.Meta[mcpguard.ReplayedMeta] != true || out.ParamOnly.IsError || out.ParamOnly.Meta[mcpguard.ReplayedMeta] == true {
		t.Fatalf("argument over parameter: %+v, then the parameter alone: %+v", out.ArgumentWins, out.ParamOnly)
	}
	if rows := storeRows(t, tools); len(rows) != 2 {
		t.Fatalf("%d invoice rows, want 2", len(rows))
	}
}

// TypeScript SDK's client: a call, its retry with the same _meta key (a
// replay, the same content), a changed argument under that key
// (KEY_REUSED as a tool result), and a call without a key (KEY_MISSING).
func TestTypeScriptClient(t *testing.T) {
	url, tools := serve(t)
	var out struct{ First, Retry, Changed, NoKey tsResult }
	if err := json.Unmarshal(node(t, "client.mjs", url), &out); err != nil {
		t.Fatal(err)
	}
	var first mcpinvoice.InvoiceResult
	if err := json.Unmarshal(out.First.StructuredContent, &first); err != nil || out.First.IsError || first.Invoice.Number != 1 {
		t.Fatalf("first: %+v (%v)", out.First, err)
	}
	if out.Retry.Meta[mcpguard.ReplayedMeta] != true || string(out.Retry.StructuredContent) != string(out.First.StructuredContent) ||
		len(out.Retry.Content) != 1 || string(out.Retry.Content[0]) != string(out.First.Content[0]) {
		t.Fatalf("retry: %+v, want the first result replayed", out.Retry)
	}
	for name, tt := range map[string]struct {
		res  tsResult
		code string
	}{"Changed": {out.Changed, "KEY_REUSED"}, "NoKey": {out.NoKey, "KEY_MISSING"}} {
		info, _ := tt.res.Meta[mcpguard.ErrorMeta].(map[string]any)
		if !tt.res.IsError || info["code"] != tt.code || info["retryable"] != false || len(tt.res.Content) != 1 {
			t.Errorf("%s: %+v, want an error result %s", name, tt.res, tt.code)
		}
	}
	if rows := storeRows(t, tools); len(rows) != 1 {
		t.Fatalf("%d invoice rows, want 1", len(rows))
	}
}

// v2Result is a tool result as examples/mcp-ts/client-v2.mjs prints it.
type v2Result struct {
	IsError bool `json:"isError"`
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	Meta struct {
		Replayed bool                `json:"io.idemledger/replayed"`
		Error    *mcpguard.ErrorInfo `json:"io.idemledger/error"`
	} `json:"_meta"`
}

// TestV2Client drives the Go tool server with the official TypeScript
// SDK's v2 client on 2026-07-28 (negotiated by server/discover, and
// pinned) and on the 2025 handshake: a key in _meta and a key argument
// each run once and their retries are the marked replays; the key with
// another amount is KEY_REUSED; a charge asks its confirmation once (an
// input_required round, or an elicitation the SDK pushes to the 2025
// client), charges once, and its retry is the replay.
func TestV2Client(t *testing.T) {
	url, tools := serve(t)
	for i, mode := range []string{"auto", "pin", "legacy"} {
		t.Run(mode, func(t *testing.T) {
			var out struct {
				Era                                        string
				First, Retry, Changed, ArgKey, ArgKeyRetry v2Result
				Charge, ChargeRetry                        v2Result
				Asked                                      int
			}
			if err := json.Unmarshal(node(t, "client-v2.mjs", url, mode, mode), &out); err != nil {
				t.Fatal(err)
			}
			if want := map[string]string{"auto": "modern", "pin": "modern", "legacy": "legacy"}[mode]; out.Era != want {
				t.Errorf("era %q, want %q", out.Era, want)
			}
			for name, p := range map[string][2]v2Result{"_meta": {out.First, out.Retry}, "argument": {out.ArgKey, out.ArgKeyRetry}, "charge": {out.Charge, out.ChargeRetry}} {
				first, again := p[0], p[1]
				if first.IsError || first.Meta.Replayed || !again.Meta.Replayed || len(first.Content) != 1 || len(again.Content) != 1 ||
					first.Content[0].Text != again.Content[0].Text {
					t.Errorf("a key in %s: %+v, then %+v; want a run and its marked replay", name, first, again)
				}
			}
			if e := out.Changed.Meta.Error; e == nil || e.Code != "KEY_REUSED" {
				t.Errorf("the key with another amount: %+v", out.Changed)
			}
			if out.Asked != 1 {
				t.Errorf("asked %d times to confirm the charge, want once", out.Asked)
			}
			if rows, charges := len(storeRows(t, tools)), len(tools.Charges()); rows != 2*(i+1) || charges != i+1 {
				t.Errorf("%d invoices and %d charges; want %d and %d", rows, charges, 2*(i+1), i+1)
			}
		})
	}
}

// storeRows counts the invoice rows.
func storeRows(t *testing.T, tools *mcpinvoice.Tools) []invoicedb.Row {
	t.Helper()
	rows, err := tools.Store.Rows(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return rows
}
