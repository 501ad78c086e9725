package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idemledger/idemledger/server"
)

// TestTypeScriptClient runs the TypeScript client's tests
// (examples/ledger-ts, with Node's test runner) against this ledgerd, over
// the Connect protocol and over gRPC, with a bearer token. Without node or
// the npm packages (make npm) it skips, except under CI=true.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	dir, err := filepath.Abs("../../examples/ledger-ts")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "@connectrpc", "connect-node"))
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("node and examples/ledger-ts/node_modules are needed (make npm): %v", err)
		}
		t.Skipf("no node or no npm packages (make npm): %v", err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ts-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	cmd := exec.CommandContext(t.Context(), node, "--import", "tsx", "--test", "test/ledger.test.ts")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LEDGER_HTTP=http://"+p.http, "LEDGER_GRPC=http://"+p.grpc, "LEDGER_TOKEN=ts-secret")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the TypeScript tests failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
