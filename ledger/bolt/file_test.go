package bolt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// filled opens a store in a new directory, writes n raw records of size
// bytes in one transaction, and closes it. It returns the directory.
func filled(t *testing.T, n, size int) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.db.Update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(recordsBucket)
		v := make([]byte, size)
		for i := range n {
			if err := b.Put(fmt.Appendf(nil, "k%08d", i), v); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

func wantRefused(t *testing.T, dir, why string) {
	t.Helper()
	s, err := Open(dir, Config{})
	if err == nil {
		_ = s.Close()
		t.Fatalf("Open = nil error, want it refused: %s", why)
	}
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), why) {
		t.Fatalf("Open = %v, want a refusal that says %q", err, why)
	}
}

// TestRefusesTruncatedFile: a ledger.db cut short (as a full disk, a bad
// copy or a crashed volume leaves it) is refused with a clear error, where
// bbolt would fault inside Open.
func TestRefusesTruncatedFile(t *testing.T) {
	dir := filled(t, 4500, 4096) // about 18 MB
	path := filepath.Join(dir, FileName)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The pages in use end at the meta page's high-water mark; bbolt grows
	// the file beyond it in steps.
	m, ok := readMeta(orig, 0)
	if m1, ok1 := readMeta(orig, uint64(m.pageSize)); ok1 && (!ok || m1.txid > m.txid) {
		m, ok = m1, true
	}
	used := int(m.pgid) * int(m.pageSize)
	if !ok || used < 16<<20 || used > len(orig) {
		t.Fatalf("meta: %+v, %v; file %d bytes", m, ok, len(orig))
	}
	for _, size := range []int{16 << 10, 8 << 20, used * 9 / 10, used - int(m.pageSize)} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			if err := os.WriteFile(path, orig[:size], 0o600); err != nil {
				t.Fatal(err)
			}
			wantRefused(t, dir, "truncated")
		})
	}
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatalf("the whole file again: %v", err)
	}
	_ = s.Close()
}

// TestRefusesEmptiedMissingOrReplacedFile: a directory that held a ledger
// never starts as a new, empty one.
func TestRefusesEmptiedMissingOrReplacedFile(t *testing.T) {
	t.Run("Empty", func(t *testing.T) {
		dir := filled(t, 10, 100)
		if err := os.Truncate(filepath.Join(dir, FileName), 0); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, dir, "is empty (0 bytes)")
	})
	t.Run("Missing", func(t *testing.T) {
		dir := filled(t, 10, 100)
		if err := os.Remove(filepath.Join(dir, FileName)); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, dir, "is missing")
	})
	t.Run("AnotherLedger", func(t *testing.T) {
		dir, other := filled(t, 10, 100), filled(t, 10, 100)
		if err := os.Rename(filepath.Join(other, FileName), filepath.Join(dir, FileName)); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, dir, "was replaced")
	})
	t.Run("NotALedgerFile", func(t *testing.T) {
		dir := filled(t, 10, 100)
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(strings.Repeat("not a database ", 1000)), 0o600); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, dir, "not a ledger file")
	})
	t.Run("ForeignBoltFile", func(t *testing.T) {
		dir := filled(t, 10, 100)
		path := filepath.Join(dir, FileName)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		db, err := bbolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = db.Close()
		wantRefused(t, dir, "has no identity")
	})
}

// TestFirstStartAndReopen: an empty directory gets a new ledger and its
// marker; opening it again finds the same ledger.
func TestFirstStartAndReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	id := s.Identity()
	if !s.Created() || len(id) != 32 {
		t.Fatalf("first Open: created %v, identity %q", s.Created(), id)
	}
	_ = s.Close()
	marker, err := os.ReadFile(filepath.Join(dir, IdentityFileName))
	if err != nil || strings.TrimSpace(string(marker)) != id {
		t.Fatalf("marker = %q, %v; want %s", marker, err, id)
	}
	s, err = Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Created() || s.Identity() != id {
		t.Fatalf("reopen: created %v, identity %q; want the same ledger %s", s.Created(), s.Identity(), id)
	}
}

// TestEarlierFileGetsAnIdentity: a ledger.db written before files had an
// identity (records, no marker) keeps its records and gains one.
func TestEarlierFileGetsAnIdentity(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, FileName)
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := Open(dir, Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: "k"}
	res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	if err != nil {
		t.Fatal(err)
	}
	// Make it the earlier layout: no meta bucket, no marker.
	if err := s.db.Update(func(tx *bbolt.Tx) error { return tx.DeleteBucket(metaBucket) }); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	if err := os.Remove(filepath.Join(dir, IdentityFileName)); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Config{Now: clock.Now})
	if err != nil {
		t.Fatalf("Open of an earlier file: %v", err)
	}
	defer s.Close()
	if s.Created() || s.Identity() == "" {
		t.Fatalf("created %v, identity %q: want the earlier ledger kept, with an identity", s.Created(), s.Identity())
	}
	rec, err := ledger.New(s, ledger.Config{}).Lookup(t.Context(), sc, 0)
	if err != nil || rec.Token != res.Claim.Token {
		t.Fatalf("the earlier record: %+v, %v", rec, err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
}
