package bolt

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestOpensAVersion1File opens testdata/version1/ledger.db, written by the
// store as it was before tombstones and the HOLD policy (records of layout
// 1, no identity): a held key, a completed one and a released one. Every
// record reads as it was written, and the file then takes part 2's
// records beside them.
func TestOpensAVersion1File(t *testing.T) {
	orig, err := os.ReadFile(filepath.Join("testdata", "version1", FileName))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), orig, 0o600); err != nil {
		t.Fatal(err)
	}
	written := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := ledgertest.NewClock(written.Add(time.Minute))
	s, err := Open(dir, Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := ledger.New(s, ledger.Config{})
	scope := func(key string) ledger.Scope { return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: key} }
	req := func(key string) ledger.BeginRequest {
		return ledger.BeginRequest{Scope: scope(key), Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.InvoiceService/CreateInvoice"}
	}

	held, err := l.Lookup(t.Context(), scope("held"), 0)
	if err != nil || held.State != ledger.StateInProgress || held.Token != 1 || !held.LeaseExpiresAt.Equal(written.Add(time.Hour)) ||
		held.OnLeaseExpiry != ledger.Takeover || !held.ForgetAt.Equal(held.ExpiresAt) {
		t.Fatalf("the held record = %+v, %v", held, err)
	}
	res, err := l.Begin(t.Context(), req("done"))
	if err != nil || res.Replay == nil || res.Replay.Outcome.Response.GetTypeUrl() != ledgertest.Response("inv_1").Response.GetTypeUrl() ||
		string(res.Replay.Outcome.Response.GetValue()) != string(ledgertest.Response("inv_1").Response.GetValue()) {
		t.Fatalf("the completed record's replay = %+v, %v; want its outcome byte for byte", res, err)
	}
	if _, err := l.Lookup(t.Context(), scope("released"), 0); ledger.CodeOf(err) != ledger.CodeNotFound {
		t.Fatalf("the released record: %v, want NOT_FOUND", err)
	}
	again, err := l.Begin(t.Context(), req("released"))
	if err != nil || again.Claim == nil || again.Claim.Token != 2 {
		t.Fatalf("a claim of the released key = %+v, %v; want token 2, above the released one", again, err)
	}
	// A record of layout 1 has no tombstone: past its retention it is gone.
	clock.Advance(25 * time.Hour)
	if _, err := l.Lookup(t.Context(), scope("done"), 0); ledger.CodeOf(err) != ledger.CodeNotFound {
		t.Fatalf("a layout-1 record past its retention: %v, want NOT_FOUND", err)
	}
	// New records beside them have part 2.
	h := req("hold")
	h.OnLeaseExpiry = ledger.Hold
	if _, err := l.Begin(t.Context(), h); err != nil {
		t.Fatal(err)
	}
	clock.Advance(ledger.DefaultLease)
	_, err = l.Begin(t.Context(), h)
	ledgertest.WantCode(t, err, ledger.CodeOutcomeUnknown)
}
