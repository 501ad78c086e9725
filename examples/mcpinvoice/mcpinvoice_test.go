package mcpinvoice_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/examples/mcpinvoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/nodetest"
	"github.com/idemledger/idemledger/server/servertest"
)

// serve starts the tool server over Streamable HTTP on loopback, against
// a LedgerService on the memory store, and returns its endpoint.
func serve(t *testing.T) (string, *mcpinvoice.Tools) {
	t.Helper()
	ledger := ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("invoices"))).Dial(t))
	store, err := invoicedb.OpenStore(filepath.Join(t.TempDir(), "invoices.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	tools := &mcpinvoice.Tools{Store: store, Tenant: mcpguard.Tenant("acme")}
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
	srv := httptest.NewServer(mcpguard.Handler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)))
	t.Cleanup(srv.Close)
	return srv.URL, tools
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
	if rows := tools.Store.Rows(); len(rows) != 2 {
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
	if rows := tools.Store.Rows(); len(rows) != 1 {
		t.Fatalf("%d invoice rows, want 1", len(rows))
	}
}
