package bolt_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
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

// crashEnv names the data directory of the child process of
// TestSurvivesKill9; when it is set, TestCrashChild is that child.
const crashEnv = "IDEMLEDGER_BOLT_CRASH_DIR"

// TestSurvivesKill9 runs a child process that claims and completes keys from
// 8 goroutines and prints each key once Complete has returned, kills it with
// SIGKILL in the middle of that, and opens the file again: every key the
// child acknowledged replays its outcome, and every other key is absent or
// in progress, never damaged.
func TestSurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$")
	cmd.Env = append(os.Environ(), crashEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	lines := bufio.NewScanner(out)
	for lines.Scan() && len(acked) < 300 {
		if k, ok := strings.CutPrefix(lines.Text(), "completed "); ok {
			acked[k] = true
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(acked) < 300 {
		t.Fatalf("the child acknowledged only %d keys before it stopped", len(acked))
	}

	s := open(t, dir, bolt.Config{})
	for k := range acked {
		rec, err := s.Get(t.Context(), crashScope(k))
		if err != nil {
			t.Fatalf("acknowledged key %s after kill -9: %v", k, err)
		}
		if rec.State != ledger.StateCompleted || !rec.Outcome.Equal(ledgertest.Response("inv_"+k)) {
			t.Fatalf("acknowledged key %s after kill -9: state %s outcome %v", k, rec.State, rec.Outcome)
		}
	}
	if n, err := s.Sweep(t.Context(), 1<<20); err != nil || n != 0 {
		t.Fatalf("Sweep of live records = %d, %v", n, err)
	}
}

func crashScope(k string) ledger.Scope {
	return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k}
}

func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashEnv)
	if dir == "" {
		t.Skip("the child of TestSurvivesKill9")
	}
	s, err := bolt.Open(dir, bolt.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				k := fmt.Sprintf("g%d-%d", g, i)
				res, err := l.Begin(context.Background(), ledger.BeginRequest{Scope: crashScope(k), Fingerprint: ledgertest.Fingerprint(k), Method: ledgertest.Method})
				if err != nil {
					panic(err)
				}
				if _, err := l.Complete(context.Background(), crashScope(k), res.Claim.Token, ledgertest.Response("inv_"+k)); err != nil {
					panic(err)
				}
				mu.Lock()
				fmt.Printf("completed %s\n", k)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

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
