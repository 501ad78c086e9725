package main_test

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestStaticBinaryInEmptyEnvironment does what the container image relies
// on: ledgerd built with CGO_ENABLED=0 is static (no dynamic loader), and
// runs with an empty environment, in an empty directory, as an unprivileged
// user (when the test runs as root), then stops cleanly on SIGTERM.
func TestStaticBinaryInEmptyEnvironment(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("builds ledgerd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "ledgerd")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary needs a dynamic loader")
		}
	}
	_ = f.Close()

	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o777); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--admin-listen", "", "--http-listen", "", "--data-dir", "data")
	cmd.Env = []string{}
	cmd.Dir = work
	if os.Geteuid() == 0 {
		for _, d := range []string{filepath.Dir(dir), dir} { // t.TempDir's directories are 0700
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(work, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	timeout := time.After(20 * time.Second)
	for listening := false; !listening; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("ledgerd exited before it listened")
			}
			listening = strings.Contains(l, `"msg":"ledgerd listening"`)
		case <-timeout:
			t.Fatal("ledgerd did not listen within 20s")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go func() {
		for range lines {
		}
	}()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("ledgerd after SIGTERM: %v", err)
	}
	if _, err := os.Stat(filepath.Join(work, "data", "ledger")); err != nil {
		t.Fatalf("the embedded store was not created: %v", err)
	}
}

// TestVersion builds ledgerd with VCS stamping and checks that --version
// prints the module version, the revision it was built from and the Go
// version, and exits 0 without starting anything.
func TestVersion(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "ledgerd")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("ledgerd --version: %v", err)
	}
	fields := strings.Fields(string(out))
	if len(fields) < 5 || fields[0] != "ledgerd" || !strings.HasPrefix(fields[1], "v") || fields[2] != "rev" ||
		fields[3] != strings.TrimSpace(string(head)) || !strings.HasPrefix(fields[len(fields)-1], "go1.") {
		t.Fatalf("ledgerd --version = %q; want ledgerd, a module version, rev %s, ..., the Go version", out, strings.TrimSpace(string(head)))
	}
}

// TestImageStampsTheVersion runs the Dockerfile's build command as it is
// written, with its VERSION and REVISION build arguments set and without
// VCS stamping (the image's build context has no .git): the binary's
// --version prints them.
func TestImageStampsTheVersion(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("builds ledgerd")
	}
	dockerfile, err := os.ReadFile("../../deploy/docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var ldflags string
	for _, line := range strings.Split(string(dockerfile), "\n") {
		if _, rest, ok := strings.Cut(line, `go build -trimpath -ldflags="`); ok {
			ldflags, _, _ = strings.Cut(rest, `"`)
		}
	}
	if !strings.Contains(ldflags, "${VERSION}") || !strings.Contains(ldflags, "${REVISION}") {
		t.Fatalf("the Dockerfile's build stamps no VERSION and REVISION: -ldflags=%q", ldflags)
	}
	ldflags = strings.NewReplacer("${VERSION}", "v9.8.7", "${REVISION}", "abc123").Replace(ldflags)
	bin := filepath.Join(t.TempDir(), "ledgerd")
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags="+ldflags, "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(out)); len(f) < 5 || f[1] != "v9.8.7" || f[2] != "rev" || f[3] != "abc123" {
		t.Fatalf("ledgerd --version = %q; want ledgerd v9.8.7 rev abc123 …", out)
	}
}
