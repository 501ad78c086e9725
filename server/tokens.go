package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/idemledger/idemledger/ledger"
)

// Tokens authenticates bearer tokens ("authorization: Bearer <token>")
// against a table that keeps only their SHA-256 hashes. A presented token is
// compared with every entry in constant time, so neither the match nor its
// position leaks through timing. It is safe for concurrent use.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	hash      [sha256.Size]byte
	principal Principal
}

var _ Authenticator = (*Tokens)(nil)

// ParseTokens reads a token file: one principal a line,
//
//	sha256:<64 hex digits> <namespace> <tenant>[,<tenant>...]
//
// where a tenant of "*" means any tenant. Blank lines and lines that start
// with # are skipped. HashToken gives the first field for a token.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || !strings.HasPrefix(f[0], "sha256:") {
			return nil, fmt.Errorf("server: token file line %d: want sha256:<hex> <namespace> <tenants>", n)
		}
		raw, err := hex.DecodeString(strings.TrimPrefix(f[0], "sha256:"))
		if err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("server: token file line %d: the hash is not 64 hex digits", n)
		}
		if err := ledger.ValidateScope(ledger.Scope{Namespace: f[1], Tenant: "x", Key: "x"}, ledger.MaxKeyBytes); err != nil {
			return nil, fmt.Errorf("server: token file line %d: %w", n, err)
		}
		e := tokenEntry{principal: Principal{Namespace: f[1], Tenants: strings.Split(f[2], ",")}}
		copy(e.hash[:], raw)
		t.entries = append(t.entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("server: read token file: %w", err)
	}
	return t, nil
}

// HashToken returns the token file's first field for token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Authenticate implements Authenticator: UNAUTHENTICATED without a bearer
// token or with one that is not in the table.
func (t *Tokens) Authenticate(ctx context.Context) (Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		scheme, token, ok := strings.Cut(v, " ")
		if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
			continue
		}
		sum := sha256.Sum256([]byte(token))
		found, match := -1, 0
		for i := range t.entries {
			eq := subtle.ConstantTimeCompare(sum[:], t.entries[i].hash[:])
			found = subtle.ConstantTimeSelect(eq&^match, i, found)
			match |= eq
		}
		if match == 1 {
			return t.entries[found].principal, nil
		}
	}
	return Principal{}, ledger.Errorf(ledger.CodeUnauthenticated, "missing or unknown bearer token")
}
