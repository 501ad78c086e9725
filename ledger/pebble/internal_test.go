package pebble

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestConformance runs the conformance suite, its sweep rules included.
func TestConformance(t *testing.T) {
	ledgertest.Suite{
		NewStore: func(t *testing.T, now func() time.Time) ledger.Store {
			s, err := Open(t.TempDir(), Config{Now: now, SweepInterval: 10 * time.Millisecond, SweepBatch: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
		Count: func(t *testing.T, s ledger.Store, ns string) int { return s.(*Store).count(t, ns) },
	}.Run(t)
}

// count counts the records of namespace, expired or not, and checks that
// the expiry index holds exactly one entry for each record, all from one
// snapshot (a sweep may run meanwhile).
func (s *Store) count(t *testing.T, namespace string) int {
	t.Helper()
	snap := s.db.NewSnapshot()
	defer snap.Close()
	keys := func(pre []byte) (n int) {
		it, err := snap.NewIter(&pebbledb.IterOptions{LowerBound: pre, UpperBound: upperBound(pre)})
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		for valid := it.First(); valid; valid = it.Next() {
			n++
		}
		return n
	}
	records, index := keys(recordPrefix), keys(expiryPrefix)
	if records != index {
		t.Fatalf("%d records but %d expiry index entries", records, index)
	}
	return keys(prefix(namespace, ""))
}

func TestUpperBound(t *testing.T) {
	for _, tc := range []struct{ in, want []byte }{
		{[]byte("r"), []byte("s")},
		{[]byte{'r', 0xff}, []byte("s")},
		{[]byte{0xff, 0xff}, nil},
	} {
		if got := upperBound(tc.in); !bytes.Equal(got, tc.want) {
			t.Errorf("upperBound(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestCorruptBlockIsInternal: 16 KiB of random bytes in the middle of a
// table. Either Open refuses the store (it saw the damage), or the process
// stays up: the reads of the keys the damaged block holds fail INTERNAL,
// not retryable, the others are answered, and Ping (readiness) says the
// store is damaged. Pebble's default would end the process at the first
// read of the block.
func TestCorruptBlockIsInternal(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, Config{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	outcome := ledgertest.Response(string(bytes.Repeat([]byte("o"), 300)))
	for i := range n {
		sc := ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("k-%05d", i)}
		res, err := s.Claim(t.Context(), ledger.ClaimParams{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(t.Context(), ledger.CompleteParams{Scope: sc, Token: res.Record.Token, Outcome: outcome}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	tables, err := filepath.Glob(filepath.Join(dir, DirName, "*.sst"))
	if err != nil || len(tables) == 0 {
		t.Fatalf("no table to damage: %v, %v", tables, err)
	}
	var largest string
	var size int64
	for _, f := range tables {
		if st, err := os.Stat(f); err == nil && st.Size() > size {
			largest, size = f, st.Size()
		}
	}
	if size < 64<<10 {
		t.Fatalf("the largest table is %d bytes: too small to damage a block in its middle", size)
	}
	f, err := os.OpenFile(largest, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 16<<10)
	_, _ = rand.Read(junk)
	if _, err := f.WriteAt(junk, size/2-8<<10); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()

	s, err = Open(dir, Config{})
	if errors.Is(err, ErrRefused) {
		return // refused at start: the check saw the damage
	}
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	damaged, fine := 0, 0
	for i := range n {
		_, err := s.Get(t.Context(), ledger.Scope{Namespace: "ns", Tenant: "t", Key: fmt.Sprintf("k-%05d", i)})
		switch le := errcode.As(err); {
		case err == nil:
			fine++
		case le.Code == errcode.Internal && !le.Retryable():
			damaged++
		default:
			t.Fatalf("key %d: %v; want its record or INTERNAL", i, err)
		}
	}
	if damaged == 0 || fine == 0 {
		t.Fatalf("%d keys damaged, %d fine; want some of each", damaged, fine)
	}
	if err := s.Ping(t.Context()); errcode.Of(err) != errcode.Internal {
		t.Fatalf("Ping of a damaged store = %v; want INTERNAL (not ready)", err)
	}
}
