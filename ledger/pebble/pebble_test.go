package pebble_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/lincheck"
	"github.com/idemledger/idemledger/ledger/pebble"
)

// TestMain fails tests that leak goroutines. Pebble itself leaves its
// disk-health ticker behind when Open fails on a locked directory
// (TestSecondOpenFails); nothing else may stay.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/cockroachdb/pebble/v2/vfs.(*diskHealthCheckingFS).startTickerLocked.func1"))
}

func open(t testing.TB, dir string, cfg pebble.Config) *pebble.Store {
	t.Helper()
	s, err := pebble.Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func scope(k string) ledger.Scope { return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k} }

// TestRecordsSurviveReopen closes the store and opens it again: every
// state, token and outcome reads back as it was written, and the ledger
// keeps its identity.
func TestRecordsSurviveReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := pebble.Open(dir, pebble.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Created() || s.Identity() == "" {
		t.Fatalf("a new store: created %t, identity %q", s.Created(), s.Identity())
	}
	id := s.Identity()
	l := ledger.New(s, ledger.Config{})
	begin := func(l *ledger.Ledger, k string) ledger.BeginResponse {
		t.Helper()
		res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	done := begin(l, "done")
	if _, err := l.Complete(t.Context(), scope("done"), done.Claim.Token, ledgertest.Response("inv_1")); err != nil {
		t.Fatal(err)
	}
	failed := begin(l, "failed")
	if _, err := l.Complete(t.Context(), scope("failed"), failed.Claim.Token, ledgertest.ErrorStatus("card declined")); err != nil {
		t.Fatal(err)
	}
	released := begin(l, "released")
	if err := l.Release(t.Context(), scope("released"), released.Claim.Token); err != nil {
		t.Fatal(err)
	}
	begin(l, "running")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, dir, pebble.Config{Now: clock.Now})
	if s.Created() || s.Identity() != id {
		t.Fatalf("reopened: created %t, identity %q, want %q", s.Created(), s.Identity(), id)
	}
	l = ledger.New(s, ledger.Config{})
	for k, want := range map[string]*ledger.Outcome{"done": ledgertest.Response("inv_1"), "failed": ledgertest.ErrorStatus("card declined")} {
		res := begin(l, k)
		if res.Replay == nil || !res.Replay.Outcome.Equal(want) {
			t.Fatalf("%s after reopen: %+v, want a replay of its outcome", k, res)
		}
	}
	if res := begin(l, "released"); res.Claim == nil || res.Claim.Token != released.Claim.Token+1 {
		t.Fatalf("released after reopen: %+v, want a claim with the next token", res)
	}
	_, err = l.Begin(t.Context(), ledger.BeginRequest{Scope: scope("running"), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	ledgertest.WantCode(t, err, errcode.InProgress)
}

// TestRefusesALostStore: a directory whose marker names a ledger whose
// store is gone, or another ledger's store, is refused, not started empty.
func TestRefusesALostStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := open(t, dir, pebble.Config{})
	_ = s.Close()
	if err := os.RemoveAll(filepath.Join(dir, pebble.DirName)); err != nil {
		t.Fatal(err)
	}
	if _, err := pebble.Open(dir, pebble.Config{}); !errors.Is(err, pebble.ErrRefused) {
		t.Fatalf("Open of a directory whose store is gone = %v, want ErrRefused", err)
	}

	other := t.TempDir()
	_ = open(t, other, pebble.Config{}).Close()
	if err := os.Rename(filepath.Join(other, pebble.DirName), filepath.Join(dir, pebble.DirName)); err != nil {
		t.Fatal(err)
	}
	if _, err := pebble.Open(dir, pebble.Config{}); !errors.Is(err, pebble.ErrRefused) || !strings.Contains(err.Error(), "holds ledger") {
		t.Fatalf("Open of another ledger's store = %v, want ErrRefused", err)
	}
}

// TestRefusesADamagedStore: a store whose manifest was truncated is
// refused (ErrRefused, which ledgerd does not retry), not opened.
func TestRefusesADamagedStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_ = open(t, dir, pebble.Config{}).Close()
	manifests, err := filepath.Glob(filepath.Join(dir, pebble.DirName, "MANIFEST-*"))
	if err != nil || len(manifests) == 0 {
		t.Fatalf("no manifest: %v", err)
	}
	for _, m := range manifests {
		if err := os.Truncate(m, 0); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := pebble.Open(dir, pebble.Config{}); !errors.Is(err, pebble.ErrRefused) || !strings.Contains(err.Error(), "damaged") {
		if err == nil {
			_ = s.Close()
		}
		t.Fatalf("Open of a store with a truncated manifest = %v, want ErrRefused", err)
	}
}

// TestRefusesAStoreMissingAFile: a store whose MANIFEST or a table was
// deleted, or whose MANIFEST was cut to half (it then lists tables long
// compacted away), is refused (ErrRefused: ledgerd exits, it does not
// retry), and the message says a file is missing, not that the store was
// emptied or replaced.
func TestRefusesAStoreMissingAFile(t *testing.T) {
	t.Parallel()
	halve := func(f string) error {
		st, err := os.Stat(f)
		if err != nil {
			return err
		}
		return os.Truncate(f, st.Size()/2)
	}
	for _, c := range []struct {
		name, glob string
		damage     func(string) error
	}{
		{"manifest deleted", "MANIFEST-*", os.Remove},
		{"manifest halved", "MANIFEST-*", halve},
		{"tables deleted", "*.sst", os.Remove},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			// A small memtable, so that the records reach tables.
			s := open(t, dir, pebble.Config{MemTableSize: 64 << 10})
			l := ledger.New(s, ledger.Config{})
			for i := range 2000 {
				k := fmt.Sprintf("k-%d", i)
				res, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scope(k), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.Complete(t.Context(), scope(k), res.Claim.Token, ledgertest.Response("inv")); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			files, err := filepath.Glob(filepath.Join(dir, pebble.DirName, c.glob))
			if err != nil || len(files) == 0 {
				t.Fatalf("no %s: %v", c.glob, err)
			}
			for _, f := range files {
				if err := c.damage(f); err != nil {
					t.Fatal(err)
				}
			}
			s, err = pebble.Open(dir, pebble.Config{})
			if err == nil {
				_ = s.Close()
			}
			if !errors.Is(err, pebble.ErrRefused) || !strings.Contains(err.Error(), "missing a file") || strings.Contains(err.Error(), "replaced") {
				t.Fatalf("Open of a store, %s, = %v, want ErrRefused saying a file is missing", c.name, err)
			}
		})
	}
}

