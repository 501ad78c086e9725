package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/idemledger/idemledger/ledger/errcode"
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
	seen := map[string]bool{}
	err := parsePrincipals(r, "token file", func(id string, p Principal) error {
		raw, err := hex.DecodeString(strings.TrimPrefix(id, "sha256:"))
		if !strings.HasPrefix(id, "sha256:") || err != nil || len(raw) != sha256.Size {
			return fmt.Errorf("the hash is not sha256: and 64 hex digits")
		}
		if seen[strings.ToLower(id)] {
			return fmt.Errorf("the hash is listed twice: one token names one principal")
		}
		seen[strings.ToLower(id)] = true
		e := tokenEntry{principal: p}
		copy(e.hash[:], raw)
		t.entries = append(t.entries, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// LoadTokens reads the token file at path (see ParseTokens). It refuses a
// file that the group or others may write: whoever can write it can add a
// principal of any namespace.
func LoadTokens(path string) (*Tokens, error) {
	f, err := openCredentials(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseTokens(f)
}

// HashToken returns the token file's first field for token.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Authenticate implements Authenticator: UNAUTHENTICATED without a bearer
// token or with one that is not in the table.
func (t *Tokens) Authenticate(ctx context.Context) (Principal, error) {
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
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
	return Principal{}, errcode.Errorf(errcode.Unauthenticated, "missing or unknown bearer token")
}
