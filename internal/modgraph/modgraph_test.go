// Package modgraph holds the test that keeps the write services' module
// graph slim: a service that imports the packages made for it must not
// inherit the daemon's, the stores' or the lab's dependencies.
package modgraph

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// writeServicePackages are the packages a write service imports.
var writeServicePackages = []string{
	"github.com/idemledger/idemledger/gen/idemledger/v1",
	"github.com/idemledger/idemledger/interceptors/fingerprint",
	"github.com/idemledger/idemledger/interceptors/guard",
	"github.com/idemledger/idemledger/interceptors/httpguard",
	"github.com/idemledger/idemledger/interceptors/idemclient",
	"github.com/idemledger/idemledger/interceptors/grpcguard",
	"github.com/idemledger/idemledger/ledger",
	"github.com/idemledger/idemledger/ledger/errcode",
	"github.com/idemledger/idemledger/ledger/ledgerclient",
	"github.com/idemledger/idemledger/ledger/ledgerstatus",
}

// forbidden are module path prefixes that must not enter a write service's
// module graph: the stores' drivers, the daemon's metrics and flags, the
// lab's plotting and the conformance checker.
var forbidden = []string{
	"github.com/jackc/pgx",
	"github.com/jackc/puddle",
	"github.com/cockroachdb/",
	"github.com/prometheus/",
	"github.com/grpc-ecosystem/go-grpc-middleware/providers/",
	"github.com/peterbourgon/ff",
	"gonum.org/v1/plot",
	"github.com/anishathalye/porcupine",
	"github.com/modelcontextprotocol/",
	"connectrpc.com/",
}

// TestWriteServiceModuleGraph makes a throwaway write service that uses an
// old pgx of its own, tidies it, then adds an import of every
// write-service package of this repository and tidies it again. It fails
// if a forbidden module entered the graph, or if the service's own
// forbidden-listed modules (its pgx) moved.
func TestWriteServiceModuleGraph(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Go module proxy or a warm module cache")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "go.mod"), "module example.com/writeservice\n\ngo 1.26.0\n\n"+
		"require github.com/jackc/pgx/v5 v5.5.0\n\n"+
		"replace github.com/idemledger/idemledger => "+root+"\n")
	write(t, filepath.Join(dir, "main.go"), "package main\n\nimport _ \"github.com/jackc/pgx/v5\"\n\nfunc main() {}\n")
	gocmd(t, dir, "mod", "tidy")
	before := graph(t, dir)

	var imports strings.Builder
	for _, p := range writeServicePackages {
		imports.WriteString("\t_ \"" + p + "\"\n")
	}
	write(t, filepath.Join(dir, "main.go"), "package main\n\nimport (\n\t_ \"github.com/jackc/pgx/v5\"\n"+imports.String()+")\n\nfunc main() {}\n")
	gocmd(t, dir, "get", "github.com/idemledger/idemledger@v0.0.0-00010101000000-000000000000")
	gocmd(t, dir, "mod", "tidy")
	after := graph(t, dir)

	for path, version := range after {
		if !isForbidden(path) {
			continue
		}
		switch was, ok := before[path]; {
		case !ok:
			t.Errorf("%s@%s entered a write service's module graph", path, version)
		case was != version:
			t.Errorf("the service's %s moved from %s to %s", path, was, version)
		}
	}
	if t.Failed() {
		t.Logf("go list -m all after: %v", after)
	}
}

func isForbidden(path string) bool {
	for _, f := range forbidden {
		if strings.HasPrefix(path, f) {
			return true
		}
	}
	return false
}

// graph is `go list -m all` in dir: each module's version by its path.
func graph(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(gocmd(t, dir, "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")), "\n") {
		path, version, _ := strings.Cut(line, " ")
		m[path] = version
	}
	return m
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// gocmd runs the go command in dir, outside this repository's workspace,
// and returns its standard output.
func gocmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// floorModules are the modules a write service imports, whose requirements
// are floors: the lowest versions they build and pass their tests with.
var floorModules = []string{".", "interceptors/mcpguard", "interceptors/connectguard", "interceptors/fence"}

