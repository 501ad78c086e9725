package crdb_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestLargeOutcomesAreLZ4: on PostgreSQL a large outcome is stored
// compressed with lz4 (migration 0004), not PostgreSQL's default pglz, and
// replays as the bytes it was; a small one stays in its row, uncompressed.
func TestLargeOutcomesAreLZ4(t *testing.T) {
	s := openStore(t, crdb.Config{})
	l := ledger.New(s, ledger.Config{})
	large := &ledger.Outcome{Response: &anypb.Any{
		TypeUrl: "type.googleapis.com/billing.v1.InvoiceList",
		Value:   bytes.Repeat([]byte(`{"id":"inv_1","currency":"EUR","total_micros":42000000},`), 4000), // 228 KB
	}}
	for key, out := range map[string]*ledger.Outcome{"large": large, "small": ledgertest.Response("inv_1")} {
		sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: key}
		req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint(key), Method: ledgertest.Method}
		res, err := l.Begin(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Complete(t.Context(), sc, res.Claim.Token, out); err != nil {
			t.Fatal(err)
		}
		var method *string
		if err := s.Pool().QueryRow(t.Context(), `SELECT pg_column_compression(outcome) FROM idempotency_records
			WHERE namespace = 'billing' AND tenant = 'acme' AND idem_key = $1`, key).Scan(&method); err != nil {
			t.Fatal(err)
		}
		switch {
		case key == "large" && (method == nil || *method != "lz4"):
			t.Errorf("the large outcome is stored with %v, want lz4", deref(method))
		case key == "small" && method != nil:
			t.Errorf("the small outcome is compressed (%s)", *method)
		}
		replay, err := l.Begin(t.Context(), req)
		if err != nil || replay.Replay == nil || !proto.Equal(replay.Replay.Outcome.Response, out.Response) {
			t.Fatalf("the %s outcome's replay = %+v, %v", key, replay, err)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "nothing (uncompressed)"
	}
	return *s
}
