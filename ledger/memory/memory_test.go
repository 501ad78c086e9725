package memory_test

import (
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
)

func TestConformance(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, now func() time.Time) ledger.Store {
		return memory.New(memory.Config{Now: now})
	})
}
