package pebble_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble"
)

// BenchmarkBeginComplete measures Begin+Complete pairs on fresh keys at 1,
// 8, 32 and 128 concurrent callers, every transition fsynced; concurrent
// commits share an fsync.
func BenchmarkBeginComplete(b *testing.B) {
	s, err := pebble.Open(b.TempDir(), pebble.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	l := ledger.New(s, ledger.Config{})
	for _, clients := range []int{1, 8, 32, 128} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			ledgertest.Pairs(b, clients, ledgertest.BeginComplete(l, fmt.Sprint(clients)))
		})
	}
}

// BenchmarkSweep sweeps a backlog of b.N completed records past their
// tombstone window, 500 at a time: an op is a record deleted.
// The listing of each batch starts where the last one stopped; from the
// front of the index it would walk what the earlier batches deleted, so
// compare runs of one size (-benchtime 500000x).
func BenchmarkSweep(b *testing.B) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := pebble.Open(b.TempDir(), pebble.Config{Now: clock.Now})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ledgertest.Fill(b, ledger.New(s, ledger.Config{}), b.N, 500)
	clock.Advance(ledger.DefaultRetention + ledger.DefaultTombstoneRetention + time.Hour)
	b.ResetTimer()
	swept := 0
	for {
		n, err := s.Sweep(context.Background(), 500)
		if err != nil {
			b.Fatal(err)
		}
		swept += n
		if n < 500 {
			break
		}
	}
	b.StopTimer()
	if swept != b.N {
		b.Fatalf("swept %d of %d records", swept, b.N)
	}
}
