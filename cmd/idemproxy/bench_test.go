package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
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
// The TypeScript guard and idemproxy in front of TypeScript servers, with
// the official TypeScript client, are measured by sdk/typescript/bench/mcp.mjs.
func BenchmarkToolCall(b *testing.B) {
	addr := ledgerAddr(b)
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
