package ledgertest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/idemledger/idemledger/ledger"
)

// Crash is the kill -9 test of a durable store. In the test process,
// SurvivesKill9 runs the test binary again as a child that runs the test
// named Child, with the data directory in the environment variable Env;
// that test calls RunChild. Open opens the store in a directory.
type Crash struct {
	Child, Env string
	Open       func(dir string) (ledger.Store, func() error, error)
}

func crashScope(k string) ledger.Scope {
	return ledger.Scope{Namespace: "billing", Tenant: "acme", Key: k}
}

// SurvivesKill9 starts the child, which claims and completes keys from 8
// goroutines and prints each key once Complete has returned, kills it with
// SIGKILL after 300 keys, and opens the store again: every key the child
// acknowledged replays its outcome, and a sweep finds nothing to do.
func (c Crash) SurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^"+c.Child+"$")
	cmd.Env = append(os.Environ(), c.Env+"="+dir)
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
	s, closeStore, err := c.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closeStore() })
	for k := range acked {
		rec, err := s.Get(t.Context(), crashScope(k))
		if err != nil {
			t.Fatalf("acknowledged key %s after kill -9: %v", k, err)
		}
		if rec.State != ledger.StateCompleted || !rec.Outcome.Equal(Response("inv_"+k)) {
			t.Fatalf("acknowledged key %s after kill -9: state %s outcome %v", k, rec.State, rec.Outcome)
		}
	}
	if sw, ok := s.(interface {
		Sweep(context.Context, int) (int, error)
	}); ok {
		if n, err := sw.Sweep(t.Context(), 1<<20); err != nil || n != 0 {
			t.Fatalf("Sweep of live records = %d, %v", n, err)
		}
	}
}

// RunChild is the child's test: it skips unless Env names a directory,
// and otherwise writes until it is killed.
func (c Crash) RunChild(t *testing.T) {
	dir := os.Getenv(c.Env)
	if dir == "" {
		t.Skip("the child of the kill -9 test")
	}
	s, _, err := c.Open(dir)
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
				res, err := l.Begin(context.Background(), ledger.BeginRequest{Scope: crashScope(k), Fingerprint: Fingerprint(k), Method: Method})
				if err != nil {
					panic(err)
				}
				if _, err := l.Complete(context.Background(), crashScope(k), res.Claim.Token, Response("inv_"+k)); err != nil {
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
