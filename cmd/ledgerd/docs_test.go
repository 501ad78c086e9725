package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestDocsListEveryFlag: docs/ledgerd.md names every flag and every
// subcommand ledgerd --help lists.
func TestDocsListEveryFlag(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	doc, err := os.ReadFile("../../docs/ledgerd.md")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(binary, "--help").CombinedOutput() // exits 0 or 2, by flag package
	flags := regexp.MustCompile(`(?m)^\s+-([a-z][a-z-]+)`).FindAllStringSubmatch(string(out), -1)
	if len(flags) < 20 {
		t.Fatalf("ledgerd --help listed %d flags:\n%s", len(flags), out)
	}
	for _, f := range flags {
		if !strings.Contains(string(doc), "`--"+f[1]+"`") {
			t.Errorf("docs/ledgerd.md does not list --%s", f[1])
		}
	}
	jobs := regexp.MustCompile(`(?m)^\s+(ledgerd [a-z ]+?) \[flags\]`).FindAllStringSubmatch(string(out), -1)
	if len(jobs) != 3 {
		t.Fatalf("ledgerd --help listed %d subcommands, want 3 (migrate, homes apply, homes print):\n%s", len(jobs), out)
	}
	for _, j := range jobs {
		if !strings.Contains(string(doc), "`"+j[1]+"`") {
			t.Errorf("docs/ledgerd.md does not list %s", j[1])
		}
	}
}

// TestDocsListEveryMetric: docs/ledgerd.md's Metrics names every
// idemledger_* family that a ledgerd on its embedded store exports (the
// SQL families are checked by name in TestPostgreSQLStore).
func TestDocsListEveryMetric(t *testing.T) {
	t.Parallel() // its own process and directory
	doc, err := os.ReadFile("../../docs/ledgerd.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "\n## Metrics\n")
	section, _, _ = strings.Cut(section, "\n## ")
	p := start(t, "--data-dir", t.TempDir())
	p.waitServing(t, p.dial(t))
	families := regexp.MustCompile(`(?m)^# TYPE (idemledger_[a-z_]+) `).FindAllStringSubmatch(p.metrics(t), -1)
	if len(families) < 10 {
		t.Fatalf("ledgerd exported %d idemledger families", len(families))
	}
	for _, f := range families {
		name := f[1]
		if !strings.Contains(section, "`"+name) && !strings.Contains(section, "`_"+strings.TrimPrefix(name, "idemledger_sql_")) {
			t.Errorf("docs/ledgerd.md's Metrics does not name %s", name)
		}
	}
}
