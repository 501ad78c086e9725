package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
)

// TestConsoleInABrowser drives the operator's console in headless
// Chromium against a real ledgerd whose records were made by real guarded
// HTTP calls (httpguard, through ledgerclient, with a write service's
// token): a write token does not sign in; the admin signs in, finds the
// tenant's OUTCOME_UNKNOWN key, reads a decoded outcome, resolves the key
// as not applied (the next Begin claims it with a higher token), purges a
// key, is refused without the form's CSRF token, and a stored <script>
// renders as text. With CONSOLE_SCREENSHOTS=<dir> it saves a screenshot
// of each page there (docs/console.md shows them). Without Chromium it
// skips, except under CI=true.
func TestConsoleInABrowser(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("chromium: %v (.ci/run installs it)", err)
		}
		t.Skipf("chromium: %v", err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("billing-secret")+" billing acme,globex\n"+
		server.HashToken("ops-secret")+" _admin ops-alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens, "--census-interval", "1s")
	conn := p.dial(t)
	p.waitServing(t, conn)
	keys := guardedCalls(t, ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn),
		ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer billing-secret"))))

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	base := "http://" + p.admin + "/console/"
	shots := os.Getenv("CONSOLE_SCREENSHOTS")
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	textOf := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("the text of %s: %v", sel, err)
		}
		return s
	}
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// act submits a record's action form, confirmed with its key, and
	// returns what the console says it did.
	act := func(key, form string) string {
		t.Helper()
		do("submit "+form+" of "+key,
			chromedp.Navigate(base+"record?namespace=billing&tenant=acme&key="+key),
			chromedp.WaitVisible(chromedp.CSS(form)),
			chromedp.SendKeys(chromedp.CSS(form+" input[name=confirm]"), key),
			chromedp.Submit(chromedp.CSS(form)),
			chromedp.WaitVisible(chromedp.CSS("#done")))
		return textOf("#done")
	}
	var text string

	// A write service's token does not sign in.
	do("open the console", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#token")))
	shot("login")
	do("sign in with a write token",
		chromedp.SendKeys(chromedp.CSS("#token"), "billing-secret"),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#error")))
	if text = textOf("#error"); !strings.Contains(text, "write service") {
		t.Fatalf("a write token: %q", text)
	}

	// The admin signs in and finds the tenant's unknown key.
	do("sign in as the admin",
		chromedp.SendKeys(chromedp.CSS("#token"), "ops-secret"),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#census")))
	shot("overview")
	do("search the tenant's outcome_unknown keys",
		chromedp.Navigate(base+"records"),
		chromedp.WaitVisible(chromedp.CSS("#namespace")),
		chromedp.SendKeys(chromedp.CSS("#namespace"), "billing"),
		chromedp.SendKeys(chromedp.CSS("#tenant"), "acme"),
		chromedp.SetValue(chromedp.CSS("#state"), "outcome_unknown"),
		chromedp.Click(chromedp.CSS("#search")),
		chromedp.WaitVisible(chromedp.CSS("#results")))
	shot("search")
	if text = textOf("#results tbody"); !strings.Contains(text, keys.unknown) || strings.Contains(text, keys.done) {
		t.Fatalf("the unknown keys of acme: %q, want %s alone", text, keys.unknown)
	}
	do("open the unknown key", chromedp.Click(chromedp.CSS("a.key")), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	if text = textOf("#state"); text != "outcome_unknown" {
		t.Fatalf("the record's state: %q", text)
	}

	// A completed key's outcome, decoded: the HTTP status and its JSON body.
	do("read a decoded outcome",
		chromedp.Navigate(base+"record?namespace=billing&tenant=acme&key="+keys.done),
		chromedp.WaitVisible(chromedp.CSS("#outcome")))
	shot("record")
	if status, body := textOf("#outcome-status"), textOf("#outcome"); status != "201" || !strings.Contains(body, `"invoice": "inv_`) {
		t.Fatalf("the decoded outcome: status %q, body %q", status, body)
	}

	// A stored <script> is text, and runs nothing.
	do("render a stored script",
		chromedp.Navigate(base+"record?namespace=billing&tenant=acme&key="+keys.script),
		chromedp.WaitVisible(chromedp.CSS("#outcome")))
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned === true`))
	if err != nil {
		t.Fatal(err)
	}
	if body := textOf("#outcome"); pwned || !strings.Contains(body, "<script>window.pwned = true</script>") {
		t.Fatalf("a stored script: ran %v, shown as %q", pwned, body)
	}

	// Without the form's CSRF token, nothing is done.
	do("purge without the CSRF token",
		chromedp.Navigate(base+"record?namespace=billing&tenant=acme&key="+keys.done),
		chromedp.WaitVisible(chromedp.CSS("#purge-key")))
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector("#purge-key input[name=csrf]").remove(), true`)); err != nil {
		t.Fatal(err)
	}
	do("submit the form",
		chromedp.SendKeys(chromedp.CSS("#purge-key input[name=confirm]"), keys.done),
		chromedp.Submit(chromedp.CSS("#purge-key")),
		chromedp.WaitVisible(chromedp.CSS("#error")))
	if text = textOf("#error"); !strings.Contains(text, "CSRF") {
		t.Fatalf("a form without its CSRF token: %q", text)
	}
	if _, err := getRecord(t, conn, keys.done); err != nil {
		t.Fatalf("the record after a refused purge: %v", err)
	}

	// Resolve the unknown key as not applied: the next attempt claims it
	// afresh, with a higher token.
	before, err := getRecord(t, conn, keys.unknown)
	if err != nil {
		t.Fatal(err)
	}
	if text = act(keys.unknown, "#resolve-not-applied"); !strings.Contains(text, "not applied") {
		t.Fatalf("resolved: %q", text)
	}
	res, err := ledgerv1.NewLedgerServiceClient(conn).Begin(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer billing-secret"),
		&ledgerv1.BeginRequest{Tenant: "acme", Key: keys.unknown, Fingerprint: before.GetRecord().GetRecord().GetFingerprint(), Method: before.GetRecord().GetRecord().GetMethod()})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetClaim().GetToken() <= before.GetRecord().GetToken() {
		t.Fatalf("the Begin after the resolution: %v, want a claim above token %d", res, before.GetRecord().GetToken())
	}
	// The record's timeline says who resolved it.
	do("read the timeline", chromedp.Navigate(base+"record?namespace=billing&tenant=acme&key="+keys.unknown), chromedp.WaitVisible(chromedp.CSS("#timeline")))
	if text = textOf("#timeline"); !strings.Contains(text, "resolved as not applied by ops-alice") {
		t.Fatalf("the timeline after the resolution: %q", text)
	}

	// Purge a key.
	if text = act(keys.done, "#purge-key"); !strings.HasPrefix(text, "purged") {
		t.Fatalf("purged: %q", text)
	}
	_, err = getRecord(t, conn, keys.done)
	if le := ledgerstatus.FromError(err); le.Code != errcode.NotFound {
		t.Fatalf("the purged record: %v, want NOT_FOUND", err)
	}

	// The audit page names who did it.
	do("read the audit", chromedp.Navigate(base+"audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	shot("audit")
	text = textOf("#audit tbody")
	for _, want := range []string{"record resolved", "key purged", "console request refused", "console sign-in refused", "ops-alice", keys.unknown} {
		if !strings.Contains(text, want) {
			t.Fatalf("the audit page has no %q:\n%s", want, text)
		}
	}
}

// consoleKeys are the keys guardedCalls made.
type consoleKeys struct{ done, script, unknown string }

// guardedCalls makes records of tenant acme with real guarded calls: a
// completed invoice, one whose stored body is a <script>, and one whose
// outcome is unknown (the handler could not tell; its HOLD lease ran
// out).
func guardedCalls(t *testing.T, lc *ledgerclient.Client) consoleKeys {
	t.Helper()
	t.Cleanup(func() { _ = lc.Close() })
	gd, err := guard.New(lc)
	if err != nil {
		t.Fatal(err)
	}
	hg, err := httpguard.New(gd, httpguard.WithTenant(httpguard.Tenant("acme")),
		httpguard.WithRoute("POST /v1/invoices", httpguard.Route{Policy: guard.Policy{Lease: time.Second, OnLeaseExpiry: guard.Hold}}))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/invoices", hg.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "unknown"):
			httpguard.MarkOutcomeUnknown(r)
			w.WriteHeader(http.StatusBadGateway)
		case strings.Contains(string(b), "script"):
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, "<script>window.pwned = true</script>")
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = fmt.Fprintf(w, `{"invoice":"inv_%d"}`, time.Now().UnixNano())
		}
	})))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	k := consoleKeys{done: "inv-done-" + ledgertest.Fingerprint("a")[3:11], script: "inv-script", unknown: "inv-unknown"}
	for key, body := range map[string]string{k.done: `{"customer":"c1"}`, k.script: `{"customer":"script"}`, k.unknown: `{"customer":"unknown"}`} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/invoices", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
	}
	// The unknown key's lease runs out on ledgerd's clock: poll until it
	// reads OUTCOME_UNKNOWN.
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		res, err := lc.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: k.unknown})
		return err == nil && res.GetRecord().GetState() == ledgerv1.State_STATE_OUTCOME_UNKNOWN
	}, "the unknown key reads OUTCOME_UNKNOWN")
	return k
}

// getRecord reads billing's record of acme's key as the admin.
func getRecord(t *testing.T, conn grpc.ClientConnInterface, key string) (*ledgerv1.GetRecordResponse, error) {
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer ops-secret")
	return ledgerv1.NewAdminServiceClient(conn).GetRecord(ctx, &ledgerv1.GetRecordRequest{Namespace: "billing", Tenant: "acme", Key: key})
}
