package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLocalClusterCommands runs the runbook's "Local cluster" commands as
// written, against compose's ledgerd and invoice service started as
// TestComposeStartsLedgerd starts them: grpcurl is this module's tool, and
// only the published addresses move to where the services listen here.
// docker compose itself cannot run here. A command marked "twice" runs
// twice and must answer the same both times.
func TestLocalClusterCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs ledgerd and the invoice service on PostgreSQL")
	}
	commands := runbookCommands(t, "../README.md", "## Local cluster")
	grpcurl, err := grpcurlBinary()
	if err != nil {
		t.Fatal(err)
	}
	published := startCompose(t, true)
	ran := 0
	for _, c := range commands {
		if strings.HasPrefix(c, "docker compose ") {
			continue
		}
		if !strings.HasPrefix(c, "grpcurl ") {
			t.Errorf("a command this test does not know how to run: %s", c)
			continue
		}
		line, comment, _ := strings.Cut(c, "#")
		line = grpcurl + strings.TrimPrefix(line, "grpcurl")
		for host, addr := range published {
			line = strings.ReplaceAll(line, " "+host+" ", " "+addr+" ")
		}
		times := 1
		if strings.Contains(comment, "twice") {
			times = 2
		}
		var first string
		for i := range times {
			cmd := exec.Command("bash", "-c", line)
			cmd.Dir = "../.." // the runbook's commands run from the repository's root
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", c, err, out)
			}
			if i == 0 {
				first = string(out)
			} else if string(out) != first {
				t.Errorf("%s: the second answer differs:\n%s\nthen:\n%s", c, first, out)
			}
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("the runbook's Local cluster section has no grpcurl command")
	}
}

// runbookCommands returns the commands of the first sh block under heading
// in the markdown file, each with its continuation lines joined; comment
// lines are left out.
func runbookCommands(t *testing.T, file, heading string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Clean(file))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no section %q", file, heading)
	}
	block := regexp.MustCompile("(?s)```sh\n(.*?)```").FindStringSubmatch(section)
	if block == nil {
		t.Fatalf("%s's section %q has no sh block", file, heading)
	}
	var commands []string
	var cur strings.Builder
	for _, l := range strings.Split(block[1], "\n") {
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			continue
		}
		cur.WriteString(l)
		if c := strings.TrimSpace(cur.String()); c != "" && !strings.HasPrefix(c, "#") {
			commands = append(commands, c)
		}
		cur.Reset()
	}
	return commands
}
