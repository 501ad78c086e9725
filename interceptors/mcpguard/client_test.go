package mcpguard_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// faulty is an HTTP transport that counts the tools/call requests it
// carries and lets fault decide the fate of each: "" passes it through,
// "lose" delivers it and loses the response, "429" answers Too Many
// Requests without delivering it, "reset" fails before delivering it.
type faulty struct {
	calls atomic.Int64
	fault func(n int64) string
}

func (f *faulty) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Method != http.MethodPost {
		return http.DefaultTransport.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if !strings.Contains(string(body), `"tools/call"`) {
		return http.DefaultTransport.RoundTrip(req)
	}
	switch f.fault(f.calls.Add(1)) {
	case "lose":
		res, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
		}
		return nil, errors.New("connection reset by peer (the response was lost)")
	case "429":
		return &http.Response{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Header: http.Header{"Retry-After": {"0"}},
			Body: io.NopCloser(strings.NewReader("slow down")), Request: req}, nil
	case "reset":
		return nil, errors.New("connection reset by peer")
	}
	return http.DefaultTransport.RoundTrip(req)
}

var fastRetries = mcpguard.ClientMiddleware(mcpguard.WithBackoff(time.Millisecond, 10*time.Millisecond))

func TestClientRetriesWithTheSameKey(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"lose", "429", "reset"} {
		t.Run(fault, func(t *testing.T) {
			ts := &tools{}
			rt := &faulty{fault: func(n int64) string {
				if n == 1 {
					return fault
				}
				return ""
			}}
			cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerClient(t))), rt, fastRetries)
			res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c", "amount_cents": 1}})
			if err != nil || res.IsError {
				t.Fatalf("%v, %v", res, err)
			}
			if rt.calls.Load() != 2 || ts.runs.Load() != 1 {
				t.Fatalf("%d sends, %d runs; want 2 sends and 1 run", rt.calls.Load(), ts.runs.Load())
			}
			// A lost response's retry is a replay: the call had run.
			if (fault == "lose") != replayed(res) {
				t.Fatalf("replayed = %v after %q", replayed(res), fault)
			}
		})
	}
}

func TestClientRetriesInProgressAfterTheHint(t *testing.T) {
	t.Parallel()
	running, proceed := make(chan struct{}), make(chan struct{})
	ts := &tools{before: func(_ context.Context, n int64) (*mcp.CallToolResult, error) {
		if n == 1 {
			close(running)
			<-proceed
		}
		return nil, nil
	}}
	g := newGuard(t, ledgerClient(t), mcpguard.WithTool("create_invoice", mcpguard.NewTool(guard.Policy{OnInProgress: guard.Reject})))
	rt := &faulty{fault: func(int64) string { return "" }}
	cs := serveHTTP(t, ts.newServer(g), rt, fastRetries)
	ctx := idemclient.WithKey(t.Context(), "one-intent")
	var wg sync.WaitGroup
	results := make([]*mcp.CallToolResult, 2)
	call := func(i int) {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c", "amount_cents": 1}})
		if err != nil {
			t.Error(err)
		}
		results[i] = res
	}
	wg.Go(func() { call(0) })
	<-running // the second call finds the first running
	wg.Go(func() { call(1) })
	// The first call's write goes on once the duplicate, refused
	// IN_PROGRESS, is sent again after the hint.
	ledgertest.Eventually(t, 10*time.Second, func() bool { return rt.calls.Load() >= 3 }, "the duplicate is retried")
	close(proceed)
	wg.Wait()
	if results[0].IsError || results[1].IsError || withoutReplayed(t, results[0]) != withoutReplayed(t, results[1]) {
		t.Fatalf("answers %s and %s", withoutReplayed(t, results[0]), withoutReplayed(t, results[1]))
	}
	if ts.runs.Load() != 1 || rt.calls.Load() < 3 {
		t.Fatalf("%d runs, %d sends; want 1 run and the duplicate retried", ts.runs.Load(), rt.calls.Load())
	}
}

func TestClientDoesNotRetryWhatIsNotRetryable(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	rt := &faulty{fault: func(int64) string { return "" }}
	cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerClient(t))), rt, fastRetries)
	ctx := idemclient.WithKey(t.Context(), "k")
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c", "amount_cents": 1}}); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c", "amount_cents": 2}})
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, res, errcode.KeyReused)
	if rt.calls.Load() != 2 {
		t.Fatalf("%d sends; KEY_REUSED was retried", rt.calls.Load())
	}
	// Each CallTool without a key in the context is an intent of its own.
	for range 2 {
		if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{"customer": "c", "amount_cents": 1}}); err != nil {
			t.Fatal(err)
		}
	}
	if ts.runs.Load() != 3 {
		t.Fatalf("%d runs, want 3", ts.runs.Load())
	}
}

func TestClientRetriesAreBounded(t *testing.T) {
	t.Parallel()
	ts := &tools{}
	rt := &faulty{fault: func(int64) string { return "reset" }}
	cs := serveHTTP(t, ts.newServer(newGuard(t, ledgerClient(t))), rt,
		mcpguard.ClientMiddleware(mcpguard.WithMaxAttempts(3), mcpguard.WithBackoff(time.Millisecond, 5*time.Millisecond)))
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{}}); err == nil {
		t.Fatal("no error through a transport that always fails")
	}
	if rt.calls.Load() != 3 {
		t.Fatalf("%d sends, want 3", rt.calls.Load())
	}
	// A deadline shorter than the server's hint ends the retries at once:
	// the ledger is down, and UNAVAILABLE says to come back in a second.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	_ = lis.Close()
	conn, err := grpc.NewClient(down, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	counting := &faulty{fault: func(int64) string { return "" }}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	hinted := serveHTTP(t, ts.newServer(newGuard(t, ledgerv1.NewLedgerServiceClient(conn))), counting, mcpguard.ClientMiddleware())
	res, err := hinted.CallTool(ctx, &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{}, Meta: mcp.Meta{mcpguard.KeyMeta: "k"}})
	if err != nil || !res.IsError || counting.calls.Load() != 1 {
		t.Fatalf("%v, %v after %d sends; want the UNAVAILABLE result of one send", res, err, counting.calls.Load())
	}
}
