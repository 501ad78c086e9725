package pebble_test

import (
	"fmt"
	"testing"

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
