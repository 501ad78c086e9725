package main_test

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// smallDisk mounts a tmpfs of size bytes for the test: a disk that fills.
// Without the right to mount (not root) the test skips, except under CI.
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mount a tmpfs (CI runs as root): %v: %s", err, out)
		}
		t.Skipf("cannot mount a tmpfs to fill: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a file in dir until the disk is full, and returns it.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			return path
		}
	}
}

// status is an admin endpoint's HTTP status.
func (p *proc) status(t *testing.T, path string) int {
	t.Helper()
	r, err := http.Get("http://" + p.admin + path)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	return r.StatusCode
}

// waitStatus polls an admin endpoint until it answers want.
func (p *proc) waitStatus(t *testing.T, path string, want int) {
	t.Helper()
	ledgertest.Eventually(t, 20*time.Second, func() bool { return p.status(t, path) == want }, "%s did not turn %d", path, want)
}

// TestFullDisk fills the disk of ledgerd's embedded store, a tmpfs, after
// a few completed keys: a write is answered UNAVAILABLE, retryable, at
// once; /readyz turns 503 while /healthz stays 200; the completed keys
// still replay; Pebble's complaints are few; the process stays up. With
// room again, it is ready and takes writes. Filled again, it exits on
// SIGTERM within --drain-timeout; started on the full disk, it does not
// end, is not ready, and becomes ready when room returns.
func TestFullDisk(t *testing.T) {
	disk := smallDisk(t, "256m")
	data := filepath.Join(disk, "data")
	args := []string{"--data-dir", data, "--drain-timeout", "3s", "--log-level", "info"}
	p := start(t, args...)
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	complete := func(key string) {
		t.Helper()
		res, err := client.Begin(t.Context(), begin(key))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: res.GetClaim().GetToken(), Outcome: invoice}); err != nil {
			t.Fatal(err)
		}
	}
	replays := func(conn *grpc.ClientConn, key string) {
		t.Helper()
		res, err := ledgerv1.NewLedgerServiceClient(conn).Begin(t.Context(), begin(key))
		if err != nil || res.GetReplay() == nil {
			t.Fatalf("Begin of completed %s: %v, %v; want its replay", key, res, err)
		}
	}
	for _, k := range []string{"a", "b", "c"} {
		complete(k)
	}

	filler := fill(t, disk)
	asked := time.Now()
	_, err := client.Begin(t.Context(), begin("on-a-full-disk"))
	le := ledgertest.WantStatus(t, err, errcode.Unavailable)
	if !le.Retryable() || le.RetryAfter <= 0 || !strings.Contains(le.Message, "disk") {
		t.Fatalf("a write on a full disk = %+v; want a retryable UNAVAILABLE with a hint, saying the disk is full", le)
	}
	if d := time.Since(asked); d > 2*time.Second {
		t.Fatalf("the write on a full disk took %s to be refused", d)
	}
	p.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
	if got := p.status(t, "/healthz"); got != http.StatusOK {
		t.Fatalf("/healthz on a full disk = %d; want 200 (room returns; no restart needed)", got)
	}
	replays(conn, "a")
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	p.waitStatus(t, "/readyz", http.StatusOK)
	complete("after-room-returned")

	filler = fill(t, disk)
	p.waitStatus(t, "/readyz", http.StatusServiceUnavailable)
	signaled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM on a full disk, want 0", code)
	}
	if d := time.Since(signaled); d > 5*time.Second {
		t.Fatalf("SIGTERM on a full disk took %s, want under --drain-timeout (3 s) and a little", d)
	}

	q := start(t, args...)
	for range 3 {
		if q.status(t, "/readyz") != http.StatusServiceUnavailable {
			t.Fatal("ready on a full disk")
		}
		select {
		case <-q.exited:
			t.Fatalf("ledgerd on a full disk ended:\n%s", q.logs())
		case <-time.After(time.Second): // the assertion is that it stays up: watch it a while
		}
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	q.waitStatus(t, "/readyz", http.StatusOK)
	qconn := q.dial(t)
	for _, k := range []string{"a", "b", "c", "after-room-returned"} {
		replays(qconn, k)
	}
	if n := strings.Count(p.logs()+q.logs(), "\n"); n > 200 {
		t.Fatalf("%d log lines over the test; want few (Pebble's retries are rate-limited):\n%s", n, p.logs()+q.logs())
	}
}
