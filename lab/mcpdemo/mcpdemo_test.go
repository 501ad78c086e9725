package mcpdemo_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/lab/mcpdemo"
)

const serveEnv = "MCPDEMO_SERVE_ARGS"

func TestMain(m *testing.M) {
	if args := os.Getenv(serveEnv); args != "" {
		if err := mcpdemo.Serve(strings.Fields(args)); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestDemo runs the demo: every fault kind happens, the tool server is
// killed and restarted, and every intent writes one invoice and is
// answered with it.
func TestDemo(t *testing.T) {
	rep, err := mcpdemo.Run(t.Context(), mcpdemo.Config{
		Intents: 30, Lease: 500 * time.Millisecond, Dir: t.TempDir(), Log: testWriter{t},
		Server: func(args ...string) *exec.Cmd {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), serveEnv+"="+strings.Join(args, " "))
			return cmd
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if !rep.OK() || rep.Duplicates != 0 {
		t.Fatalf("report %+v: want every intent once", rep)
	}
	for _, kind := range mcpdemo.FaultKinds {
		if rep.Faults[kind] == 0 {
			t.Errorf("no %s happened", kind)
		}
	}
	if want := rep.Faults[mcpdemo.FaultCrashBefore] + rep.Faults[mcpdemo.FaultCrashAfter]; rep.Restarts != want {
		t.Errorf("%d restarts, want one per crash written down (%d)", rep.Restarts, want)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
