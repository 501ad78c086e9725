package crdb

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// BenchmarkBeginComplete measures Begin+Complete pairs on fresh keys at 1, 8
// and 32 concurrent callers: through the store (a ledger.Ledger over it:
// validation, the retry helper, decoding) and, in the same run, the same
// two statements issued straight through pgx. The pairs/s of the two show
// the store's own overhead as a ratio.
func BenchmarkBeginComplete(b *testing.B) {
	url := pgtest.NewDatabase(b)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	s, err := Open(context.Background(), url+sep+"pool_max_conns=32", Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	fp := ledgertest.Fingerprint("payload")
	out := ledgertest.Response("inv_0001")
	outBytes, _ := out.MarshalBinary()
	run := 0
	for _, clients := range []int{1, 8, 32} {
		run++
		b.Run(fmt.Sprintf("store/clients=%d", clients), func(b *testing.B) {
			ledgertest.Pairs(b, clients, ledgertest.BeginComplete(l, fmt.Sprint("store", run)))
		})
		b.Run(fmt.Sprintf("pgx/clients=%d", clients), func(b *testing.B) {
			nonce := []byte("0123456789abcdef")
			var retries atomic.Int64
			ledgertest.Pairs(b, clients, func(ctx context.Context, key string) error {
				tenant := fmt.Sprint("pgx", run)
				for {
					r, err := s.scanOne(ctx, claimSQL, nil, "bench", tenant, key, ledgertest.Method, fp,
						int64(30e6), int64(86400e6), nil, nonce)
					if err == nil {
						_, _, err = s.scanCAS(ctx, completeSQL, nil, "bench", tenant, key, int64(r.rec.Token), outBytes)
					}
					if sqlState(err) == "40001" {
						retries.Add(1)
						continue
					}
					return err
				}
			})
			b.ReportMetric(float64(retries.Load())/float64(b.N), "retries/op")
		})
	}
}

// BenchmarkTombstoneBytes measures what a record costs PostgreSQL, for
// 2,000 completed records with a 256-byte response, and again once the
// sweeper has shrunk them to tombstones:
//
//	B/completed  the row's bytes (pg_column_size), per completed record
//	B/tombstone  the row's bytes, per tombstone
//	B/index      the bytes of the table's indexes, per record
//
// Each row also pays PostgreSQL's tuple header and line pointer (28
// bytes); the space a shrunk row frees is reused after VACUUM.
func BenchmarkTombstoneBytes(b *testing.B) {
	const n, outcome = 2000, 256
	for b.Loop() {
		clock := ledgertest.NewClock(time.Now())
		s, err := Open(context.Background(), pgtest.NewDatabase(b), Config{Now: clock.Now})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Migrate(context.Background()); err != nil {
			b.Fatal(err)
		}
		ledgertest.Fill(b, ledger.New(s, ledger.Config{}), n, outcome)
		completed := s.rowBytes(b)
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
		ledgertest.WantTombstones(b, s, n)
		tombstones := s.rowBytes(b)
		var index int64
		if err := s.pool.QueryRow(context.Background(), `SELECT pg_indexes_size('idempotency_records')`).Scan(&index); err != nil {
			b.Fatal(err)
		}
		s.Close()
		b.ReportMetric(float64(completed)/n, "B/completed")
		b.ReportMetric(float64(tombstones)/n, "B/tombstone")
		b.ReportMetric(float64(index)/n, "B/index")
	}
}

// rowBytes is the bytes of every row of the table.
func (s *Store) rowBytes(tb testing.TB) int64 {
	tb.Helper()
	var total int64
	if err := s.pool.QueryRow(context.Background(), `SELECT COALESCE(sum(pg_column_size(r.*)), 0) FROM idempotency_records r`).Scan(&total); err != nil {
		tb.Fatal(err)
	}
	return total
}
