package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// invoiceAPI is an HTTP API in front of which the proxy runs: POST
// /v1/invoices writes a row each time it runs (no idempotency of its own)
// and answers with the claim token the proxy forwarded; hangUp makes the
// next POST write, then cut the connection.
type invoiceAPI struct {
	mu     sync.Mutex
	tokens []string
	gets   atomic.Int64
	conns  atomic.Int64 // the connections it accepted
	hangUp atomic.Bool
	// hold, when set, runs in every POST before its write: a test holds
	// the write there.
	hold func(r *http.Request)
}

func (a *invoiceAPI) serve(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/invoices", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // read first: the server then sees its client go
		if a.hold != nil {
			a.hold(r)
		}
		a.mu.Lock()
		a.tokens = append(a.tokens, r.Header.Get(ClaimTokenHeader))
		n := len(a.tokens)
		a.mu.Unlock()
		if a.hangUp.CompareAndSwap(true, false) {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/invoices/inv_%d", n))
		w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"id":"inv_%d","token":%q,"request":%s}`, n, r.Header.Get(ClaimTokenHeader), body)
	})
	mux.HandleFunc("GET /v1/invoices/{id}", func(w http.ResponseWriter, r *http.Request) {
		a.gets.Add(1)
		_, _ = fmt.Fprintf(w, `{"id":%q}`, r.PathValue("id"))
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			a.conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func (a *invoiceAPI) writes() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.tokens...)
}

// httpProxy runs idemproxy in HTTP mode in front of upstream.
func httpProxy(t *testing.T, upstream string, route routeConfig) string {
	t.Helper()
	return httpProxyOn(t, ledgerAddr(t), upstream, route)
}

// httpProxyOn is httpProxy on the ledger at ledger.
func httpProxyOn(t *testing.T, ledger, upstream string, route routeConfig) string {
	t.Helper()
	var cfg fileConfig
	cfg.Ledger.Address = ledger
	cfg.HTTP = &httpConfig{Upstream: upstream, Tenant: tenantConfig{Header: "X-Tenant"}, Routes: map[string]routeConfig{"POST /v1/invoices": route}}
	return httpProxyWith(t, cfg)
}

// httpProxyWith runs idemproxy in HTTP mode with cfg.
func httpProxyWith(t *testing.T, cfg fileConfig) string {
	t.Helper()
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := contextWithCancel()
	go func() {
		done <- run(ctx, flags{drainTimeout: 5 * time.Second}, cfg, &listeners{front: l}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		// The client may hold a connection it dialed for the parallel
		// duplicates and never used; the server counts it as active for
		// 5 s, past the drain timeout. Closing the client's idle
		// connections first lets the drain see every connection gone.
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("idemproxy: %v", err)
		}
	})
	return "http://" + l.Addr().String()
}

type reply struct {
	status int
	header http.Header
	body   string
}

func postInvoice(t *testing.T, base, key, body string) reply {
	t.Helper()
	return postInvoiceKeyed(t, base, `"`+key+`"`, body)
}

// postInvoiceKeyed is postInvoice with the Idempotency-Key header's value
// as given.
func postInvoiceKeyed(t *testing.T, base, header, body string) reply {
	t.Helper()
	return postInvoiceAs(t, base, "acme", header, body)
}

// postInvoiceAs is postInvoiceKeyed for tenant.
func postInvoiceAs(t *testing.T, base, tenant, header, body string) reply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/invoices", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", tenant)
	if header != "" {
		req.Header.Set(httpguard.KeyHeader, header)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return reply{res.StatusCode, res.Header, string(b)}
}

// TestHTTPModeKeepsItsUpstreamConnections: 32 protected requests at once,
// ten times over, reach the upstream over no more connections than there
// were requests at once. Go's transport puts a connection back before
// the proxy's read of the response's end returns, so each round finds the
// last one's idle; with http.DefaultTransport's 2 idle connections a host
// the proxy dialed most of them anew (and the upstream accepted them).
func TestHTTPModeKeepsItsUpstreamConnections(t *testing.T) {
	t.Parallel()
	api := &invoiceAPI{}
	base := httpProxy(t, api.serve(t), routeConfig{})
	const atOnce, rounds = 32, 10
	for r := range rounds {
		var wg sync.WaitGroup
		for i := range atOnce {
			wg.Go(func() {
				if got := postInvoice(t, base, fmt.Sprintf("k-%d-%d", r, i), `{"customer":"cus_1"}`); got.status != http.StatusCreated {
					t.Errorf("POST: %d %s", got.status, got.body)
				}
			})
		}
		wg.Wait()
	}
	if n := len(api.writes()); n != atOnce*rounds {
		t.Fatalf("%d writes, want %d", n, atOnce*rounds)
	}
	if n := api.conns.Load(); n > atOnce {
		t.Errorf("the upstream accepted %d connections for %d rounds of %d requests at once, want at most %d", n, rounds, atOnce, atOnce)
	}
}

// TestHTTPModeTakesBareKeys: a bare UUID that starts with a digit, and
// stripe-go's own key, pass the proxy, and are the same keys quoted.
func TestHTTPModeTakesBareKeys(t *testing.T) {
	api := &invoiceAPI{}
	base := httpProxy(t, api.serve(t), routeConfig{})
	for _, key := range []string{"0e03978e-40d5-43e8-bc93-6894a57f9324", "1796182444475302461_B8TIFA"} {
		first := postInvoiceKeyed(t, base, key, `{"amount":1}`)
		again := postInvoice(t, base, key, `{"amount":1}`)
		if first.status != http.StatusCreated || again.body != first.body || again.header.Get(httpguard.ReplayedHeader) != "true" {
			t.Fatalf("%s: %+v, then quoted %+v", key, first, again)
		}
	}
	if w := api.writes(); len(w) != 2 {
		t.Fatalf("%d writes, want 2: %v", len(w), w)
	}
}

// TestHTTPModeKeyFromTheBody: a route's key_pointer and
// fingerprint_pointers reach httpguard: the key from the body, and a retry
// that differs outside the named parts is the replay.
func TestHTTPModeKeyFromTheBody(t *testing.T) {
	api := &invoiceAPI{}
	base := httpProxy(t, api.serve(t), routeConfig{KeyPointer: "/request_id", FingerprintPointers: []string{"/amount"}})
	first := postInvoiceKeyed(t, base, "", `{"request_id":"b-1","amount":1,"note":"a"}`)
	again := postInvoiceKeyed(t, base, "", `{"request_id":"b-1","amount":1,"note":"b"}`)
	if first.status != http.StatusCreated || again.header.Get(httpguard.ReplayedHeader) != "true" || again.body != first.body || len(api.writes()) != 1 {
		t.Fatalf("first %+v, again %+v, %d writes", first, again, len(api.writes()))
	}
}

// TestHTTPModeStripe: with stripe: true, the proxy answers by Stripe's
// conventions: a replay says Idempotent-Replayed and keeps the upstream's
// Request-Id, a reused key is 400 idempotency_error, and each answer of
// the guard says Stripe-Should-Retry.
func TestHTTPModeStripe(t *testing.T) {
	api := &invoiceAPI{}
	upstream := api.serve(t)
	for _, section := range []bool{true, false} {
		var cfg fileConfig
		cfg.Ledger.Address = ledgerAddr(t)
		cfg.HTTP = &httpConfig{Upstream: upstream, Tenant: tenantConfig{Header: "X-Tenant"}, Stripe: section,
			Routes: map[string]routeConfig{"POST /v1/invoices": {Stripe: !section}}}
		base := httpProxyWith(t, cfg)
		first := postInvoice(t, base, "stripe-1", `{"amount":1}`)
		again := postInvoice(t, base, "stripe-1", `{"amount":1}`)
		if again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Stripe-Should-Retry") != "false" ||
			again.header.Get("Request-Id") == "" || again.header.Get("Request-Id") != first.header.Get("Request-Id") {
			t.Fatalf("section %v: the replay %v of %v", section, again.header, first.header)
		}
		reused := postInvoice(t, base, "stripe-1", `{"amount":2}`)
		if reused.status != http.StatusBadRequest || reused.header.Get("Stripe-Should-Retry") != "false" ||
			!strings.Contains(reused.body, `"type":"idempotency_error"`) || !strings.Contains(reused.body, `"code":"key_reused"`) {
			t.Fatalf("section %v: a reused key: %+v", section, reused)
		}
	}
}

// TestHTTPMode: the proxy in front of an HTTP API that has no idempotency
// of its own: one write per key through retries and parallel duplicates,
// identical replays, 422 for another body, the claim forwarded, other
// routes passed through.
func TestHTTPMode(t *testing.T) {
	api := &invoiceAPI{}
	base := httpProxy(t, api.serve(t), routeConfig{})
	first := postInvoice(t, base, "k-1", `{"amount":1}`)
	if first.status != http.StatusCreated || !strings.Contains(first.body, `"token":"1"`) {
		t.Fatalf("first: %+v", first)
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			again := postInvoice(t, base, "k-1", `{"amount":1.0}`)
			if again.status != first.status || again.body != first.body || again.header.Get(httpguard.ReplayedHeader) != "true" ||
				again.header.Get("Location") != first.header.Get("Location") {
				t.Errorf("replay: %+v, want %+v", again, first)
			}
		})
	}
	wg.Wait()
	var p httpguard.Problem
	if other := postInvoice(t, base, "k-1", `{"amount":2}`); other.status != http.StatusUnprocessableEntity || json.Unmarshal([]byte(other.body), &p) != nil || p.Code != "KEY_REUSED" {
		t.Fatalf("another body: %+v", other)
	}
	if w := api.writes(); len(w) != 1 {
		t.Fatalf("the API wrote %d times: %v", len(w), w)
	}
	res, err := http.Get(base + "/v1/invoices/inv_1")
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK || api.gets.Load() != 1 {
		t.Fatalf("GET through the proxy: %d", res.StatusCode)
	}
}

// TestHTTPModeUpstreamFailures: an API that hangs up after it received
// the request leaves the claim to run out (503 with Retry-After, then
// 409 while the lease holds); one that cannot be reached answers 502,
// which releases the key (the retry is sent again).
func TestHTTPModeUpstreamFailures(t *testing.T) {
	api := &invoiceAPI{}
	api.hangUp.Store(true)
	base := httpProxy(t, api.serve(t), routeConfig{policyConfig: policyConfig{Lease: duration(2 * time.Second), OnInProgress: "reject"}})
	cut := postInvoice(t, base, "k-cut", `{}`)
	if cut.status != http.StatusServiceUnavailable || cut.header.Get("Retry-After") == "" {
		t.Fatalf("an upstream that hung up: %+v", cut)
	}
	if again := postInvoice(t, base, "k-cut", `{}`); again.status != http.StatusConflict {
		t.Fatalf("within the lease: %+v", again)
	}
	if len(api.writes()) != 1 {
		t.Fatalf("%d writes", len(api.writes()))
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String()
	_ = l.Close()
	base = httpProxy(t, down, routeConfig{})
	for range 2 {
		if r := postInvoice(t, base, "k-down", `{}`); r.status != http.StatusBadGateway {
			t.Fatalf("an upstream that cannot be reached: %+v; want 502, released", r)
		}
	}
}

// TestHTTPModeRunOutlivesTheClient: a client that hangs up (curl -m)
// while the upstream writes does not cut the upstream call: it finishes,
// its response is stored, and the client's retry gets the replay; the
// upstream wrote once.
func TestHTTPModeRunOutlivesTheClient(t *testing.T) {
	started, release := make(chan struct{}, 1), make(chan struct{})
	api := &invoiceAPI{hold: func(r *http.Request) {
		if r.Header.Get(ClaimAttemptHeader) == "1" {
			started <- struct{}{}
			<-release
		}
	}}
	base := httpProxy(t, api.serve(t), routeConfig{})
	ctx, hangUp := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/invoices", strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "acme")
	req.Header.Set(httpguard.KeyHeader, `"hang-up"`)
	go func() { <-started; hangUp() }()
	if res, err := http.DefaultClient.Do(req); err == nil {
		_ = res.Body.Close()
		t.Fatalf("the request whose client hung up was answered %d", res.StatusCode)
	}
	close(release)
	again := postInvoice(t, base, "hang-up", `{"amount":1}`)
	if again.status != http.StatusCreated || again.header.Get(httpguard.ReplayedHeader) != "true" || len(api.writes()) != 1 {
		t.Fatalf("the retry = %+v, writes %v; want the first write's response, replayed", again, api.writes())
	}
}

// TestHTTPModeRunTimeout: the route's run timeout ends an upstream call
// that hangs, long before the HTTP client's own timeout: the client gets
// 503 (nobody knows whether the write happened), the key is not released,
// and after the lease the retry takes over with attempt 2.
func TestHTTPModeRunTimeout(t *testing.T) {
	api := &invoiceAPI{hold: func(r *http.Request) {
		if r.Header.Get(ClaimAttemptHeader) == "1" {
			<-r.Context().Done() // an upstream that never answers
		}
	}}
	clock := ledgertest.NewClock(time.Now())
	base := httpProxyOn(t, ledgerAddrAt(t, clock.Now), api.serve(t), routeConfig{policyConfig: policyConfig{
		Lease: duration(2 * time.Second), RunTimeout: duration(100 * time.Millisecond), OnInProgress: "reject",
	}})
	first := postInvoice(t, base, "hung", `{"amount":1}`)
	if first.status != http.StatusServiceUnavailable || first.header.Get("Retry-After") == "" || !strings.Contains(first.body, "run timeout") {
		t.Fatalf("a hung upstream past the run timeout = %+v; want 503 with Retry-After, naming the run timeout", first)
	}
	if dup := postInvoice(t, base, "hung", `{"amount":1}`); dup.status != http.StatusConflict {
		t.Fatalf("right after: %+v; want 409 (the claim is not released)", dup)
	}
	clock.Advance(3 * time.Second)
	again := postInvoice(t, base, "hung", `{"amount":1}`)
	if again.status != http.StatusCreated || !strings.Contains(again.body, `"token":"2"`) {
		t.Fatalf("after the lease: %+v; want the takeover's write under token 2", again)
	}
}

// TestHTTPModeBoundsWhatItRelays: a protected response over
// max_response_bytes is not held in the proxy's memory: the request ran
// once, and it and its retry answer 409 OUTCOME_TOO_LARGE.
func TestHTTPModeBoundsWhatItRelays(t *testing.T) {
	var writes atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/invoices", func(w http.ResponseWriter, _ *http.Request) {
		writes.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("x"), 64<<10))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var cfg fileConfig
	cfg.Ledger.Address = ledgerAddr(t)
	cfg.HTTP = &httpConfig{Upstream: srv.URL, Tenant: tenantConfig{Static: "acme"}, MaxResponseBytes: 4 << 10,
		Routes: map[string]routeConfig{"POST /v1/invoices": {}}}
	base := httpProxyWith(t, cfg)
	for range 2 {
		r := postInvoice(t, base, "big", `{}`)
		if r.status != http.StatusConflict || !strings.Contains(r.body, "OUTCOME_TOO_LARGE") {
			t.Fatalf("a response over the relay bound: %+v; want 409 OUTCOME_TOO_LARGE", r)
		}
	}
	if writes.Load() != 1 {
		t.Fatalf("the upstream wrote %d times, want 1", writes.Load())
	}
}
