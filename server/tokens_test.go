package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestBearerTokens(t *testing.T) {
	t.Parallel()
	file := "# billing's writer\n" +
		server.HashToken("s3cret-billing") + " billing acme,globex\n\n" +
		server.HashToken("s3cret-ops") + " ops *\n"
	if strings.Contains(file, "s3cret") {
		t.Fatal("the token file must hold hashes only")
	}
	tokens, err := server.ParseTokens(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	conn := servertest.NewServer(t, servertest.Ledger(server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: tokens}))).Dial(t)
	client := ledgerv1.NewLedgerServiceClient(conn)
	call := func(auth, tenant string) error {
		ctx := t.Context()
		if auth != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", auth)
		}
		_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: tenant, Key: "k"})
		return err
	}
	tests := []struct {
		name, auth, tenant string
		want               errcode.Code
	}{
		{"NoToken", "", "acme", errcode.Unauthenticated},
		{"UnknownToken", "Bearer guess", "acme", errcode.Unauthenticated},
		{"HashIsNoToken", "Bearer " + strings.TrimPrefix(server.HashToken("s3cret-billing"), "sha256:"), "acme", errcode.Unauthenticated},
		{"WrongScheme", "Basic s3cret-billing", "acme", errcode.Unauthenticated},
		{"AllowedTenant", "Bearer s3cret-billing", "acme", errcode.NotFound},
		{"LowercaseScheme", "bearer s3cret-billing", "globex", errcode.NotFound},
		{"OtherTenant", "Bearer s3cret-billing", "initech", errcode.PermissionDenied},
		{"Wildcard", "Bearer s3cret-ops", "initech", errcode.NotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { ledgertest.WantStatus(t, call(tt.auth, tt.tenant), tt.want) })
	}
	for _, bad := range []string{"sha256:abc billing acme", "md5:00 billing acme", server.HashToken("x") + " billing", server.HashToken("x") + " bad\x01ns acme"} {
		if _, err := server.ParseTokens(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseTokens(%q) accepted it", bad)
		}
	}
	if _, err := tokens.Authenticate(context.Background()); errcode.Of(err) != errcode.Unauthenticated {
		t.Fatalf("no metadata = %v", err)
	}
}

// BenchmarkTokenLookup shows the comparison's cost does not depend on which
// entry matches, or whether any does: every entry is compared, in constant
// time, on every call.
func BenchmarkTokenLookup(b *testing.B) {
	var file strings.Builder
	for i := range 64 {
		fmt.Fprintf(&file, "%s ns%d *\n", server.HashToken(fmt.Sprint("token-", i)), i)
	}
	tokens, err := server.ParseTokens(strings.NewReader(file.String()))
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct{ name, token string }{{"first", "token-0"}, {"last", "token-63"}, {"none", "guess"}} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tc.token))
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _ = tokens.Authenticate(ctx)
			}
		})
	}
}

// TestCredentialFilesAreGuarded: a token or certificate file that its group
// or others may write is refused (whoever can write it can add a `*`
// principal), and so is a file that lists one token twice or names a
// namespace of ledgerd's own.
func TestCredentialFilesAreGuarded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		return path
	}
	line := server.HashToken("s3cret") + " billing acme\n"
	for _, mode := range []os.FileMode{0o666, 0o620, 0o602} {
		if _, err := server.LoadTokens(write("tokens", line, mode)); err == nil || !strings.Contains(err.Error(), "writable") {
			t.Errorf("a token file of mode %04o: %v; want it refused", mode, err)
		}
		if _, err := server.LoadCertificates(write("certs", "cn:billing billing acme\n", mode)); err == nil || !strings.Contains(err.Error(), "writable") {
			t.Errorf("a certificate file of mode %04o: %v; want it refused", mode, err)
		}
	}
	for _, mode := range []os.FileMode{0o600, 0o640, 0o444} {
		if _, err := server.LoadTokens(write("tokens", line, mode)); err != nil {
			t.Errorf("a token file of mode %04o: %v", mode, err)
		}
	}
	for name, body := range map[string]string{
		"TwiceForOneNamespace":  line + line,
		"TwiceForTwoNamespaces": line + server.HashToken("s3cret") + " refunds acme\n",
		"ReservedNamespace":     server.HashToken("other") + " _canary *\n",
	} {
		if _, err := server.LoadTokens(write("tokens", body, 0o600)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestAdminEntries: an entry whose namespace field is _admin is an admin
// principal named by its third field; a malformed one is refused.
func TestAdminEntries(t *testing.T) {
	t.Parallel()
	tok, err := server.ParseTokens(strings.NewReader(server.HashToken("ops-secret") + " _admin ops-alice\n" +
		server.HashToken("w-secret") + " billing acme\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := tok.Authenticate(metadata.NewIncomingContext(t.Context(), metadata.Pairs("authorization", "Bearer ops-secret")))
	if err != nil || p.Admin != "ops-alice" || p.Namespace != "" {
		t.Fatalf("admin entry: %+v, %v", p, err)
	}
	for _, bad := range []string{" _admin a,b\n", " _admin \x01\n", " _ledgerd *\n"} {
		if _, err := server.ParseTokens(strings.NewReader(server.HashToken("x") + bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