func TestSecondOpenFails(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	open(t, dir, pebble.Config{})
	if s, err := pebble.Open(dir, pebble.Config{}); err == nil {
		_ = s.Close()
		t.Fatal("a second Open of the same directory succeeded")
	}
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	t.Parallel()
	s, err := pebble.Open(t.TempDir(), pebble.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	_ = s.Close()
	l := ledger.New(s, ledger.Config{})
	_, err = l.Begin(t.Context(), ledger.BeginRequest{Scope: scope("k"), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	ledgertest.WantCode(t, err, errcode.Unavailable)
	ledgertest.WantCode(t, s.Ping(t.Context()), errcode.Unavailable)
	if _, err := s.Sweep(t.Context(), 10); err == nil {
		t.Fatal("Sweep on a closed store passed")
	}
}

// TestWALSyncsCountEverySync: each claim of a lone caller waits for a
// sync of its own, and WALSyncs counts it, in seconds that fit in the
// time the claims took, under bounds from 100 µs to 10 s; a closed
// store reports none.
//
// Pebble's log writer counts a sync after it has woken the writes the
// sync made durable, so the last claim's sync may not be counted yet
// when that claim returns; the writer counts it before it starts the
// next sync, which the claim after it waits for. So the test makes one
// claim more than it counts, and times the syncs against a clock started
// before Open, whose last sync may be counted after before is read.
func TestWALSyncsCountEverySync(t *testing.T) {
	t.Parallel()
	start := time.Now()
	s, err := pebble.Open(t.TempDir(), pebble.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	before := s.WALSyncs()
	const claims = 20
	for i := range claims + 1 {
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: scope(fmt.Sprint("k-", i)), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	after := s.WALSyncs()
	if n := after.Count - before.Count; n < claims {
		t.Errorf("%d syncs counted after %d claims made one at a time; want one each at least for the first %d", n, claims+1, claims)
	}
	if d := after.Sum - before.Sum; d <= 0 || d > took {
		t.Errorf("the syncs took %v in all, for an Open and claims that took %v", d, took)
	}
	wantLe := []time.Duration{100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond,
		5 * time.Millisecond, 10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
		500 * time.Millisecond, time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second}
	if len(after.Buckets) != len(wantLe) {
		t.Fatalf("%d buckets %v; want %d", len(after.Buckets), after.Buckets, len(wantLe))
	}
	for i, b := range after.Buckets {
		// Pebble's bounds past 5 ms are a geometric series, 17% apart.
		if b.Le < wantLe[i] || float64(b.Le) > 1.17*float64(wantLe[i]) {
			t.Errorf("bucket %d's bound is %v; want the first at or above %v", i, b.Le, wantLe[i])
		}
		if i > 0 && b.Count < after.Buckets[i-1].Count {
			t.Errorf("bucket %d counts %d, below the %d of the one under it: the counts are not cumulative", i, b.Count, after.Buckets[i-1].Count)
		}
	}
	if last := after.Buckets[len(after.Buckets)-1]; last.Count != after.Count {
		t.Errorf("%d syncs within 10 s of %d in all", last.Count, after.Count)
	}
	_ = s.Close()
	if got := s.WALSyncs(); got.Count != 0 || got.Buckets != nil {
		t.Errorf("a closed store reports syncs: %+v", got)
	}
}

// crash is the kill -9 test on this store (ledgertest.Crash).
var crash = ledgertest.Crash{Child: "TestCrashChild", Env: "IDEMLEDGER_PEBBLE_CRASH_DIR",
	Open: func(dir string) (ledger.Store, func() error, error) {
		s, err := pebble.Open(dir, pebble.Config{})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}}

// TestSurvivesKill9: every key a child process acknowledged before it was
// killed with SIGKILL replays its outcome after the store opens again.
func TestSurvivesKill9(t *testing.T) {
	t.Parallel()
	crash.SurvivesKill9(t)
}

func TestCrashChild(t *testing.T) {
	t.Parallel()
	crash.RunChild(t)
}

func TestLinearizable(t *testing.T) {
	t.Parallel()
	for run := range 5 {
		t.Run(fmt.Sprint("history", run), func(t *testing.T) {
			lincheck.Run(t, func(now func() time.Time) ledger.Store {
				return open(t, t.TempDir(), pebble.Config{Now: now})
			}, lincheck.Config{})
		})
	}
}

// TestLinearizableAcrossRestarts closes and reopens the store every few
// milliseconds while the history runs.
func TestLinearizableAcrossRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var r *lincheck.Reopening
	lincheck.Run(t, func(now func() time.Time) ledger.Store {
		var err error
		r, err = lincheck.NewReopening(func() (lincheck.Closer, error) {
			s, err := pebble.Open(dir, pebble.Config{Now: now})
			if err != nil {
				return nil, err
			}
			return s, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}, lincheck.Config{Phases: 40, Fault: lincheck.Every(200*time.Microsecond, 2*time.Millisecond, func() { // the history's faults
		if err := r.Reopen(); err != nil {
			t.Error(err)
		}
	})})
	if r.Restarts() == 0 {
		t.Fatal("the store was never reopened")
	}
	t.Logf("%d restarts", r.Restarts())
}

func TestCountsByState(t *testing.T) {
	t.Parallel()
	ledgertest.CountsByState(t, func(now func() time.Time) ledger.Store {
		return open(t, t.TempDir(), pebble.Config{Now: now})
	})
}
