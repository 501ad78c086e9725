package main_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestDocsListEveryFlag: docs/ledgerd.md names every flag ledgerd --help
// lists.
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
}
