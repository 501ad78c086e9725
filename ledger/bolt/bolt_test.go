package bolt_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/bolt"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/lincheck"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, dir string, cfg bolt.Config) *bolt.Store {
	t.Helper()
	s, err := bolt.Open(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestRecordsSurviveReopen closes the store and opens the file again: every
// state, token and outcome reads back as it was written.
func TestRecordsSurviveReopen(t *testing.T) {
	dir := t.TempDir()
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := bolt.Open(dir, bolt.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	scope := func(k string) ledger.Scope { return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k} }
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

	s = open(t, dir, bolt.Config{Now: clock.Now})
	l = ledger.New(s, ledger.Config{})
	for k, want := range map[string]*ledger.Outcome{"done": ledgertest.Response("inv_1"), "failed": ledgertest.ErrorStatus("card declined")} {
		res := begin(l, k)
		if res.Replay == nil {
			t.Fatalf("%s after reopen: %+v, want a replay", k, res)
		}
		if !res.Replay.Outcome.Equal(want) {
			t.Errorf("%s replays %v, want %v", k, res.Replay.Outcome, want)
		}
	}
	if res := begin(l, "released"); res.Claim == nil || res.Claim.Token != released.Claim.Token+1 {
		t.Errorf("released key after reopen: %+v, want a claim with token %d", res, released.Claim.Token+1)
	}
	_, err = l.Begin(t.Context(), ledger.BeginRequest{Scope: scope("running"), Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	ledgertest.WantCode(t, err, ledger.CodeInProgress)
}

func TestSecondProcessCannotOpen(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, bolt.Config{})
	_, err := bolt.Open(dir, bolt.Config{OpenTimeout: 50 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked") {
		t.Fatalf("second Open = %v, want a locked-file error", err)
	}
}

func TestClosedStoreIsUnavailable(t *testing.T) {
	s, err := bolt.Open(t.TempDir(), bolt.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping = %v", err)
	}
	_ = s.Close()
	l := ledger.New(s, ledger.Config{})
	_, err = l.Begin(t.Context(), ledger.BeginRequest{Scope: ledger.Scope{Namespace: "n", Tenant: "t", Key: "k"}, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	ledgertest.WantCode(t, err, ledger.CodeUnavailable)
	ledgertest.WantCode(t, s.Ping(t.Context()), ledger.CodeUnavailable)
}

// crash is the kill -9 test on this store (ledgertest.Crash).
var crash = ledgertest.Crash{Child: "TestCrashChild", Env: "IDEMLEDGER_BOLT_CRASH_DIR",
	Open: func(dir string) (ledger.Store, func() error, error) {
		s, err := bolt.Open(dir, bolt.Config{})
		if err != nil {
			return nil, nil, err
		}
		return s, s.Close, nil
	}}

// TestSurvivesKill9: every key a child process acknowledged before it was
// killed with SIGKILL replays its outcome after the store opens again.
func TestSurvivesKill9(t *testing.T) { crash.SurvivesKill9(t) }

func TestCrashChild(t *testing.T) { crash.RunChild(t) }

func TestLinearizable(t *testing.T) {
	for run := range 5 {
		t.Run(fmt.Sprint("history", run), func(t *testing.T) {
			lincheck.Run(t, func(now func() time.Time) ledger.Store {
				return open(t, t.TempDir(), bolt.Config{Now: now})
			}, lincheck.Config{})
		})
	}
}

// TestLinearizableAcrossRestarts closes and reopens the store every few
// milliseconds while the history runs.
func TestLinearizableAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	var r *lincheck.Reopening
	lincheck.Run(t, func(now func() time.Time) ledger.Store {
		var err error
		r, err = lincheck.NewReopening(func() (lincheck.Closer, error) {
			s, err := bolt.Open(dir, bolt.Config{Now: now})
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
	}, lincheck.Config{Phases: 40, Fault: func(ctx context.Context, _ int) {
		for ctx.Err() == nil {
			time.Sleep(time.Duration(2+rand.IntN(8)) * time.Millisecond)
			if err := r.Reopen(); err != nil {
				t.Error(err)
				return
			}
		}
	}})
	if r.Restarts() == 0 {
		t.Fatal("the store was never reopened")
	}
	t.Logf("%d restarts", r.Restarts())
}

func TestCountsByState(t *testing.T) {
	ledgertest.CountsByState(t, func(now func() time.Time) ledger.Store {
		s, err := bolt.Open(t.TempDir(), bolt.Config{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
