package pebble_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble"
)

// TestBackupRestores: an online backup, taken while the store serves,
// opens as the same ledger (its identity and its sequence marker with it)
// and replays every outcome written before it; what came after it is not
// there. A backup never overwrites, and a backup cut short (its sequence
// marker ahead of its store) is refused, not opened as if whole.
func TestBackupRestores(t *testing.T) {
	t.Parallel()
	clock := ledgertest.NewClock(ledgertest.Start)
	s := open(t, t.TempDir(), pebble.Config{Now: clock.Now})
	l := ledger.New(s, ledger.Config{})
	write := func(l *ledger.Ledger, k string) {
		t.Helper()
		res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Complete(t.Context(), scope(k), res.Claim.Token, ledgertest.Response("out-"+k)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 200 {
		write(l, fmt.Sprintf("before-%03d", i))
	}
	dest := filepath.Join(t.TempDir(), "backup-1")
	b, err := s.Backup(dest)
	if err != nil {
		t.Fatal(err)
	}
	if b.Dir != dest || b.Bytes == 0 || b.Sequence == 0 {
		t.Fatalf("the backup: %+v", b)
	}
	write(l, "after")
	if _, err := s.Backup(dest); err == nil {
		t.Fatal("a second backup into the same directory was taken")
	}

	r := open(t, dest, pebble.Config{Now: clock.Now})
	if r.Created() || r.Identity() != s.Identity() {
		t.Fatalf("the restored store: created %t, identity %q, want %q", r.Created(), r.Identity(), s.Identity())
	}
	rl := ledger.New(r, ledger.Config{})
	for i := range 200 {
		k := fmt.Sprintf("before-%03d", i)
		res, err := rl.Begin(t.Context(), ledger.BeginRequest{Scope: scope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
		if err != nil || res.Replay == nil || !res.Replay.Outcome.Equal(ledgertest.Response("out-"+k)) {
			t.Fatalf("%s from the backup: %+v, %v", k, res, err)
		}
	}
	if res, err := rl.Begin(t.Context(), ledger.BeginRequest{Scope: scope("after"), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}); err != nil || res.Claim == nil {
		t.Fatalf("a record written after the backup: %+v, %v; want a fresh claim", res, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	// A backup whose marker says it reaches further than its store does.
	cut := filepath.Join(t.TempDir(), "backup-2")
	if _, err := s.Backup(cut); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cut, pebble.WatermarkFileName), []byte(fmt.Sprint(b.Sequence+1_000_000)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pebble.Open(cut, pebble.Config{Now: clock.Now}); err == nil {
		t.Fatal("a backup behind its sequence marker opened")
	}
}
