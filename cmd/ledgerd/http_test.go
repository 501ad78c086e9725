package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
)

// withToken starts ledgerd on its embedded store with one write service's
// token (namespace billing, tenant acme) and args, and returns the token.
func withToken(t *testing.T, args ...string) (*proc, string) {
	t.Helper()
	tokens, token := filepath.Join(t.TempDir(), "tokens"), "billing-secret"
	if err := os.WriteFile(tokens, []byte(server.HashToken(token)+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return start(t, append([]string{"--data-dir", t.TempDir(), "--tokens", tokens}, args...)...), token
}

// connectError is a Connect protocol error as it travels in JSON.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type  string `json:"type"`
		Value string `json:"value"`
	} `json:"details"`
}

// postJSON makes a Connect unary call with a JSON body, as curl would.
func postJSON(t *testing.T, base, method, token, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+base+"/idemledger.v1.LedgerService/"+method, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, b
}

// errorDetail decodes the ledger's ErrorDetail from a Connect error.
func errorDetail(t *testing.T, body []byte) (connectError, *ledgerv1.ErrorDetail) {
	t.Helper()
	var ce connectError
	if err := json.Unmarshal(body, &ce); err != nil {
		t.Fatalf("not a Connect error: %s", body)
	}
	for _, d := range ce.Details {
		if d.Type != "idemledger.v1.ErrorDetail" {
			continue
		}
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
		if err != nil {
			t.Fatal(err)
		}
		var ed ledgerv1.ErrorDetail
		if err := proto.Unmarshal(raw, &ed); err != nil {
			t.Fatal(err)
		}
		return ce, &ed
	}
	t.Fatalf("no ErrorDetail in %s", body)
	return ce, nil
}

