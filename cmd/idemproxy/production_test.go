package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// pki is a CA, ledgerd's certificate for ledgerd.test, and a client
// certificate, as files in dir.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
	pool                                             *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	ca := servertest.NewCA(t)
	p := pki{ca: filepath.Join(dir, "ca.crt"), pool: ca.Pool}
	if err := os.WriteFile(p.ca, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	p.serverCert, p.serverKey = servertest.WriteFiles(t, dir, "server", ca.Issue(t, servertest.Leaf{CommonName: "ledgerd.test", DNSNames: []string{"ledgerd.test"}, Server: true}))
	p.clientCert, p.clientKey = servertest.WriteFiles(t, dir, "client", ca.Issue(t, servertest.Leaf{CommonName: "idemproxy"}))
	return p
}

// tlsLedger serves a ledger over TLS that requires a client certificate
// of p's CA, as ledgerd with --tls-cert and --client-ca does.
func tlsLedger(t *testing.T, p pki) string {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.serverCert, p.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientCAs: p.pool, ClientAuth: tls.RequireAndVerifyClientCert})))
	ledgerv1.RegisterLedgerServiceServer(gs, servertest.MemoryLedgerAt("tools", nil))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// TestLedgerOverMutualTLS: idemproxy reaches a ledgerd that serves TLS and
// requires a client certificate, with the CA, its certificate and the
// server name from the file's ledger.tls: a protected request is done once
// and replayed. Without its certificate the ledger refuses the handshake,
// and the request fails closed: 503, UNAVAILABLE, the upstream not
// called.
func TestLedgerOverMutualTLS(t *testing.T) {
	p := newPKI(t)
	addr := tlsLedger(t, p)
	api := &invoiceAPI{}
	upstream := api.serve(t)
	proxyWith := func(tlsCfg ledgerTLS) string {
		var cfg fileConfig
		cfg.Ledger.Address, cfg.Ledger.TLS = addr, tlsCfg
		cfg.HTTP = &httpConfig{Upstream: upstream, Tenant: tenantConfig{Header: "X-Tenant"}, Routes: map[string]routeConfig{"POST /v1/invoices": {}}}
		return httpProxyWith(t, cfg)
	}
	mutual := proxyWith(ledgerTLS{CAFile: p.ca, CertFile: p.clientCert, KeyFile: p.clientKey, ServerName: "ledgerd.test"})
	first := postInvoice(t, mutual, "tls-1", `{"amount":1}`)
	again := postInvoice(t, mutual, "tls-1", `{"amount":1}`)
	if first.status != http.StatusCreated || again.header.Get("Idempotency-Replayed") != "true" || again.body != first.body {
		t.Fatalf("over mutual TLS: %d %q, then %d %q %v", first.status, first.body, again.status, again.body, again.header)
	}
	if n := len(api.writes()); n != 1 {
		t.Fatalf("the upstream wrote %d times", n)
	}

	noCert := proxyWith(ledgerTLS{CAFile: p.ca, ServerName: "ledgerd.test"})
	refused := postInvoice(t, noCert, "tls-2", `{"amount":2}`)
	if refused.status != http.StatusServiceUnavailable || !strings.Contains(refused.body, `"UNAVAILABLE"`) || len(api.writes()) != 1 {
		t.Fatalf("without a client certificate: %d %q, %d writes", refused.status, refused.body, len(api.writes()))
	}
}

