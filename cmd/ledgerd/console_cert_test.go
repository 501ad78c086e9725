package main_test

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestConsoleSignsInByCertificate: with --admin-tls, the admin listener
// serves TLS and the certificate decides. An admin's certificate signs in
// with no token, and settles a key; a write service's certificate, one of
// no principal, and none are refused; the session's cookie does not
// serve a connection with another certificate; probes and scrapers
// without a certificate still read /metrics and /healthz.
func TestConsoleSignsInByCertificate(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	dir := t.TempDir()
	ca := servertest.NewCA(t)
	certFile, keyFile := servertest.WriteFiles(t, dir, "server", ca.Issue(t, servertest.Leaf{CommonName: "ledgerd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true}))
	caFile, certsFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "certs")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certsFile, []byte("uri:spiffe://platform.test/billing billing acme\ncn:ops-carol _admin ops-carol\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", filepath.Join(dir, "data"), "--tls-cert", certFile, "--tls-key", keyFile, "--client-ca", caFile, "--certs", certsFile, "--admin-tls")
	billing := ca.Issue(t, servertest.Leaf{URIs: []string{"spiffe://platform.test/billing"}})
	admin := ca.Issue(t, servertest.Leaf{CommonName: "ops-carol"})
	conn := func(cert tls.Certificate) *grpc.ClientConn {
		c, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	writes := conn(billing)
	p.waitServing(t, writes)
	lc := ledgerv1.NewLedgerServiceClient(writes)
	begun, err := lc.Begin(t.Context(), &ledgerv1.BeginRequest{Tenant: "acme", Key: "inv-1", Method: "/billing.v1.Invoices/Create", Fingerprint: "v1:" + strings.Repeat("ab", 32)})
	if err != nil {
		t.Fatal(err)
	}
	outcome := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.example/Invoice", Value: []byte("inv_1")}}}
	if _, err := lc.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "inv-1", Token: begun.GetClaim().GetToken(), Outcome: outcome}); err != nil {
		t.Fatal(err)
	}

	client := func(certs ...tls.Certificate) *http.Client {
		jar, _ := cookiejar.New(nil)
		return &http.Client{Jar: jar, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}}}
	}
	base := "https://" + p.admin
	get := func(c *http.Client, path string) (int, string) {
		t.Helper()
		res, err := c.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	bare := client()
	for _, path := range []string{"/metrics", "/healthz"} {
		if code, _ := get(bare, path); code != http.StatusOK {
			t.Fatalf("GET %s without a certificate: %d, want 200", path, code)
		}
	}
	if code, body := get(bare, "/console/"); code != http.StatusOK || !strings.Contains(body, `id="signin"`) || strings.Contains(body, `id="certificate"`) {
		t.Fatalf("the console without a certificate: %d, want the token form:\n%s", code, body)
	}
	if code, body := get(client(billing), "/console/"); code != http.StatusForbidden || !strings.Contains(body, "a write service&#39;s (namespace billing)") {
		t.Fatalf("the console with a write service's certificate: %d, want 403:\n%s", code, body)
	}
	if code, body := get(client(ca.Issue(t, servertest.Leaf{CommonName: "mallory"})), "/console/"); code != http.StatusUnauthorized || !strings.Contains(body, "names no principal") {
		t.Fatalf("the console with a certificate of no principal: %d, want 401:\n%s", code, body)
	}
	if _, err := client(servertest.NewCA(t).Issue(t, servertest.Leaf{CommonName: "ops-carol"})).Get(base + "/console/"); err == nil {
		t.Fatal("a certificate of another CA: the handshake went through")
	}

	ops := client(admin)
	if code, body := get(ops, "/console/login"); code != http.StatusOK || !strings.Contains(body, "CN=ops-carol") {
		t.Fatalf("the sign-in page with the admin's certificate: %d, want it named:\n%s", code, body)
	}
	code, body := get(ops, "/console/record?namespace=billing&tenant=acme&key=inv-1")
	if code != http.StatusOK || !strings.Contains(body, "ops-carol") || !strings.Contains(body, "inv-1") {
		t.Fatalf("the record page with the admin's certificate: %d:\n%s", code, body)
	}
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no CSRF token on the record page:\n%s", body)
	}
	form := url.Values{"csrf": {m[1]}, "namespace": {"billing"}, "tenant": {"acme"}, "key": {"inv-1"}, "confirm": {"inv-1"}}

	// The cookie alone signs nobody in: on a connection with the write
	// service's certificate, the admin's session does not serve.
	stolen := client(billing)
	u, _ := url.Parse(base + "/console/")
	stolen.Jar.SetCookies(u, ops.Jar.Cookies(u))
	res, err := stolen.PostForm(base+"/console/record/purge", form)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "a write service&#39;s (namespace billing)") {
		t.Fatalf("the admin's cookie with the write service's certificate: %d, want 403 at sign-in:\n%s", res.StatusCode, b)
	}

	records := ledgerv1.NewAdminServiceClient(conn(admin))
	if _, err := records.GetRecord(t.Context(), &ledgerv1.GetRecordRequest{Namespace: "billing", Tenant: "acme", Key: "inv-1"}); err != nil {
		t.Fatalf("the record after the refused purge: %v", err)
	}
	res, err = ops.PostForm(base+"/console/record/purge", form)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(b), "purged") {
		t.Fatalf("purge with the admin's certificate: %d:\n%s", res.StatusCode, b)
	}
	_, err = records.GetRecord(t.Context(), &ledgerv1.GetRecordRequest{Namespace: "billing", Tenant: "acme", Key: "inv-1"})
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.NotFound {
		t.Fatalf("the record after the console purged it: %v, want NOT_FOUND", err)
	}
	logs := p.logs()
	for _, want := range []string{`"msg":"audit: console sign-in","audit":true,"principal":"ops-carol"`, `"by":"certificate"`, `"reason":"a write service's certificate"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %s", want)
		}
	}
}
