package nodetest

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Suite is a version of the official MCP conformance suite
// (@modelcontextprotocol/conformance), installed in examples/mcp-ts: the
// package folder under node_modules, and how many server scenarios its
// summary lists.
type Suite struct {
	Package   string
	Scenarios int
}

// The suites the tests run: 0.1.16, of the 2025 revisions, and
// 0.2.0-alpha.12, which adds 2026-07-28's scenarios (stateless requests,
// server/discover, the headers bound to the body, input_required rounds,
// the tasks extension) and runs every scenario at the newest revision it
// applies to.
var (
	Suite2025 = Suite{Package: "conformance-0.1", Scenarios: 32}
	Suite2026 = Suite{Package: "@modelcontextprotocol/conformance", Scenarios: 65}
)

// Scenario is one scenario's line of the conformance suite's summary: its
// checks passed and failed.
type Scenario struct{ Passed, Failed int }

var summaryLine = regexp.MustCompile(`(?m)^([✓✗]) (\S+): (\d+) passed, (\d+) failed`)

// Conformance runs the server scenarios of suite against the Streamable
// HTTP endpoint url, and returns them by name. It skips as Node does.
func Conformance(t testing.TB, suite Suite, url string) map[string]Scenario {
	t.Helper()
	node, dir := Node(t, mcpTS(), suite.Package)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	script := filepath.Join(dir, "node_modules", filepath.FromSlash(suite.Package), "dist", "index.js")
	cmd := exec.CommandContext(ctx, node, script, "server", "--url", url, "--suite", "all") //nolint:gosec // the test's own
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(node)+string(os.PathListSeparator)+os.Getenv("PATH"))
	out, _ := cmd.CombinedOutput() // it exits 1 when a scenario fails: the summary says which
	got := map[string]Scenario{}
	for _, m := range summaryLine.FindAllSubmatch(out, -1) {
		p, _ := strconv.Atoi(string(m[3]))
		f, _ := strconv.Atoi(string(m[4]))
		got[string(m[2])] = Scenario{Passed: p, Failed: f}
	}
	if len(got) != suite.Scenarios {
		t.Fatalf("the conformance suite %s summed up %d scenarios, want %d:\n%s", suite.Package, len(got), suite.Scenarios, out)
	}
	return got
}

// SameConformance fails t unless got has the scenarios of want with the
// same counts of checks; how says how got was run ("through the proxy").
func SameConformance(t testing.TB, want, got map[string]Scenario, how string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s the suite ran %d scenarios, without %d", how, len(got), len(want))
	}
	for name, w := range want {
		if g := got[name]; g != w {
			t.Errorf("%s: %d passed, %d failed %s; %d passed, %d failed without", name, g.Passed, g.Failed, how, w.Passed, w.Failed)
		}
	}
}

// mcpTS is examples/mcp-ts, from this file.
func mcpTS() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "examples", "mcp-ts")
}

// Guard builds the TypeScript package (sdk/typescript, with its pinned
// tsc) into a folder of its own under sdk/typescript/.build, removed when
// the test ends, and returns Node and the path of the build's index.js.
// The folder is inside the package so that its imports resolve to the
// package's node_modules; its own folder keeps parallel builds apart. It
// skips as Node does.
func Guard(t testing.TB) (node, index string) {
	t.Helper()
	node, dir := Node(t, filepath.Join(mcpTS(), "..", "..", "sdk", "typescript"), "typescript")
	if err := os.MkdirAll(filepath.Join(dir, ".build"), 0o750); err != nil {
		t.Fatal(err)
	}
	out, err := os.MkdirTemp(filepath.Join(dir, ".build"), "test-") //nolint:usetesting // inside the package, for its node_modules: t.TempDir is not
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(out) })
	cmd := exec.Command(node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json", "--outDir", out) //nolint:gosec // the test's own
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, b)
	}
	return node, filepath.Join(out, "index.js")
}

// Listen starts cmd, a server that prints "listening <port>" on its
// standard output once it serves on 127.0.0.1, and returns its base URL,
// "http://127.0.0.1:<port>". The server is killed when the test ends.
func Listen(t testing.TB, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	port, ok := strings.CutPrefix(strings.TrimSpace(line), "listening ")
	if err != nil || !ok {
		t.Fatalf("%s said %q, %v", strings.Join(cmd.Args, " "), line, err)
	}
	return "http://127.0.0.1:" + port
}
