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
// TestComposeStartsLedgerd starts them, from the repository's root:
// grpcurl is this module's tool, curl and go run are the machine's, and
// only the published addresses move to where the services listen here.
// docker compose itself cannot run here. A command marked "twice" runs
// twice and must answer the same both times; each command's answer is
// checked for what the runbook says it shows.
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
	for _, port := range []string{"7070", "7071", "7072"} {
		if published["localhost:"+port] == "" {
			t.Errorf("compose's ledgerd does not publish %s", port)
		}
	}
	// What each command must print, by what it runs.
	want := []struct{ prefix, shows string }{
		{"grpcurl -plaintext -import-path proto ", `"claim"`},
		{"grpcurl -plaintext -import-path examples/proto ", `"invoice"`},
		{"curl -s localhost:7072/", `{"claim":`},
		{"go run ./cmd/idemctl ", "k-2"},
		{"curl -s -o /dev/null -w ", "303"},
	}
	ran := map[string]bool{}
	for _, c := range commands {
		if strings.HasPrefix(c, "docker compose ") {
			continue
		}
		shows := ""
		for _, w := range want {
			if strings.HasPrefix(c, w.prefix) {
				shows, ran[w.prefix] = w.shows, true
			}
		}
		if shows == "" {
			t.Errorf("a command this test does not know: %s", c)
			continue
		}
		line, comment, _ := strings.Cut(c, "#")
		if strings.HasPrefix(line, "grpcurl ") {
			line = grpcurl + strings.TrimPrefix(line, "grpcurl")
		}
		for host, addr := range published {
			line = strings.ReplaceAll(line, host, addr)
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
			if !strings.Contains(string(out), shows) {
				t.Errorf("%s: want %s in its answer:\n%s", c, shows, out)
			}
			if i == 0 {
				first = string(out)
			} else if string(out) != first {
				t.Errorf("%s: the second answer differs:\n%s\nthen:\n%s", c, first, out)
			}
		}
	}
	for _, w := range want {
		if !ran[w.prefix] {
			t.Errorf("the runbook's Local cluster section has no %q command", w.prefix)
		}
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

// TestAdminCredentialCommands runs the runbook's "Admin credentials"
// commands as written, in a directory of their own: openssl mints the
// token, and idemctl prints its token-file entry. That entry, in a
// ledgerd's token file, lets the "Find and settle" section's list command
// run as written, only ledgerd's address added.
func TestAdminCredentialCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs ledgerd and idemctl")
	}
	idemctl, err := idemctlBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var entry string
	for _, c := range runbookCommands(t, "../README.md", "## Admin credentials") {
		line, _, _ := strings.Cut(c, "#")
		if strings.HasPrefix(line, "idemctl ") {
			line = idemctl + strings.TrimPrefix(line, "idemctl")
		}
		cmd := exec.Command("bash", "-c", line)
		cmd.Dir = dir
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		if strings.Contains(c, "hash-token") {
			entry = strings.TrimSpace(string(out))
		}
	}
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64} _admin ops-alice$`).MatchString(entry) {
		t.Fatalf("the token-file entry: %q", entry)
	}

	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(entry+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ports: map[string]string{}}
	addr := w.addr("127.0.0.1:7070")
	w.exited = run(t, []string{"--tokens", tokens, "--data-dir", filepath.Join(dir, "data"), "--listen", addr,
		"--admin-listen", w.addr("127.0.0.1:7071"), "--http-listen", w.addr("127.0.0.1:7072")}, []string{}).exited
	w.waitServing("ledgerd", addr, "idemledger.v1.LedgerService")

	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	list := regexp.MustCompile("`(idemctl --token-file ops-alice.token list [^`]*)`").FindStringSubmatch(string(b))
	if list == nil {
		t.Fatal("the runbook has no idemctl list command")
	}
	cmd := exec.Command("bash", "-c", idemctl+" --addr "+addr+strings.TrimPrefix(list[1], "idemctl"))
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", list[1], err, out)
	}
}
