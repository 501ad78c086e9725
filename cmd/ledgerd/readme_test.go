package main_test

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// TestQuickStartRunsTwice runs the README's quick start, as written, twice
// against a ledgerd on its embedded store: each run claims a fresh key,
// completes it and gets its replay. Only the address is the test's own.
func TestQuickStartRunsTwice(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("fetches grpcurl through the Go module proxy")
	}
	blocks := readmeBlocks(t, "## Quick start")
	if len(blocks) != 2 {
		t.Fatalf("the README's Quick start has %d sh blocks, want 2: grpcurl and curl", len(blocks))
	}
	p := start(t, "--data-dir", t.TempDir())
	for i, block := range blocks {
		script := "set -euo pipefail\n" + strings.NewReplacer("127.0.0.1:7070", p.grpc, "127.0.0.1:7072", p.http).Replace(block)
		for run := 1; run <= 2; run++ {
			cmd := exec.Command("bash", "-c", script)
			cmd.Dir = t.TempDir() // outside the workspace, as a user's shell would be
			cmd.Env = append(os.Environ(), "GOFLAGS=")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("block %d, run %d: %v\n%s", i+1, run, err, out)
			}
			text := string(out)
			claim, done, replay := strings.Index(text, `"claim"`), strings.Index(text, `"completedAt"`), strings.Index(text, `"replay"`)
			if claim < 0 || done < claim || replay < done || !strings.Contains(text[replay:], "inv_0042") {
				t.Fatalf("block %d, run %d: want a claim, a completion, then a replay of inv_0042; got\n%s", i+1, run, text)
			}
		}
	}
}

// TestProtectAMethodReplays runs the README's "Protect a method" as
// written: invoice-server started with its command (only its addresses
// come from the environment it documents), then the same CreateInvoice
// twice with grpcurl: one invoice, the second answer marked replayed.
func TestProtectAMethodReplays(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	if testing.Short() {
		t.Skip("fetches grpcurl through the Go module proxy")
	}
	blocks := readmeBlocks(t, "## Protect a method")
	if len(blocks) != 2 {
		t.Fatalf("the README's Protect a method has %d sh blocks, want 2: the server, the calls", len(blocks))
	}
	p := start(t, "--data-dir", t.TempDir())

	server := exec.Command("bash", "-c", "set -euo pipefail\nexec "+strings.TrimSpace(blocks[0]))
	server.Dir = "../.."
	server.Env = append(os.Environ(), "INVOICE_LISTEN=127.0.0.1:0", "INVOICE_LEDGER="+p.grpc)
	server.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // go run's child goes with it
	stderr, err := server.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-server.Process.Pid, syscall.SIGKILL)
		_ = server.Wait()
	})
	var addr string
	var logs strings.Builder
	lines := bufio.NewScanner(stderr)
	for addr == "" && lines.Scan() {
		logs.Write(append(lines.Bytes(), '\n'))
		var line struct{ Msg, GRPC string }
		if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "invoice-server listening" {
			addr = line.GRPC
		}
	}
	if addr == "" {
		t.Fatalf("invoice-server did not say where it listens:\n%s", logs.String())
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()

	cmd := exec.Command("bash", "-c", "set -euo pipefail\n"+strings.ReplaceAll(blocks[1], "127.0.0.1:8080", addr))
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	text := string(out)
	second := strings.LastIndex(text, "Response contents:")
	first := strings.Index(text, "Response contents:")
	if first < 0 || second == first {
		t.Fatalf("want two answers:\n%s", text)
	}
	if strings.Contains(text[:first], "idempotency-replayed") || !strings.Contains(text[first:], "idempotency-replayed: true") {
		t.Fatalf("want the first answer fresh and the second replayed:\n%s", text)
	}
	ids := regexp.MustCompile(`"id": "([^"]+)"`).FindAllStringSubmatch(text, -1)
	if len(ids) != 2 || ids[0][1] != ids[1][1] {
		t.Fatalf("want one invoice twice, got %v:\n%s", ids, text)
	}
}

// readmeBlocks returns the sh blocks of the README's section heading.
func readmeBlocks(t *testing.T, heading string) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	i := strings.Index(section, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("the README has no %q", heading)
	}
	section = section[i+1:]
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	var blocks []string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		blocks = append(blocks, m[1])
	}
	return blocks
}
