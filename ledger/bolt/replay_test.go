package bolt

import (
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// TestReplayIsOneRead: a replay, an IN_PROGRESS and a KEY_REUSED answer
// commit no write transaction (no fsync): the file's transaction id does
// not move.
func TestReplayIsOneRead(t *testing.T) {
	s, err := Open(t.TempDir(), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l := ledger.New(s, ledger.Config{})
	sc := func(k string) ledger.Scope { return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k} }
	req := func(k, payload string) ledger.BeginRequest {
		return ledger.BeginRequest{Scope: sc(k), Fingerprint: ledgertest.Fingerprint(payload), Method: ledgertest.Method}
	}
	res, err := l.Begin(t.Context(), req("done", "p"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), sc("done"), res.Claim.Token, ledgertest.Response("inv_1")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Begin(t.Context(), req("held", "p")); err != nil {
		t.Fatal(err)
	}
	txid := func() int {
		tx, err := s.db.Begin(false)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		return tx.ID()
	}
	before := txid()
	if r, err := l.Begin(t.Context(), req("done", "p")); err != nil || r.Replay == nil {
		t.Fatalf("replay = %+v, %v", r, err)
	}
	_, err = l.Begin(t.Context(), req("held", "p"))
	ledgertest.WantCode(t, err, ledger.CodeInProgress)
	_, err = l.Begin(t.Context(), req("done", "other"))
	ledgertest.WantCode(t, err, ledger.CodeKeyReused)
	if after := txid(); after != before {
		t.Fatalf("answers that change nothing committed %d write transactions", after-before)
	}
	if _, err := l.Begin(t.Context(), req("fresh", "p")); err != nil {
		t.Fatal(err)
	}
	if after := txid(); after != before+1 {
		t.Fatalf("a claim committed %d write transactions, want 1", after-before)
	}
}

func TestSweep(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s := openInternal(t, Config{Now: clock.Now})
	ledgertest.SweepTest(t, s, clock, func() int { return s.count(t) })
}

func TestRunSweeps(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s := openInternal(t, Config{Now: clock.Now, SweepInterval: 10 * time.Millisecond, SweepBatch: 2})
	ledgertest.SweepLoopTest(t, s, clock, s.Run, func() int { return s.count(t) })
}

func openInternal(t *testing.T, cfg Config) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// count counts the records in the file, expired or not, and checks that
// the expiry index holds exactly one entry for each.
func (s *Store) count(t *testing.T) int {
	t.Helper()
	var records, index int
	if err := s.db.View(func(tx *bbolt.Tx) error {
		records = tx.Bucket(recordsBucket).Stats().KeyN
		index = tx.Bucket(expiryBucket).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if records != index {
		t.Fatalf("%d records but %d expiry index entries", records, index)
	}
	return records
}
