package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// BenchmarkToolCall measures tools/call of a tool that writes nothing,
// over Streamable HTTP on loopback, guarded against unguarded on the same
// server, in one run. The kinds of call take turns in blocks of 100
// calls, so that each sees the same machine; the metrics are medians of
// the calls' latencies:
//
//	InProcess: the server has mcpguard's middleware; the guarded tool
//	claims a fresh key and completes it at a LedgerService on the memory
//	store (over loopback gRPC, on a Stream); replayed is the same key
//	again; unguarded is a tool the middleware passes through.
//	Proxy: the same through idemproxy, in front of a server without a
//	guard.
//
// With IDEMPROXY_BENCH_LEDGERD=host:port both call a running ledgerd
// (without credentials, as one in dev mode takes them) instead.
//
// The TypeScript guard and idemproxy in front of TypeScript servers, with
// the official TypeScript client, are measured by sdk/typescript/bench/mcp.mjs.
func BenchmarkToolCall(b *testing.B) {
	addr := benchLedger(b)
	conn, err := grpc.NewClient(addr, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	defer ledger.Close()
	gd, err := guard.New(ledger)
	if err != nil {
		b.Fatal(err)
	}
	g, err := mcpguard.New(gd, mcpguard.WithTenant(mcpguard.Tenant("acme")), mcpguard.WithTool("create_invoice", mcpguard.NewTool(guard.Policy{})))
	if err != nil {
		b.Fatal(err)
	}
	guarded := plainServer()
	guarded.AddReceivingMiddleware(g.Middleware())
	inProcess := httpEndpoint(b, guarded)
	upstream := httpEndpoint(b, plainServer())
	through, _ := proxy(b, config(addr, byURL(upstream), policyConfig{}))

	for _, bm := range []struct{ name, endpoint string }{
		{"InProcess", inProcess}, {"Proxy", through},
	} {
		b.Run(bm.name, func(b *testing.B) {
			cs := connect(b, bm.endpoint, http.DefaultTransport)
			call := func(tool, key string) time.Duration {
				start := time.Now()
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"customer": "c"}, Meta: mcp.Meta{mcpguard.KeyMeta: key}})
				if err != nil || res.IsError {
					b.Fatalf("%s: %v, %v", tool, res, err)
				}
				return time.Since(start)
			}
			run := time.Now().UnixNano() // keys of their own for each run of the benchmark
			var plain, fresh, replay []time.Duration
			for i := 0; b.Loop(); i++ {
				key := fmt.Sprintf("%s-%d-%d", bm.name, run, i)
				switch i / 100 % 3 {
				case 0:
					plain = append(plain, call("echo", key))
				case 1:
					fresh = append(fresh, call("create_invoice", key))
				default:
					replay = append(replay, call("create_invoice", fmt.Sprintf("%s-%d-%d", bm.name, run, i-100)))
				}
			}
			if len(replay) == 0 {
				return // too few iterations for every kind
			}
			p, f, r := median(plain), median(fresh), median(replay)
			b.ReportMetric(float64(p.Microseconds()), "µs/unguarded")
			b.ReportMetric(float64(f.Microseconds()), "µs/guarded")
			b.ReportMetric(float64(r.Microseconds()), "µs/replayed")
			b.ReportMetric(float64((f - p).Microseconds()), "µs-added")
		})
	}
}

// benchLedger is the ledger a benchmark calls: the running ledgerd at
// IDEMPROXY_BENCH_LEDGERD, or a LedgerService on the memory store in the
// benchmark's process.
func benchLedger(b *testing.B) string {
	if addr := os.Getenv("IDEMPROXY_BENCH_LEDGERD"); addr != "" {
		return addr
	}
	return ledgerAddr(b)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// plainServer has create_invoice and echo, both answering at once.
func plainServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "v1"}, nil)
	type args struct {
		Customer string `json:"customer"`
	}
	handler := func(_ context.Context, _ *mcp.CallToolRequest, a args) (*mcp.CallToolResult, map[string]any, error) {
		return nil, map[string]any{"id": "inv_1", "customer": a.Customer}, nil
	}
	mcp.AddTool(s, &mcp.Tool{Name: "create_invoice"}, handler)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, handler)
	return s
}

func httpEndpoint(b *testing.B, s *mcp.Server) string {
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil))
	b.Cleanup(srv.Close)
	return srv.URL
}

// BenchmarkStdioHost measures tools/call as a host on stdio makes it: the
// Go SDK's client running a stdio server (goUpstream) itself, against the
// same client running `idemproxy --stdio` in front of that server; in
// turns of 100 calls, medians of the calls' latencies: the server
// directly, a tool the proxy passes through, and a guarded one with a
// fresh key (its ledger a LedgerService on the memory store, over
// loopback gRPC).
func BenchmarkStdioHost(b *testing.B) {
	b.Setenv("IDEMPROXY_TEST_STDIO_UPSTREAM", "1")
	server := []string{"env", "-u", "IDEMPROXY_TEST_AS_MAIN", os.Args[0], "-test.run=^$"}
	file := stdioConfigFile(b, config(benchLedger(b), byCommand(server...), policyConfig{}))
	start := func(argv []string, env ...string) *mcp.ClientSession {
		cmd := exec.Command(argv[0], argv[1:]...) //nolint:gosec // the benchmark's own binary
		cmd.Env = append(os.Environ(), env...)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "host", Version: "v1"}, nil).Connect(b.Context(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	direct := start(server)
	through := start([]string{os.Args[0], "--config", file, "--stdio", "--log-level", "warn"}, "IDEMPROXY_TEST_AS_MAIN=1")
	call := func(cs *mcp.ClientSession, tool, key string) time.Duration {
		t0 := time.Now()
		res, err := cs.CallTool(b.Context(), &mcp.CallToolParams{Name: tool,
			Arguments: map[string]any{"customer": "c", "currency": "EUR", "amount_cents": 1}, Meta: mcp.Meta{mcpguard.KeyMeta: key}})
		if err != nil || res.IsError {
			b.Fatalf("%s: %v, %v", tool, res, err)
		}
		return time.Since(t0)
	}
	run := time.Now().UnixNano()
	var plain, passed, guarded []time.Duration
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("stdio-%d-%d", run, i)
		switch i / 100 % 3 {
		case 0:
			plain = append(plain, call(direct, "echo", key))
		case 1:
			passed = append(passed, call(through, "echo", key))
		default:
			guarded = append(guarded, call(through, "create_invoice", key))
		}
	}
	if len(guarded) == 0 {
		return // too few iterations for every kind
	}
	b.ReportMetric(float64(median(plain).Microseconds()), "µs/direct")
	b.ReportMetric(float64(median(passed).Microseconds()), "µs/passed")
	b.ReportMetric(float64(median(guarded).Microseconds()), "µs/guarded")
}
