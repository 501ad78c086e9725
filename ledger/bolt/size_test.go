package bolt

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// BenchmarkTombstoneBytes measures what a record costs the file: the
// bytes its B+tree pages hold (records and expiry buckets, leaf and
// branch pages in use), per record, for 2,000 completed records with a
// 256-byte response, and again once the sweeper has shrunk them to
// tombstones.
//
//	B/completed  bytes per completed record
//	B/tombstone  bytes per tombstone
func BenchmarkTombstoneBytes(b *testing.B) {
	const n, outcome = 2000, 256
	for b.Loop() {
		clock := ledgertest.NewClock(time.Now())
		s, err := Open(b.TempDir(), Config{Now: clock.Now})
		if err != nil {
			b.Fatal(err)
		}
		l := ledger.New(s, ledger.Config{})
		ledgertest.Fill(b, l, n, outcome)
		completed := s.inUse(b)
		clock.Advance(ledger.DefaultRetention + time.Minute)
		for {
			k, err := s.Sweep(context.Background(), 500)
			if err != nil {
				b.Fatal(err)
			}
			if k == 0 {
				break
			}
		}
		tombstones := s.inUse(b)
		ledgertest.WantTombstones(b, s, n)
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(completed)/n, "B/completed")
		b.ReportMetric(float64(tombstones)/n, "B/tombstone")
	}
}

// inUse is the bytes in use in the pages of both buckets.
func (s *Store) inUse(tb testing.TB) int {
	tb.Helper()
	total := 0
	err := s.db.View(func(tx *bbolt.Tx) error {
		for _, name := range [][]byte{recordsBucket, expiryBucket} {
			st := tx.Bucket(name).Stats()
			total += st.LeafInuse + st.BranchInuse + st.InlineBucketInuse
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return total
}
