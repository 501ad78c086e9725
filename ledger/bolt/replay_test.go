package bolt

import (
	"bytes"
	"encoding/binary"
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
		defer func() { _ = tx.Rollback() }()
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

// TestConformance runs the conformance suite, its sweep rules included.
func TestConformance(t *testing.T) {
	ledgertest.Suite{
		NewStore: func(t *testing.T, now func() time.Time) ledger.Store {
			return openInternal(t, Config{Now: now, SweepInterval: 10 * time.Millisecond, SweepBatch: 2})
		},
		Count: func(t *testing.T, s ledger.Store, ns string) int { return s.(*Store).count(t, ns) },
	}.Run(t)
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

// count counts the records of namespace in the file, expired or not, and
// checks that the expiry index holds exactly one entry for each record.
func (s *Store) count(t *testing.T, namespace string) int {
	t.Helper()
	var records, index, inNamespace int
	prefix := binary.AppendUvarint(nil, uint64(len(namespace)))
	prefix = append(prefix, namespace...)
	if err := s.db.View(func(tx *bbolt.Tx) error {
		records = tx.Bucket(recordsBucket).Stats().KeyN
		index = tx.Bucket(expiryBucket).Stats().KeyN
		c := tx.Bucket(recordsBucket).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			inNamespace++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if records != index {
		t.Fatalf("%d records but %d expiry index entries", records, index)
	}
	return inNamespace
}

// TestRecords: Records sees every stored record, released ones and
// tombstones included, as stored.
func TestRecords(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s := openInternal(t, Config{Now: clock.Now})
	l := ledger.New(s, ledger.Config{})
	scope := func(k string) ledger.Scope { return ledger.Scope{Namespace: "ns", Tenant: "t", Key: k} }
	for _, k := range []string{"a", "b", "c"} {
		res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
		if err != nil {
			t.Fatal(err)
		}
		switch k {
		case "a":
			_, err = l.Complete(t.Context(), scope(k), res.Claim.Token, ledgertest.Response("inv"))
		case "b":
			err = l.Release(t.Context(), scope(k), res.Claim.Token)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]ledger.State{}
	if err := s.Records(t.Context(), func(r ledger.Record) error { got[r.Scope.Key] = r.State; return nil }); err != nil {
		t.Fatal(err)
	}
	want := map[string]ledger.State{"a": ledger.StateCompleted, "b": ledger.StateReleased, "c": ledger.StateInProgress}
	if len(got) != len(want) || got["a"] != want["a"] || got["b"] != want["b"] || got["c"] != want["c"] {
		t.Fatalf("Records saw %v, want %v", got, want)
	}
}
