package server

import (
	"bufio"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Certificates authenticates callers by the client certificate of a mutual
// TLS connection whose chain the server verified. A certificate's identity
// is, in this order of preference, each of its URI SANs (a SPIFFE ID, for
// instance), each of its DNS SANs, then its subject common name; the first
// identity in the table names the principal. It is safe for concurrent use.
//
// The transport must require and verify client certificates
// (tls.RequireAndVerifyClientCert); a connection without a verified chain is
// UNAUTHENTICATED here whatever it presents.
type Certificates struct {
	principals map[string]Principal // "uri:…", "dns:…" or "cn:…"
}

var _ Authenticator = (*Certificates)(nil)

// ParseCertificates reads a certificate principal file: one principal a
// line,
//
//	uri:<uri SAN>|dns:<dns SAN>|cn:<common name> <namespace> <tenant>[,<tenant>...]
//
// where a tenant of "*" means any tenant. Blank lines and lines that start
// with # are skipped.
func ParseCertificates(r io.Reader) (*Certificates, error) {
	c := &Certificates{principals: map[string]Principal{}}
	err := parsePrincipals(r, "certificate file", func(id string, p Principal) error {
		kind, value, _ := strings.Cut(id, ":")
		if (kind != "uri" && kind != "dns" && kind != "cn") || value == "" {
			return fmt.Errorf("the identity %q is not uri:, dns: or cn: followed by a value", id)
		}
		if _, dup := c.principals[id]; dup {
			return fmt.Errorf("the identity %q is listed twice", id)
		}
		c.principals[id] = p
		return nil
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// LoadCertificates reads the certificate principal file at path (see
// ParseCertificates). It refuses a file that the group or others may
// write.
func LoadCertificates(path string) (*Certificates, error) {
	f, err := openCredentials(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseCertificates(f)
}

// openCredentials opens a credentials file that only its owner may write.
func openCredentials(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("server: %w", err)
	}
	if st.Mode().Perm()&0o022 != 0 {
		_ = f.Close()
		return nil, fmt.Errorf("server: %s is writable by its group or by others (mode %04o), and whoever can write it can add a principal: chmod go-w %s", path, st.Mode().Perm(), path)
	}
	return f, nil
}

// Authenticate implements Authenticator: UNAUTHENTICATED without a verified
// client certificate or with one whose identities are not in the table.
func (c *Certificates) Authenticate(ctx context.Context) (Principal, error) {
	leaf := verifiedLeaf(ctx)
	if leaf == nil {
		return Principal{}, errcode.Errorf(errcode.Unauthenticated, "no verified client certificate")
	}
	for _, id := range identities(leaf) {
		if p, ok := c.principals[id]; ok {
			return p, nil
		}
	}
	return Principal{}, errcode.Errorf(errcode.Unauthenticated, "the client certificate names no known principal")
}

func verifiedLeaf(ctx context.Context) *x509.Certificate {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

func identities(cert *x509.Certificate) []string {
	var ids []string
	for _, u := range cert.URIs {
		ids = append(ids, "uri:"+u.String())
	}
	for _, d := range cert.DNSNames {
		ids = append(ids, "dns:"+d)
	}
	if cert.Subject.CommonName != "" {
		ids = append(ids, "cn:"+cert.Subject.CommonName)
	}
	return ids
}

// AnyOf authenticates with each authenticator in turn and returns the first
// principal found; when none finds one, the call is UNAUTHENTICATED. Errors
// other than UNAUTHENTICATED end the search.
func AnyOf(auths ...Authenticator) Authenticator {
	return AuthenticatorFunc(func(ctx context.Context) (Principal, error) {
		for _, a := range auths {
			p, err := a.Authenticate(ctx)
			if err == nil || errcode.Of(err) != errcode.Unauthenticated {
				return p, err
			}
		}
		return Principal{}, errcode.Errorf(errcode.Unauthenticated, "no credentials the ledger accepts")
	})
}

// ReservedPrefix starts the namespaces ledgerd keeps for itself (its
// readiness canary); no credentials may name one.
const ReservedPrefix = "_"

// AdminNamespace is the namespace field of a credential file's entry that
// makes it an admin principal, named by the third field:
//
//	sha256:<hex> _admin ops-alice
const AdminNamespace = "_admin"

// parsePrincipals reads the common shape of principal files: an identity, a
// namespace and a comma-separated tenant list a line, with blank lines and #
// comments skipped. add checks and keeps each entry.
func parsePrincipals(r io.Reader, what string, add func(id string, p Principal) error) error {
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return fmt.Errorf("server: %s line %d: want <identity> <namespace> <tenants>", what, n)
		}
		if err := ledger.ValidateScope(ledger.Scope{Namespace: f[1], Tenant: "x", Key: "x"}, ledger.MaxKeyBytes); err != nil {
			return fmt.Errorf("server: %s line %d: %w", what, n, err)
		}
		if f[1] == AdminNamespace {
			if err := ledger.ValidateScope(ledger.Scope{Namespace: f[2], Tenant: "x", Key: "x"}, ledger.MaxKeyBytes); err != nil || strings.Contains(f[2], ",") {
				return fmt.Errorf("server: %s line %d: an admin entry is <identity> %s <name>, with a name of printable ASCII", what, n, AdminNamespace)
			}
			if err := add(f[0], Principal{Admin: f[2]}); err != nil {
				return fmt.Errorf("server: %s line %d: %w", what, n, err)
			}
			continue
		}
		if strings.HasPrefix(f[1], ReservedPrefix) {
			return fmt.Errorf("server: %s line %d: namespaces that start with %q are ledgerd's own", what, n, ReservedPrefix)
		}
		tenants := strings.Split(f[2], ",")
		for _, t := range tenants {
			if t == "*" {
				continue
			}
			if err := ledger.ValidateScope(ledger.Scope{Namespace: "x", Tenant: t, Key: "x"}, ledger.MaxKeyBytes); err != nil {
				return fmt.Errorf("server: %s line %d: %w", what, n, err)
			}
		}
		if err := add(f[0], Principal{Namespace: f[1], Tenants: tenants}); err != nil {
			return fmt.Errorf("server: %s line %d: %w", what, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("server: read %s: %w", what, err)
	}
	return nil
}
