// Package ledgerdtest runs the ledgerd binary for the tests of the
// modules that drive it from outside (idemctl, the guard cases): Main
// builds it once from the workspace, Start runs it on loopback ports of
// its own choosing.
package ledgerdtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/syncbuf"
)

// binary is ledgerd, built by Main.
var binary string

// Main builds ledgerd from the workspace (go.work), runs the tests and
// removes the binary: a test package's TestMain is
// os.Exit(ledgerdtest.Main(m)).
func Main(m *testing.M) int { return Run(m.Run) }

// Run is Main for a TestMain that has more to do, such as pgtest.Run: it
// builds ledgerd, calls run, removes the binary and returns run's code.
func Run(run func() int) int {
	dir, err := os.MkdirTemp("", "ledgerdtest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = os.RemoveAll(dir) }()
	binary = filepath.Join(dir, "ledgerd")
	if out, err := exec.Command("go", "build", "-o", binary, "github.com/idemledger/idemledger/cmd/ledgerd").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building ledgerd: %v\n%s", err, out)
		return 2
	}
	return run()
}

// Proc is a running ledgerd: where it listens ("" for a listener it does
// not open) and what it logged.
type Proc struct {
	GRPC, Admin, HTTP string
	Log               *syncbuf.Buffer
	cmd               *exec.Cmd
	done              chan struct{} // closed when its log ends: it exited
}

// Terminate sends ledgerd SIGTERM and waits for it to drain and exit; it
// returns how it exited.
func (p *Proc) Terminate() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	<-p.done
	return p.cmd.Wait()
}

// Start runs ledgerd with args after loopback listeners of its own
// choosing (args can override them; "" turns one off) and waits until it
// says where it listens. It is killed when the test ends.
func Start(t *testing.T, args ...string) *Proc {
	t.Helper()
	if binary == "" {
		t.Fatal("ledgerdtest.Start without ledgerdtest.Main in TestMain")
	}
	cmd := exec.Command(binary, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	p := &Proc{Log: &syncbuf.Buffer{}, cmd: cmd, done: done}
	ready := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			_, _ = p.Log.Write(append(sc.Bytes(), '\n'))
			var line struct{ Msg, GRPC, Admin, HTTP string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "ledgerd listening" {
				p.GRPC, p.Admin, p.HTTP = line.GRPC, line.Admin, line.HTTP
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = cmd.Wait() // after Terminate: waited already
		if t.Failed() {
			t.Logf("ledgerd log:\n%s", p.Log.String())
		}
	})
	select {
	case <-ready:
		return p
	case <-done:
		t.Fatalf("ledgerd exited before it listened:\n%s", p.Log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("ledgerd did not listen within 30s:\n%s", p.Log.String())
	}
	return nil
}
