package mcpguard_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/server/servertest"
)

const stdioEnv = "MCPGUARD_TEST_STDIO_SERVER"

// serveStdio runs, in a child process of the test binary, the tool server
// over stdio with a ledger of its own, and reports whether it did.
func serveStdio() bool {
	if os.Getenv(stdioEnv) == "" {
		return false
	}
	os.Exit(runStdio())
	return true
}

// runStdio serves until stdin closes and returns the exit code.
func runStdio() int {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, servertest.MemoryLedger("tools"))
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 2
	}
	defer conn.Close()
	gd, err := guard.New(ledgerv1.NewLedgerServiceClient(conn))
	if err != nil {
		return 2
	}
	g, err := mcpguard.New(gd, mcpguard.WithTenant(mcpguard.Tenant("acme")),
		mcpguard.WithTool("create_invoice", mcpguard.NewTool(guard.Policy{})))
	if err != nil {
		return 2
	}
	ts := &tools{}
	if err := ts.newServer(g).Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		return 1
	}
	return 0
}

// TestStdio: the guard over MCP's stdio transport, with the server a
// child process.
func TestStdio(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stdioEnv+"=1")
	cs := connect(t, &mcp.CommandTransport{Command: cmd})
	args := map[string]any{"customer": "cus_1", "amount_cents": 4200}
	first := call(t, cs, "k-1", args)
	again := call(t, cs, "k-1", args)
	if first.IsError || !replayed(again) || withoutReplayed(t, first) != withoutReplayed(t, again) {
		t.Fatalf("stdio: %s then %s", withoutReplayed(t, first), withoutReplayed(t, again))
	}
	other := call(t, cs, "k-2", args)
	var out struct {
		Number int64 `json:"number"`
	}
	if err := unmarshalStructured(other, &out); err != nil || out.Number != 2 {
		t.Fatalf("a second intent: %+v, %v; want invoice 2 (the tool ran once per intent)", out, err)
	}
}
