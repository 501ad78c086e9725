package server_test

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestMutualTLS serves the ledger over real TLS on a loopback port, with
// client certificates verified when given and bearer tokens as the other
// way in, and calls it with certificates that name principals in each way a
// certificate can.
func TestMutualTLS(t *testing.T) {
	t.Parallel()
	ca, stranger := servertest.NewCA(t), servertest.NewCA(t)
	certs, err := server.ParseCertificates(strings.NewReader(
		"# SPIFFE ID of the billing service\n" +
			"uri:spiffe://platform.test/ns/billing/sa/invoices billing acme\n" +
			"dns:refunds.platform.test refunds *\n" +
			"cn:ops ops *\n"))
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("s3cret") + " tokens acme\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: server.AnyOf(certs, tokens)})
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, servertest.Leaf{CommonName: "ledgerd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})},
		ClientCAs:    ca.Pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS13,
	})))
	ledgerv1.RegisterLedgerServiceServer(gs, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	call := func(t *testing.T, cert *tls.Certificate, token, tenant string) error {
		cfg := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS13}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx := t.Context()
		if token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		_, err = ledgerv1.NewLedgerServiceClient(conn).Lookup(ctx, &ledgerv1.LookupRequest{Tenant: tenant, Key: "k"})
		return err
	}
	issue := func(leaf servertest.Leaf) *tls.Certificate { c := ca.Issue(t, leaf); return &c }
	billing := issue(servertest.Leaf{CommonName: "ops", URIs: []string{"spiffe://platform.test/ns/billing/sa/invoices"}})
	tests := []struct {
		name   string
		cert   *tls.Certificate
		token  string
		tenant string
		want   errcode.Code
	}{
		{"NoCredentials", nil, "", "acme", errcode.Unauthenticated},
		{"URISANBeforeCommonName", billing, "", "acme", errcode.NotFound},
		{"URISANOtherTenant", billing, "", "globex", errcode.PermissionDenied},
		{"DNSSAN", issue(servertest.Leaf{DNSNames: []string{"refunds.platform.test"}}), "", "globex", errcode.NotFound},
		{"CommonName", issue(servertest.Leaf{CommonName: "ops"}), "", "initech", errcode.NotFound},
		{"UnknownCertificate", issue(servertest.Leaf{CommonName: "intruder", URIs: []string{"spiffe://platform.test/ns/other"}}), "", "acme", errcode.Unauthenticated},
		{"TokenWithoutCertificate", nil, "s3cret", "acme", errcode.NotFound},
		{"UnknownCertificateThenToken", issue(servertest.Leaf{CommonName: "intruder"}), "s3cret", "acme", errcode.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { ledgertest.WantStatus(t, call(t, tt.cert, tt.token, tt.tenant), tt.want) })
	}
	t.Run("CertificateOfAnotherCA", func(t *testing.T) {
		c := stranger.Issue(t, servertest.Leaf{CommonName: "ops"})
		err := call(t, &c, "", "acme")
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("a certificate of another CA: %v, want the handshake refused (UNAVAILABLE)", err)
		}
	})
}

func TestParseCertificates(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{
		"spiffe://x billing acme",
		"uri: billing acme",
		"cn:ops billing",
		"cn:ops bad\x01ns acme",
		"cn:ops billing bad\x01tenant",
		"cn:ops billing acme\ncn:ops billing globex",
	} {
		if _, err := server.ParseCertificates(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseCertificates(%q) accepted it", bad)
		}
	}
}
