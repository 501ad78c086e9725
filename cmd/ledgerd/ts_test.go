package main_test

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemledger/idemledger/internal/nodetest"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestTypeScriptClient runs the TypeScript package's tests
// (sdk/typescript, with Node's test runner: its ledger client over the
// Connect protocol and over gRPC, and its MCP guard inside a TypeScript
// SDK server driven by the SDK's client; its fence with node-postgres on a
// PostgreSQL database of the test's own) against this ledgerd, with a
// bearer token, and the ledger client over TLS against a second ledgerd
// that serves it (an https baseUrl; Node trusts the test's CA through
// NODE_EXTRA_CA_CERTS). Without node or the npm packages (make npm) it
// skips, except under CI=true.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	node, dir := nodetest.Node(t, "../../sdk/typescript", "@connectrpc/connect-node")
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ts-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	tlsDir := t.TempDir()
	ca := servertest.NewCA(t)
	certFile, keyFile := servertest.WriteFiles(t, tlsDir, "server", ca.Issue(t, servertest.Leaf{CommonName: "ledgerd", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true}))
	caFile := filepath.Join(tlsDir, "ca.crt")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	secure := start(t, "--data-dir", t.TempDir(), "--tokens", tokens, "--tls-cert", certFile, "--tls-key", keyFile, "--health-listen", "127.0.0.1:0")
	probe, err := grpc.NewClient(secure.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	secure.waitServing(t, probe)
	tests, err := filepath.Glob(filepath.Join(dir, "test", "*.test.ts"))
	if err != nil || len(tests) == 0 {
		t.Fatalf("no tests in %s: %v", dir, err)
	}
	cmd := exec.CommandContext(t.Context(), node, append([]string{"--import", "tsx", "--test", "--test-concurrency=4"}, tests...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LEDGER_HTTP=http://"+p.http, "LEDGER_GRPC=http://"+p.grpc, "LEDGER_ADMIN=http://"+p.admin, "LEDGER_TOKEN=ts-secret",
		"LEDGER_HTTPS=https://"+secure.http, "LEDGER_GRPCS=https://"+secure.grpc, "NODE_EXTRA_CA_CERTS="+caFile,
		"FENCE_DATABASE_URL="+pgtest.NewDatabase(t)) // the fence's tests, with node-postgres
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the TypeScript tests failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestTypeScriptPackage packs the TypeScript package as a user does, with
// npm pack on a checkout that has no dist/ (its prepack builds it), checks
// that the tarball holds the build, its README and LICENSE, installs it
// into a fresh project beside the official MCP SDK's v2 packages alone,
// and checks that the v1 SDK was not pulled in. Then it runs the invoice
// server of examples/invoice-ts there against this ledgerd, driven by its
// client on the v2 SDK: the first call writes, its retry is the replay, a
// changed argument under the key is KEY_REUSED, a call without a key
// KEY_MISSING, and one without an account VALIDATION_FAILED.
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
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(node)+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return out
	}
	packed := t.TempDir()
	run(cleanCopy(t, dir), npm, "pack", "--pack-destination", packed, "--silent")
	tarballs, err := filepath.Glob(filepath.Join(packed, "idemledger-guard-*.tgz"))
	if err != nil || len(tarballs) != 1 {
		t.Fatalf("npm pack made %v (%v)", tarballs, err)
	}
	listing := string(run(packed, "tar", "-tzf", tarballs[0]))
	for _, f := range []string{"package/dist/index.js", "package/dist/index.d.ts", "package/README.md", "package/LICENSE",
		"package/migrations/postgres/0001_idemledger_fences.up.sql", "package/migrations/cockroach/0001_idemledger_fences.up.sql"} {
		if !strings.Contains(listing, f+"\n") {
			t.Errorf("the tarball lacks %s:\n%s", f, listing)
		}
	}
	project := t.TempDir()
	if err := os.WriteFile(filepath.Join(project, "package.json"), []byte(`{"name":"fresh","private":true,"type":"module"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// --prefer-offline: the packages are in npm's cache from make npm.
	run(project, npm, "install", "--prefer-offline", "--no-audit", "--no-fund", tarballs[0],
		"@modelcontextprotocol/server@2.4.0", "@modelcontextprotocol/node@2.1.2", "@modelcontextprotocol/client@2.4.0", "zod@4.6.7")
	if _, err := os.Stat(filepath.Join(project, "node_modules", "@modelcontextprotocol", "sdk")); err == nil {
		t.Error("installing the package beside the v2 SDK pulled in the v1 SDK (@modelcontextprotocol/sdk)")
	}
	for _, f := range []string{"server.mjs", "client.mjs"} {
		b, err := os.ReadFile(filepath.Join("../../examples/invoice-ts", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(project, f), b, 0o600); err != nil {
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
	if code("changed") != "KEY_REUSED" || code("noKey") != "KEY_MISSING" || code("noAccount") != "VALIDATION_FAILED" {
		t.Fatalf("a changed argument: %v, no key: %v, no account: %v", code("changed"), code("noKey"), code("noAccount"))
	}
}

// cleanCopy is the package's files as git tracks them (a fresh clone's:
// no dist/), in a folder of its own beside the package, with the
// package's node_modules (its build tools) linked in.
func cleanCopy(t *testing.T, dir string) string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "git", "-C", dir, "ls-files").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	copyDir := t.TempDir()
	for f := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(copyDir, f)), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(copyDir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(dir, "node_modules"), filepath.Join(copyDir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	return copyDir
}

// everythingServer starts script of examples/mcp-ts (everything.mjs, on
// the TypeScript SDK's v1, or everything-v2.mjs, on its v2) with env and
// returns its endpoint.
func everythingServer(t *testing.T, node, script string, env ...string) string {
	t.Helper()
	_, dir := nodetest.Node(t, "../../examples/mcp-ts", "@modelcontextprotocol/sdk")
	cmd := exec.Command(node, filepath.Join(dir, script))
	cmd.Env = append(os.Environ(), env...)
	return nodetest.Listen(t, cmd) + "/mcp"
}

// TestTypeScriptGuardConformance runs the official MCP conformance suite
// against the TypeScript SDK servers of examples/mcp-ts, without the guard
// and with their tools that take arguments under @idemledger/guard at this
// ledgerd: 0.1.16 against everything.mjs (v1), 0.2.0 against
// everything-v2.mjs (v2, 2026-07-28 beside the 2025 revisions). Each run
// passes the same scenarios with the same counts of checks under the guard
// as without it; without it, every scenario passes but the tasks
// extension's, which v2 does not have.
func TestTypeScriptGuardConformance(t *testing.T) {
	t.Parallel() // its own processes, ports and directories
	node, guard := nodetest.Guard(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ts-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	for _, c := range []struct {
		script string
		suite  nodetest.Suite
	}{{"everything.mjs", nodetest.Suite2025}, {"everything-v2.mjs", nodetest.Suite2026}} {
		t.Run(c.script, func(t *testing.T) {
			plain := nodetest.Conformance(t, c.suite, everythingServer(t, node, c.script))
			guarded := nodetest.Conformance(t, c.suite, everythingServer(t, node, c.script, "IDEMLEDGER_GUARD="+guard,
				"LEDGER_URL=http://"+p.http, "LEDGER_TOKEN=ts-secret"))
			for name, want := range plain {
				if want.Failed > 0 && !strings.HasPrefix(name, "tasks-") {
					t.Errorf("without the guard, %s failed %d checks", name, want.Failed)
				}
			}
			nodetest.SameConformance(t, plain, guarded, "under the guard")
		})
	}
}
