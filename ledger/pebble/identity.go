package pebble

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

// IdentityFileName is the marker beside the store that names its ledger.
const IdentityFileName = "ledger.id"

// ErrRefused is what Open says of a directory it will not start as a
// ledger; the message says what to do.
var ErrRefused = errors.New("pebble: refused to open the ledger")

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, args...))
}

// identity reads the ledger's identity from db and checks it against the
// marker in dir: a store without one is new (it gets a new identity and
// the marker), unless the marker says a ledger was here, which the
// store has lost. created reports a new ledger.
func identity(db *pebbledb.DB, dir, want string) (id string, created bool, err error) {
	marker := filepath.Join(dir, IdentityFileName)
	stored, err := get(db, identityKey)
	if err != nil {
		return "", false, fmt.Errorf("pebble: read identity: %w", err)
	}
	switch {
	case stored == nil && want != "":
		return "", false, lostStore(dir, want)
	case stored != nil && want != "" && string(stored) != want:
		return "", false, refuse("%s names ledger %s, but %s holds ledger %s: put back the right directory", marker, want, filepath.Join(dir, DirName), stored)
	case stored != nil:
		if want == "" {
			if err := writeMarker(marker, string(stored)); err != nil {
				return "", false, err
			}
		}
		return string(stored), false, nil
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", false, err
	}
	id = hex.EncodeToString(raw)
	if err := db.Set(identityKey, []byte(id), pebbledb.Sync); err != nil {
		return "", false, fmt.Errorf("pebble: write identity: %w", err)
	}
	if err := writeMarker(marker, id); err != nil {
		return "", false, err
	}
	return id, true, nil
}

// readMarker returns the identity the marker in dir names, "" without one.
func readMarker(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, IdentityFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pebble: identity marker: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// lostStore is the refusal of a directory whose marker names a ledger its
// store does not hold.
func lostStore(dir, want string) error {
	return refuse("%s names ledger %s, but %s holds no ledger: it was emptied or replaced; restore it from a backup, "+
		"or remove the marker to start a new, empty ledger (every retry's write then runs again)",
		filepath.Join(dir, IdentityFileName), want, filepath.Join(dir, DirName))
}

// writeMarker writes the marker durably (recordkv.WriteMarker).
func writeMarker(path, id string) error {
	if err := recordkv.WriteMarker(path, id); err != nil {
		return fmt.Errorf("pebble: identity marker: %w", err)
	}
	return nil
}
