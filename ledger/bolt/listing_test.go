package bolt

import (
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/internal/recordkv"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestListingIsBounded: a tenant of 100,000 records is listed a thousand
// at a time, each page as cheap as the first.
func TestListingIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 records")
	}
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 100_000
	now := time.Now()
	outcome := ledgertest.Response("inv")
	err = s.db.Update(func(tx *bbolt.Tx) error {
		for i := range n {
			rec := &ledger.Record{
				Scope: ledger.Scope{Namespace: "big", Tenant: ledgertest.BigTenant, Key: ledgertest.BigKey(i)},
				State: ledger.StateCompleted, Method: ledgertest.Method, Fingerprint: ledgertest.Fingerprint("p"),
				Token: 1, Attempt: 1, CreatedAt: now, LeaseExpiresAt: now.Add(time.Minute), CompletedAt: now,
				ExpiresAt: now.Add(time.Hour), ForgetAt: now.Add(2 * time.Hour), Outcome: outcome,
			}
			if err := put(tx, recordkv.ScopeKey(rec.Scope), nil, rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ledgertest.BoundedListing(t, s, n)
}
