package crdb_test

import (
	"testing"

	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestListingIsBounded: a tenant of 100,000 records is listed a thousand
// at a time through the primary key, each page as cheap as the first.
func TestListingIsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100,000 records")
	}
	s := openStore(t, crdb.Config{})
	outcome, err := ledgertest.Response("inv").MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	_, err = s.Pool().Exec(t.Context(), `INSERT INTO idempotency_records (namespace, tenant, idem_key, state, method, fingerprint,
		token, attempt, created_at, lease_expires_at, completed_at, expires_at, outcome, claim_id, on_lease_expiry, forget_at, key_source)
		SELECT 'big', $1, 'key-' || lpad(i::TEXT, 8, '0'), 2, $2, $3, 1, 1, now(), now() + INTERVAL '1 minute', now(),
		       now() + INTERVAL '1 hour', $4, '\x01', 0, now() + INTERVAL '2 hours', ''
		FROM generate_series(0, $5 - 1) AS i`,
		ledgertest.BigTenant, ledgertest.Method, ledgertest.Fingerprint("p"), outcome, n)
	if err != nil {
		t.Fatal(err)
	}
	ledgertest.BoundedListing(t, s, n)
}
