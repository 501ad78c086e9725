package bolt_test

import (
	"fmt"
	"testing"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/bolt"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// BenchmarkBeginComplete measures Begin+Complete pairs on fresh keys at 1, 8
// and 32 concurrent callers, every transition fsynced, with DB.Batch
// sharing transactions between callers.
func BenchmarkBeginComplete(b *testing.B) {
	s, err := bolt.Open(b.TempDir(), bolt.Config{})
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
