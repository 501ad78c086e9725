package pebble

import (
	"bytes"
	"testing"
	"time"

	pebbledb "github.com/cockroachdb/pebble/v2"

	"github.com/idemledger/idemledger/ledger"
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
