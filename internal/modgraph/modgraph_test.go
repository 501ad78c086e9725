// Package modgraph holds the test that keeps the write services' module
// graph slim: a service that imports the packages made for it must not
// inherit the daemon's, the stores' or the lab's dependencies.
package modgraph

import (
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
