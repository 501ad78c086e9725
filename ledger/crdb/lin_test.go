package crdb_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/lincheck"
)

func TestLinearizable(t *testing.T) {
	base := openStore(t, crdb.Config{})
	for run := range 8 {
		batching := run%2 == 1
		t.Run(fmt.Sprint("history", run, "/batching=", batching), func(t *testing.T) {
			lincheck.Run(t, func(now func() time.Time) ledger.Store {
				s, err := crdb.New(t.Context(), base.Pool(), crdb.Config{Now: now, Batching: batching, MaxBatch: 8, BatchInFlight: 2})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}, lincheck.Config{})
		})
	}
}

// TestLinearizableUnderConnectionKills runs the history while another
// session terminates the store's connections every few milliseconds: calls
// fail with an unknown outcome, and what did happen is still linearizable.
func TestLinearizableUnderConnectionKills(t *testing.T) {
	url := pgtest.NewDatabase(t)
	base := openURL(t, url, crdb.Config{}, true)
	admin, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Close(context.Background()) })
	var kills atomic.Int64
	lincheck.Run(t, func(now func() time.Time) ledger.Store {
		s, err := crdb.New(t.Context(), base.Pool(), crdb.Config{Now: now, MaxRetries: 3, Batching: true, MaxBatch: 8, BatchInFlight: 2})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, lincheck.Config{Phases: 40, Fault: lincheck.Every(time.Millisecond, 4*time.Millisecond, func() { // the history's faults
		tag, err := admin.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		if err == nil {
			kills.Add(tag.RowsAffected())
		}
	})})
	if kills.Load() == 0 {
		t.Fatal("no connection was killed")
	}
	t.Logf("%d connections killed", kills.Load())
}