// TestDocsGiveTheFloors: docs/repository.md's dependency table gives a floor
// for exactly the direct requirements of the floor modules, at the
// versions they require.
func TestDocsGiveTheFloors(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	table := docFloors(t, filepath.Join(root, "docs", "repository.md"))
	seen := map[string]bool{}
	for _, m := range floorModules {
		for path, version := range directRequirements(t, filepath.Join(root, m)) {
			seen[path] = true
			switch floor, ok := table[path]; {
			case !ok:
				t.Errorf("%s requires %s %s, which docs/repository.md's floors do not give", m, path, version)
			case floor != version:
				t.Errorf("%s requires %s %s; docs/repository.md gives the floor %s", m, path, version, floor)
			}
		}
	}
	for path := range table {
		if !seen[path] {
			t.Errorf("docs/repository.md gives a floor for %s, which no floor module requires", path)
		}
	}
}

// TestServiceAtTheFloorsKeepsThem makes a throwaway write service pinned at
// the floors of grpc and protobuf, then adds an import of every
// write-service package and tidies: no module of the service's go.mod may
// move. (mcpguard brings the MCP SDK, whose own requirements are newer.)
func TestServiceAtTheFloorsKeepsThem(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Go module proxy or a warm module cache")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	floors := docFloors(t, filepath.Join(root, "docs", "repository.md"))
	grpc, protobuf := floors["google.golang.org/grpc"], floors["google.golang.org/protobuf"]
	if grpc == "" || protobuf == "" {
		t.Fatalf("docs/repository.md gives no floor for grpc or protobuf: %v", floors)
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "go.mod"), "module example.com/writeservice\n\ngo 1.26.0\n\n"+
		"require (\n\tgoogle.golang.org/grpc "+grpc+"\n\tgoogle.golang.org/protobuf "+protobuf+"\n)\n\n"+
		"replace github.com/idemledger/idemledger => "+root+"\n")
	own := "\t_ \"google.golang.org/grpc\"\n\t_ \"google.golang.org/protobuf/proto\"\n"
	write(t, filepath.Join(dir, "main.go"), "package main\n\nimport (\n"+own+")\n\nfunc main() {}\n")
	gocmd(t, dir, "mod", "tidy")
	before := requirements(t, dir)
	if before["google.golang.org/grpc"] != grpc {
		t.Fatalf("the service starts at grpc %s, not %s", before["google.golang.org/grpc"], grpc)
	}

	imports := own
	for _, p := range writeServicePackages {
		imports += "\t_ \"" + p + "\"\n"
	}
	write(t, filepath.Join(dir, "main.go"), "package main\n\nimport (\n"+imports+")\n\nfunc main() {}\n")
	gocmd(t, dir, "get", "github.com/idemledger/idemledger@v0.0.0-00010101000000-000000000000")
	gocmd(t, dir, "mod", "tidy")
	gocmd(t, dir, "build", "./...")
	for path, version := range requirements(t, dir) {
		if was, ok := before[path]; ok && was != version {
			t.Errorf("the service's %s moved from %s to %s", path, was, version)
		}
	}
}

// docFloors reads the floors of docs/repository.md's dependency table: each
// module path of a row whose floor cell is a version, with that version.
func docFloors(t *testing.T, readme string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Dependencies and why\n")
	if !ok {
		t.Fatal("docs/repository.md has no Dependencies section")
	}
	floors := map[string]string{}
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[2]), "`v") {
			continue
		}
		version := strings.Trim(strings.TrimSpace(cells[2]), "`")
		modules, _, _ := strings.Cut(cells[1], "(")
		for _, m := range strings.Split(modules, ",") {
			floors[strings.Trim(strings.TrimSpace(m), "`")] = version
		}
	}
	if len(floors) == 0 {
		t.Fatal("docs/repository.md's dependency table gives no floor")
	}
	return floors
}

// directRequirements are the requirements of the module in dir that it
// does not mark indirect, this repository's own modules left out.
func directRequirements(t *testing.T, dir string) map[string]string {
	t.Helper()
	return goMod(t, dir, false)
}

// requirements are every requirement of the module in dir, indirect ones
// included, this repository's own modules left out.
func requirements(t *testing.T, dir string) map[string]string {
	t.Helper()
	return goMod(t, dir, true)
}

func goMod(t *testing.T, dir string, indirect bool) map[string]string {
	t.Helper()
	var mod struct {
		Require []struct {
			Path     string
			Version  string
			Indirect bool
		}
	}
	if err := json.Unmarshal([]byte(gocmd(t, dir, "mod", "edit", "-json")), &mod); err != nil {
		t.Fatal(err)
	}
	reqs := map[string]string{}
	for _, r := range mod.Require {
		if (indirect || !r.Indirect) && !strings.HasPrefix(r.Path, "github.com/idemledger/") {
			reqs[r.Path] = r.Version
		}
	}
	return reqs
}
