package main_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idemledger/idemledger/internal/nodetest"
	"github.com/idemledger/idemledger/server"
)

// TestTypeScriptClient runs the TypeScript package's tests
// (sdk/typescript, with Node's test runner: its ledger client over the
// Connect protocol and over gRPC, and its MCP guard inside a TypeScript
// SDK server driven by the SDK's client) against this ledgerd, with a
// bearer token. Without node or
// the npm packages (make npm) it skips, except under CI=true.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	node, dir := nodetest.Node(t, "../../sdk/typescript", "@connectrpc/connect-node")
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ts-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	tests, err := filepath.Glob(filepath.Join(dir, "test", "*.test.ts"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests in %s: %v", dir, err)
	}
	cmd := exec.CommandContext(t.Context(), node, append([]string{"--import", "tsx", "--test"}, tests...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LEDGER_HTTP=http://"+p.http, "LEDGER_GRPC=http://"+p.grpc, "LEDGER_TOKEN=ts-secret")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the TypeScript tests failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestTypeScriptPackage builds the TypeScript package (tsc), packs it
// (npm pack), installs the tarball into a fresh project with the
// official MCP SDK, and runs the invoice server of examples/invoice-ts
// there against this ledgerd, driven by the SDK's client
// (examples/mcp-ts/client.mjs): the first call writes, its retry is the
// replay, a changed argument under the key is KEY_REUSED, and a call
// without a key is KEY_MISSING.
func TestTypeScriptPackage(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	node, dir := nodetest.Node(t, "../../sdk/typescript", "typescript")
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("npm: %v", err)
	}
	run := func(dir string, name string, args ...string) []byte {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return out
	}
	build(t, node, dir)
	packed := t.TempDir()
	run(dir, npm, "pack", "--pack-destination", packed, "--silent")
	tarballs, err := filepath.Glob(filepath.Join(packed, "idemledger-guard-*.tgz"))
	if err != nil || len(tarballs) != 1 {
		t.Fatalf("npm pack made %v (%v)", tarballs, err)
	}
	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name":"fresh","private":true,"type":"module"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// --prefer-offline: the packages are in npm's cache from make npm.
	run(project, npm, "install", "--prefer-offline", "--no-audit", "--no-fund", tarballs[0], "@modelcontextprotocol/sdk@1.32.2", "zod@4.6.7")
	for src, dst := range map[string]string{"../../examples/invoice-ts/server.mjs": "server.mjs", "../../examples/mcp-ts/client.mjs": "client.mjs"} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(project, dst), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ts-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	srv := exec.Command(node, "server.mjs")
	srv.Dir = project
	srv.Env = append(os.Environ(), "LEDGER_URL=http://"+p.http, "LEDGER_TOKEN=ts-secret")
	base := nodetest.Listen(t, srv)
	var out map[string]struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		Meta map[string]any `json:"_meta"`
	}
	if err := json.Unmarshal(run(project, node, "client.mjs", base+"/mcp"), &out); err != nil {
		t.Fatal(err)
	}
	first, retry := out["first"], out["retry"]
	if first.IsError || len(first.Content) != 1 || retry.Meta["io.idemledger/replayed"] != true || retry.Content[0].Text != first.Content[0].Text {
		t.Fatalf("through the installed package: first %+v, retry %+v", first, retry)
	}
	code := func(r string) any { e, _ := out[r].Meta["io.idemledger/error"].(map[string]any); return e["code"] }
	if code("changed") != "KEY_REUSED" || code("noKey") != "KEY_MISSING" {
		t.Fatalf("a changed argument: %v, no key: %v", code("changed"), code("noKey"))
	}
}

// build compiles the TypeScript package into its dist/, for npm pack.
func build(t *testing.T, node, dir string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), node, filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("tsc: %v\n%s", err, out)
	}
}

// everythingServer starts examples/mcp-ts/everything.mjs with env and
// returns its endpoint.
func everythingServer(t *testing.T, node string, env ...string) string {
	t.Helper()
	_, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/sdk")
	cmd := exec.Command(node, filepath.Join(dir, "everything.mjs"))
	cmd.Env = append(os.Environ(), env...)
	return nodetest.Listen(t, cmd) + "/mcp"
}

// TestTypeScriptGuardConformance runs the official MCP conformance suite
// against the TypeScript SDK server of examples/mcp-ts/everything.mjs,
// without the guard and with its tools that take arguments under
// @idemledger/guard at this ledgerd: the same 32 scenarios pass, with the
// same counts of checks.
func TestTypeScriptGuardConformance(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	node, guard := nodetest.Guard(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ts-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	plain := nodetest.Conformance(t, nodetest.Suite2025, everythingServer(t, node))
	guarded := nodetest.Conformance(t, nodetest.Suite2025, everythingServer(t, node, "IDEMLEDGER_GUARD="+guard,
		"LEDGER_URL=http://"+p.http, "LEDGER_TOKEN=ts-secret"))
	for name, want := range plain {
		if want.Failed > 0 {
			t.Errorf("without the guard, %s failed %d checks", name, want.Failed)
		}
	}
	nodetest.SameConformance(t, plain, guarded, "under the guard")
}
