package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idemledger/idemledger/internal/nodetest"
	"github.com/idemledger/idemledger/server"
)

// TestTypeScriptClient runs the TypeScript client's tests
// (examples/ledger-ts, with Node's test runner) against this ledgerd, over
// the Connect protocol and over gRPC, with a bearer token. Without node or
// the npm packages (make npm) it skips, except under CI=true.
func TestTypeScriptClient(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	node, dir := nodetest.Node(t, "../../examples/ledger-ts", "@connectrpc/connect-node")
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
