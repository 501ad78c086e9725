package ledger_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules enforces the one-way imports of STYLE.md over the whole
// module: ledger imports no package of the module; stores import ledger
// only; server never imports a store; interceptors import the generated
// code, ledger and ledgerstatus, never server or a store; only cmd/ and
// examples/ wire everything. Tests are exempt.
func TestImportRules(t *testing.T) {
	const mod = "github.com/idemledger/idemledger/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	stores := []string{mod + "ledger/memory", mod + "ledger/bolt", mod + "ledger/crdb"}
	rules := []struct {
		pkg    string   // a package, or a prefix ending in /
		banned []string // imports it must not have (prefixes)
	}{
		{mod + "ledger", []string{mod}},
		{mod + "ledger/ledgerstatus", append([]string{mod + "server", mod + "interceptors"}, stores...)},
		{mod + "server", append([]string{mod + "interceptors", mod + "cmd"}, stores...)},
		{mod + "interceptors/", append([]string{mod + "server", mod + "cmd"}, stores...)},
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, " ")
		for _, r := range rules {
			if pkg != r.pkg && !(strings.HasSuffix(r.pkg, "/") && strings.HasPrefix(pkg, r.pkg)) {
				continue
			}
			for _, imp := range strings.Fields(imports) {
				for _, b := range r.banned {
					if strings.HasPrefix(imp, b) {
						t.Errorf("%s imports %s", pkg, imp)
					}
				}
			}
		}
	}
}
