package memory_test

import (
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	ledgertest.Suite{
		NewStore: func(_ *testing.T, now func() time.Time) ledger.Store {
			return memory.New(memory.Config{Now: now, SweepInterval: 10 * time.Millisecond, SweepBatch: 2})
		},
		// Each rule has a store of its own: its records are the namespace's.
		Count: func(_ *testing.T, s ledger.Store, _ string) int { return s.(*memory.Store).Len() },
	}.Run(t)
}

func TestCountsByState(t *testing.T) {
	t.Parallel()
	ledgertest.CountsByState(t, func(now func() time.Time) ledger.Store { return memory.New(memory.Config{Now: now}) })
}
