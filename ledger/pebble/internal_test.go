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

// TestLoad: records loaded as they are read back as they are, each with
// one expiry index entry, also when a record is loaded again with another
// expiry; and a new store takes the identity it is given.
func TestLoad(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := Open(t.TempDir(), Config{Now: clock.Now, Identity: "0123abcd"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Identity() != "0123abcd" || !s.Created() {
		t.Fatalf("identity %q, created %t", s.Identity(), s.Created())
	}
	now := clock.Now()
	done := ledger.Record{Scope: ledger.Scope{Namespace: "ns", Tenant: "t", Key: "done"}, State: ledger.StateCompleted, Method: ledgertest.Method,
		Fingerprint: ledgertest.Fingerprint("p"), Token: 3, Attempt: 2, CreatedAt: now, LeaseExpiresAt: now.Add(time.Minute),
		CompletedAt: now, ExpiresAt: now.Add(time.Hour), ForgetAt: now.Add(2 * time.Hour), Outcome: ledgertest.Response("inv")}
	held := done
	held.Scope.Key, held.State, held.Outcome, held.CompletedAt = "held", ledger.StateInProgress, nil, time.Time{}
	if err := s.Load(t.Context(), []ledger.Record{done, held}); err != nil {
		t.Fatal(err)
	}
	later := done
	later.ExpiresAt, later.ForgetAt = now.Add(3*time.Hour), now.Add(4*time.Hour)
	if err := s.Load(t.Context(), []ledger.Record{later}); err != nil {
		t.Fatal(err)
	}
	if n := s.count(t, "ns"); n != 2 {
		t.Fatalf("%d records, want 2", n)
	}
	got, err := s.Get(t.Context(), done.Scope)
	if err != nil || got.Token != 3 || got.Attempt != 2 || !got.ExpiresAt.Equal(later.ExpiresAt) || !got.Outcome.Equal(done.Outcome) {
		t.Fatalf("loaded record reads back as %+v, %v", got, err)
	}
}
