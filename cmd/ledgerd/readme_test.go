package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
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
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	if i := strings.Index(section, "## Quick start"); i >= 0 {
		section = section[i:]
	}
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 2 {
		t.Fatalf("the README's Quick start has %d sh blocks, want 2: grpcurl and curl", len(blocks))
	}
	p := start(t, "--data-dir", t.TempDir())
	for i, block := range blocks {
		script := "set -euo pipefail\n" + strings.NewReplacer("127.0.0.1:7070", p.grpc, "127.0.0.1:7072", p.http).Replace(block[1])
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