// TestHTTPListener: LedgerService over the Connect protocol with JSON on
// --http-listen: claim, complete, replay; typed errors in the Connect
// error's details; the same authentication as gRPC; the same decision
// counters.
func TestHTTPListener(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p, token := withToken(t)
	p.waitServing(t, p.dial(t))
	begin := `{"tenant":"acme","key":"k-http","fingerprint":"` + ledgertest.Fingerprint("p") + `","method":"http:POST /v1/invoices"}`

	status, body := postJSON(t, p.http, "Begin", token, begin)
	var claim struct{ Claim struct{ Token string } }
	if status != http.StatusOK || json.Unmarshal(body, &claim) != nil || claim.Claim.Token != "1" {
		t.Fatalf("Begin: %d %s", status, body)
	}
	outcome := `{"response":{"@type":"type.googleapis.com/google.protobuf.StringValue","value":"inv_0042"}}`
	if status, body := postJSON(t, p.http, "Complete", token, `{"tenant":"acme","key":"k-http","token":"1","outcome":`+outcome+`}`); status != http.StatusOK {
		t.Fatalf("Complete: %d %s", status, body)
	}
	status, body = postJSON(t, p.http, "Begin", token, begin)
	if status != http.StatusOK || !bytes.Contains(body, []byte(`"inv_0042"`)) || !bytes.Contains(body, []byte(`"replay"`)) {
		t.Fatalf("replay: %d %s", status, body)
	}

	// KEY_REUSED, with its detail.
	other := strings.Replace(begin, ledgertest.Fingerprint("p"), ledgertest.Fingerprint("q"), 1)
	status, body = postJSON(t, p.http, "Begin", token, other)
	ce, ed := errorDetail(t, body)
	if status != http.StatusBadRequest || ce.Code != "failed_precondition" || ed.GetCode() != ledgerv1.ErrorCode_ERROR_CODE_KEY_REUSED || ed.GetRetryable() {
		t.Fatalf("KEY_REUSED: %d %s", status, body)
	}
	// IN_PROGRESS, retryable with a retry-after.
	postJSON(t, p.http, "Begin", token, strings.Replace(begin, "k-http", "k-busy", 1))
	status, body = postJSON(t, p.http, "Begin", token, strings.Replace(begin, "k-http", "k-busy", 1))
	ce, ed = errorDetail(t, body)
	if ce.Code != "aborted" || ed.GetCode() != ledgerv1.ErrorCode_ERROR_CODE_IN_PROGRESS || !ed.GetRetryable() || ed.GetRetryAfter().AsDuration() <= 0 {
		t.Fatalf("IN_PROGRESS: %d %s", status, body)
	}
	// The same authentication: no token, or a wrong one, is UNAUTHENTICATED.
	for _, tok := range []string{"", "not-a-token"} {
		status, body = postJSON(t, p.http, "Begin", tok, begin)
		if ce, ed := errorDetail(t, body); status != http.StatusUnauthorized || ce.Code != "unauthenticated" || ed.GetCode() != ledgerv1.ErrorCode_ERROR_CODE_UNAUTHENTICATED {
			t.Fatalf("token %q: %d %s", tok, status, body)
		}
	}
	metrics := p.metrics(t)
	for _, want := range []string{`decision="claimed",ledger_namespace="billing"} 2`, `decision="replayed",ledger_namespace="billing"} 1`, `decision="key_reused",ledger_namespace="billing"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestStoreMetrics: the store's calls are timed by operation, the
// outcomes stored are sized, and the census counts the records by state.
func TestStoreMetrics(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p := start(t, "--data-dir", t.TempDir(), "--census-interval", "50ms")
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	res, err := client.Begin(t.Context(), begin("k"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: res.GetClaim().GetToken(), Outcome: invoice}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Begin(t.Context(), begin("held")); err != nil {
		t.Fatal(err)
	}
	stored, err := (&ledger.Outcome{Response: invoice.GetResponse()}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var m, missing string
	// Metrics are scraped from another process: poll until they show.
	ledgertest.Eventually(t, 5*time.Second, func() bool {
		m, missing = p.metrics(t), ""
		for _, want := range []string{
			`idemledger_records{state="completed"} 1`,
			`idemledger_records{state="in_progress"} 1`,
			`idemledger_store_seconds_count{home="",op="claim"} 2`, // the two Begins; not the readiness canary's
			`idemledger_store_seconds_count{home="",op="canary"} `,
			`idemledger_store_seconds_count{home="",op="complete"} 1`,
			`idemledger_outcome_bytes_count 1`,
			fmt.Sprintf("idemledger_outcome_bytes_sum %d\n", len(stored)), // the outcome's encoding, as the store keeps it
		} {
			if !strings.Contains(m, want) {
				missing = want
			}
		}
		return missing == ""
	}, "every metric shows")
}

// TestHTTPListenerTypesBadInput: what a caller can get wrong over
// Connect/JSON is answered typed, as over gRPC, and changes nothing: a
// body that does not decode as the request is 400 VALIDATION_FAILED; a
// body over the limit is 413 OUTCOME_TOO_LARGE, not retryable; a caller
// without credentials is 401 before its body is read; and JSON with a
// charset, or in another letter case, is JSON.
func TestHTTPListenerTypesBadInput(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p, token := withToken(t, "--max-outcome-bytes", "65536")
	p.waitServing(t, p.dial(t))
	fp := ledgertest.Fingerprint("p")
	begin := `{"tenant":"acme","key":"k","fingerprint":"` + fp + `","method":"http:POST /v1/invoices"}`
	if status, body := postJSON(t, p.http, "Begin", token, begin); status != http.StatusOK {
		t.Fatalf("Begin: %d %s", status, body)
	}

	for name, body := range map[string]string{
		"Truncated":      begin[:len(begin)-5],
		"WrongType":      `{"tenant":7,"key":"k2","fingerprint":"` + fp + `","method":"m"}`,
		"DuplicateField": `{"tenant":"acme","tenant":"acme","key":"k2","fingerprint":"` + fp + `","method":"m"}`,
		"UnknownField":   `{"tenant":"acme","key":"k2","fingerprint":"` + fp + `","method":"m","extra":1}`,
		"InvalidUTF8":    "{\"tenant\":\"acme\xff\",\"key\":\"k2\",\"fingerprint\":\"" + fp + "\",\"method\":\"m\"}",
		"Null":           `null`,
		"Array":          `[]`,
		"Empty":          ``,
		"UnknownAny":     `{"tenant":"acme","key":"k","token":"1","outcome":{"response":{"@type":"type.googleapis.com/nope.Nope","x":1}}}`,
	} {
		method := "Begin"
		if name == "UnknownAny" {
			method = "Complete"
		}
		status, b := postJSON(t, p.http, method, token, body)
		ce, ed := errorDetail(t, b)
		if status != http.StatusBadRequest || ce.Code != "invalid_argument" || ed.GetCode() != ledgerv1.ErrorCode_ERROR_CODE_VALIDATION_FAILED || ed.GetRetryable() {
			t.Errorf("%s: %d %s; want 400 invalid_argument, VALIDATION_FAILED", name, status, b)
		}
	}

	// Over the receive limit (by default four times the outcome limit plus
	// 64 KiB): 413, typed, not retryable; the record is unchanged.
	big := `{"tenant":"acme","key":"k","token":"1","outcome":{"response":{"@type":"type.googleapis.com/google.protobuf.BytesValue","value":"` +
		base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 400<<10)) + `"}}}`
	status, b := postJSON(t, p.http, "Complete", token, big)
	if ce, ed := errorDetail(t, b); status != http.StatusRequestEntityTooLarge || ed.GetCode() != ledgerv1.ErrorCode_ERROR_CODE_OUTCOME_TOO_LARGE || ed.GetRetryable() {
		t.Fatalf("a body over the limit: %d %s (%s); want 413 OUTCOME_TOO_LARGE, not retryable", status, b, ce.Code)
	}
	status, b = postJSON(t, p.http, "Lookup", token, `{"tenant":"acme","key":"k"}`)
	if status != http.StatusOK || !bytes.Contains(b, []byte(`STATE_IN_PROGRESS`)) {
		t.Fatalf("the record after the refused calls: %d %s; want it in progress, unchanged", status, b)
	}

	// No credentials: 401 at once, whatever the body.
	status, b = postJSON(t, p.http, "Complete", "", big)
	if ce, _ := errorDetail(t, b); status != http.StatusUnauthorized || ce.Code != "unauthenticated" {
		t.Fatalf("without a token: %d %s", status, b)
	}

	// JSON with a charset, or in capitals, without Connect-Protocol-Version.
	for _, ct := range []string{"application/json; charset=utf-8", "application/JSON", "Application/Json;charset=UTF-8"} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+p.http+"/idemledger.v1.LedgerService/Lookup", strings.NewReader(`{"tenant":"acme","key":"k"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", ct)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("STATE_IN_PROGRESS")) {
			t.Errorf("Content-Type %q: %d %s", ct, res.StatusCode, body)
		}
	}
}

// TestHTTPListenerSlowBodies: callers that send a body a byte at a time
// without credentials are refused at once, from their headers, and hold
// nothing: an authenticated call made while they dribble is answered at
// once.
func TestHTTPListenerSlowBodies(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p, token := withToken(t)
	p.waitServing(t, p.dial(t))
	const n = 50
	answers := make(chan string, n)
	for range n {
		conn, err := net.Dial("tcp", p.http)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		// Headers whole, a body of 1 MiB announced, one byte of it sent.
		if _, err := conn.Write([]byte("POST /idemledger.v1.LedgerService/Begin HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{")); err != nil {
			t.Fatal(err)
		}
		go func() {
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, _ := bufio.NewReader(conn).ReadString('\n')
			answers <- line
		}()
	}
	for range n {
		if line := <-answers; !strings.HasPrefix(line, "HTTP/1.1 401") {
			t.Fatalf("a slow unauthenticated body was answered %q, want 401 at once", line)
		}
	}
	// Starved, it would wait for the slow bodies (the issue saw 30 s and
	// more); the deadline says it was not.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	begin := `{"tenant":"acme","key":"k","fingerprint":"` + ledgertest.Fingerprint("p") + `","method":"http:POST /v1/invoices"}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.http+"/idemledger.v1.LedgerService/Begin", strings.NewReader(begin))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("an authenticated call beside them: %v", err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("an authenticated call beside them: %d", res.StatusCode)
	}
}

// TestHTTPListenerCarriesUnknownTypesAsBytes: an outcome whose type
// ledgerd does not know (an MCP result, a write service's own message)
// travels over Connect JSON as {"@type": its URL, "value": base64 of its
// bytes}, both ways: completed over JSON, it is stored as those bytes
// (gRPC replays them as they were), and replayed over JSON the same way;
// never an untyped error.
func TestHTTPListenerCarriesUnknownTypesAsBytes(t *testing.T) {
	t.Parallel() // its own process and directory
	p, token := withToken(t)
	conn := p.dial(t)
	p.waitServing(t, conn)
	value := []byte(`{"content":[{"type":"text","text":"inv_7"}]}`)
	b64 := base64.StdEncoding.EncodeToString(value)
	for _, url := range []string{"type.idemledger.io/mcp.CallToolResult", "type.googleapis.com/billing.v1.Invoice"} {
		key := "opaque-" + url[len(url)-7:]
		begin := `{"tenant":"acme","key":"` + key + `","fingerprint":"` + ledgertest.Fingerprint("p") + `","method":"/billing.v1.Invoices/Create"}`
		if status, body := postJSON(t, p.http, "Begin", token, begin); status != http.StatusOK {
			t.Fatalf("Begin: %d %s", status, body)
		}
		outcome := `{"response":{"@type":"` + url + `","value":"` + b64 + `"}}`
		if status, body := postJSON(t, p.http, "Complete", token, `{"tenant":"acme","key":"`+key+`","token":"1","outcome":`+outcome+`}`); status != http.StatusOK {
			t.Fatalf("Complete %s over JSON: %d %s", url, status, body)
		}
		status, body := postJSON(t, p.http, "Begin", token, begin)
		if status != http.StatusOK || !bytes.Contains(body, []byte(`"@type":"`+url+`"`)) || !bytes.Contains(body, []byte(`"value":"`+b64+`"`)) {
			t.Fatalf("the replay of %s over JSON: %d %s", url, status, body)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
		res, err := ledgerv1.NewLedgerServiceClient(conn).Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: key,
			Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.Invoices/Create"})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.GetReplay().GetOutcome().GetResponse(); got.GetTypeUrl() != url || !bytes.Equal(got.GetValue(), value) {
			t.Fatalf("the replay of %s over gRPC: %v", url, got)
		}
	}
}
