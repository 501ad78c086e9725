package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// batchedInvoice is a JSON-RPC batch (the 2025-03-26 revision's) whose one
// message calls the guarded create_invoice.
const batchedInvoice = `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_invoice",` +
	`"arguments":{"customer":"c","currency":"EUR","amount_cents":1},"_meta":{"io.idemledger/idempotency-key":"batched"}}}]`

// TestProxyRefusesABatchedGuardedCall: a 2025-03-26 client's batch that
// calls a guarded tool is refused whole (400, a JSON-RPC error that says
// to send the call alone), over Streamable HTTP and over stdio: passed
// through, its call reached the upstream without a claim (the Go SDK's
// server runs a batch). A batch that calls no guarded tool passes.
func TestProxyRefusesABatchedGuardedCall(t *testing.T) {
	up := &goUpstream{}
	cfg := config(ledgerAddr(t), byURL(up.serve(t)), policyConfig{})
	endpoint, _ := proxy(t, cfg)
	post := func(body, session string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-03-26")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("Mcp-Session-Id"), string(b)
	}
	_, session, _ := post(`{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"agent","version":"1"}}}`, "")
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, session)

	code, _, body := post(batchedInvoice, session)
	var refusal rpcAnswer
	if code != http.StatusBadRequest || json.Unmarshal([]byte(body), &refusal) != nil || refusal.Error == nil ||
		refusal.Error.Code != -32600 || !strings.Contains(refusal.Error.Message, "create_invoice") {
		t.Fatalf("a batch that calls a guarded tool, over HTTP: %d %s; want 400 and a JSON-RPC error naming the tool", code, body)
	}
	if code, _, body := post(`[{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{}}}]`, session); code != http.StatusOK || !strings.Contains(body, "echo") {
		t.Fatalf("a batch that calls no guarded tool: %d %s; want it passed through", code, body)
	}

	h := stdioProxy(t, cfg)
	h.call("initialize", map[string]any{"protocolVersion": "2025-03-26", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "host", "version": "1"}})
	h.send(batchedInvoice)
	if a := h.answer(json.RawMessage("null")); a.Error == nil || !strings.Contains(a.Error.Message, "batch") {
		t.Fatalf("a batch that calls a guarded tool, over stdio: %+v", a)
	}
	if w := up.writes(); len(w) != 0 || up.echoes.Load() != 1 {
		t.Fatalf("the upstream wrote %v and echoed %d times; want no write and one echo", w, up.echoes.Load())
	}
}