// TestFlagsFromTheEnvironment: every flag may come from IDEMPROXY_<NAME>,
// a flag on the command line wins, and the ledger's flags override the
// file.
func TestFlagsFromTheEnvironment(t *testing.T) {
	t.Setenv("IDEMPROXY_LEDGER_CA", "/env/ca.crt")
	t.Setenv("IDEMPROXY_LEDGER_CERT", "/env/tls.crt")
	t.Setenv("IDEMPROXY_LEDGER_KEY", "/env/tls.key")
	t.Setenv("IDEMPROXY_LEDGER_SERVER_NAME", "ledgerd.idemledger.svc")
	t.Setenv("IDEMPROXY_ADMIN_LISTEN", "127.0.0.1:9999")
	t.Setenv("IDEMPROXY_LOG_FORMAT", "text")
	t.Setenv("IDEMPROXY_LEDGER", "ledgerd:7070")
	f, err := parseFlags([]string{"--ledger", "flag:7070"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var cfg fileConfig
	cfg.Ledger.Address = "file:7070"
	f.apply(&cfg)
	want := ledgerTLS{CAFile: "/env/ca.crt", CertFile: "/env/tls.crt", KeyFile: "/env/tls.key", ServerName: "ledgerd.idemledger.svc"}
	if cfg.Ledger.TLS != want || !cfg.Ledger.TLS.on() || f.adminListen != "127.0.0.1:9999" || f.logFormat != "text" || cfg.Ledger.Address != "flag:7070" {
		t.Fatalf("flags %+v, ledger %+v", f, cfg.Ledger)
	}
	var stderr bytes.Buffer
	if code := cli([]string{"--log-format", "yaml"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "json or text") {
		t.Fatalf("--log-format yaml: exit %d, %q", code, stderr.String())
	}
}

// TestTenantNotCoveredIs403: a request whose tenant header names a tenant
// the proxy's ledger token does not cover is refused 403
// PERMISSION_DENIED, typed, and the upstream is not called; its own
// tenant's request goes through.
func TestTenantNotCoveredIs403(t *testing.T) {
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("proxy-secret") + " billing acme\n"))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: tokens}))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("proxy-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api := &invoiceAPI{}
	var cfg fileConfig
	cfg.Ledger.Address, cfg.Ledger.TokenFile = lis.Addr().String(), tokenFile
	cfg.HTTP = &httpConfig{Upstream: api.serve(t), Tenant: tenantConfig{Header: "X-Tenant"}, Routes: map[string]routeConfig{"POST /v1/invoices": {}}}
	base := httpProxyWith(t, cfg)

	post := func(tenant string) reply {
		return postInvoiceAs(t, base, tenant, `"k-`+tenant+`"`, `{"amount":1}`)
	}
	if r := post("globex"); r.status != http.StatusForbidden || !strings.Contains(r.body, `"code":"PERMISSION_DENIED"`) || !strings.Contains(r.body, "permission-denied") {
		t.Fatalf("another tenant: %d %q", r.status, r.body)
	}
	if n := len(api.writes()); n != 0 {
		t.Fatalf("the upstream wrote %d times for a refused tenant", n)
	}
	if r := post("acme"); r.status != http.StatusCreated {
		t.Fatalf("its own tenant: %d %q", r.status, r.body)
	}
}

// TestRouteWithoutAMethodWarns: a protected route whose pattern names no
// method (and that lists none) is said at start, since every method but
// POST and PATCH passes it unguarded; a route with its method is not.
func TestRouteWithoutAMethodWarns(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	cfg := &httpConfig{Upstream: "http://127.0.0.1:1", Tenant: tenantConfig{Static: "acme"},
		Routes: map[string]routeConfig{"/v1/things": {}, "POST /v1/invoices": {}, "/v1/listed": {Methods: []string{"PUT"}}}}
	if err := cfg.check(); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := httpHandler(cfg, ledgerv1.NewLedgerServiceClient(conn), prometheus.NewRegistry(), log); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if strings.Count(out, "names no method") != 1 || !strings.Contains(out, `"route":"/v1/things"`) {
		t.Fatalf("want one warning, for /v1/things:\n%s", out)
	}
}

// TestProxyMetrics: the admin listener's /metrics has the proxy's own
// build-info metric and the latency of each protected route.
func TestProxyMetrics(t *testing.T) {
	api := &invoiceAPI{}
	var cfg fileConfig
	cfg.Ledger.Address = ledgerAddr(t)
	cfg.HTTP = &httpConfig{Upstream: api.serve(t), Tenant: tenantConfig{Header: "X-Tenant"}, Routes: map[string]routeConfig{"POST /v1/invoices": {}}}
	front, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := contextWithCancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, flags{drainTimeout: 5 * time.Second}, cfg, &listeners{front: front, admin: admin}, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("idemproxy: %v", err)
		}
	})
	base := "http://" + front.Addr().String()
	postInvoice(t, base, "m-1", `{"amount":1}`)
	postInvoice(t, base, "m-1", `{"amount":1}`)
	res, err := http.Get("http://" + admin.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`idemproxy_build_info{goversion="go`,
		`idemproxy_http_request_seconds_count{replayed="false",route="POST /v1/invoices"} 1`,
		`idemproxy_http_request_seconds_count{replayed="true",route="POST /v1/invoices"} 1`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(string(b), "idemledger_build_info") {
		t.Error("idemproxy exports ledgerd's build-info metric")
	}
}
