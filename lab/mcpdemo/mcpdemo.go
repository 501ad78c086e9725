// Package mcpdemo drives the example MCP invoice tool server
// (examples/mcpinvoice, a child process) with an agent on mcpguard's
// client middleware, through the faults agents meet: responses lost after
// the call ran, 429s from a gateway, streams dropped mid-answer and
// re-issued with a new JSON-RPC id, parallel duplicates of one intent,
// and crashes (SIGKILL) of the tool server mid-call, before and after its
// write. The tool server's table has no unique constraint on the key;
// the report counts its invoices against the intents.
package mcpdemo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/examples/mcpinvoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
)

// Fault kinds, as the report counts them.
const (
	FaultLost        = "lost_response"
	Fault429         = "gateway_429"
	FaultDropped     = "stream_dropped"
	FaultFanOut      = "parallel_duplicates"
	FaultCrashBefore = "crash_before_write"
	FaultCrashAfter  = "crash_after_write"
)

// FaultKinds are every kind of fault the demo injects.
var FaultKinds = []string{FaultLost, Fault429, FaultDropped, FaultFanOut, FaultCrashBefore, FaultCrashAfter}

// Config is a run of the demo.
type Config struct {
	Intents int           // intents the agent carries out (60)
	FanOut  int           // parallel sends of every seventh intent (4)
	Lease   time.Duration // create_invoice's lease: how long a crashed call holds its key (1 s)
	// Server returns the command that runs the tool server with args
	// (Serve's flags): the demo binary's serve subcommand, or a test
	// binary.
	Server func(args ...string) *exec.Cmd
	Dir    string    // where the tool server keeps its table
	Log    io.Writer // progress; nil discards
}

// Report is what a run found.
type Report struct {
	Intents    int            `json:"intents"`
	Answered   int            `json:"answered"`   // intents whose answer is their invoice
	Invoices   int            `json:"invoices"`   // rows in the tool server's table
	Duplicates int            `json:"duplicates"` // rows beyond one per intent
	Mismatched int            `json:"mismatched"` // answers that differ from their row, or from each other
	Faults     map[string]int `json:"faults"`
	Restarts   int            `json:"restarts"`
	Seconds    float64        `json:"seconds"`
}

// OK reports whether every intent wrote exactly one invoice and was
// answered with it.
func (r Report) OK() bool {
	return r.Duplicates == 0 && r.Mismatched == 0 && r.Answered == r.Intents && r.Invoices == r.Intents
}

// Run runs the demo.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if cfg.Intents <= 0 {
		cfg.Intents = 60
	}
	if cfg.FanOut <= 0 {
		cfg.FanOut = 4
	}
	if cfg.Lease <= 0 {
		cfg.Lease = time.Second
	}
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			_, _ = fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	start := time.Now()
	rep := Report{Intents: cfg.Intents, Faults: map[string]int{}}

	ledgerAddr, stopLedger, err := startLedger()
	if err != nil {
		return rep, err
	}
	defer stopLedger()
	data := filepath.Join(cfg.Dir, "invoices.jsonl")
	crashLog := filepath.Join(cfg.Dir, "crashes.log")
	addr, err := freeAddr()
	if err != nil {
		return rep, err
	}
	sup := &supervisor{cmd: func() *exec.Cmd {
		return cfg.Server("--ledger", ledgerAddr, "--data", data, "--listen", addr, "--lease", cfg.Lease.String(), "--crash-log", crashLog)
	}, log: logf}
	if err := sup.start(ctx, addr); err != nil {
		return rep, err
	}
	defer sup.stop()

	faults := &faulty{}
	client := mcp.NewClient(&mcp.Implementation{Name: "demo-agent", Version: "v1"}, nil)
	client.AddSendingMiddleware(mcpguard.ClientMiddleware(mcpguard.WithMaxAttempts(40), mcpguard.WithBackoff(20*time.Millisecond, 500*time.Millisecond)))

	answers := make([][]string, cfg.Intents) // the invoice ids each intent was answered with
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range cfg.Intents {
		key := intentKey(i)
		sends := 1
		if i%7 == 3 {
			sends = cfg.FanOut
			rep.Faults[FaultFanOut]++
		}
		answers[i] = make([]string, sends)
		for j := range sends {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				answers[i][j] = callIntent(ctx, client, addr, faults, key, i)
			})
		}
	}
	wg.Wait()
	sup.stop()
	rep.Restarts = int(sup.restarts.Load())
	for kind, n := range faults.counts() {
		rep.Faults[kind] = n
	}
	// The crashes that happened, as the tool server wrote them down just
	// before it killed itself (two intents may share one crash).
	if b, err := os.ReadFile(crashLog); err == nil {
		for _, kind := range strings.Fields(string(b)) {
			rep.Faults[kind]++
		}
	}

	store, err := invoicedb.OpenFile(data)
	if err != nil {
		return rep, err
	}
	defer store.Close()
	all, err := store.Rows(ctx)
	if err != nil {
		return rep, err
	}
	rows := map[string][]string{}
	for _, r := range all {
		rows[r.Key] = append(rows[r.Key], r.Invoice.ID)
		rep.Invoices++
	}
	for i := range cfg.Intents {
		got := rows[intentKey(i)]
		if len(got) > 1 {
			rep.Duplicates += len(got) - 1
			logf("DUPLICATE: intent %d wrote %v", i, got)
		}
		ok := len(got) > 0
		for _, a := range answers[i] {
			ok = ok && a == got[0]
		}
		if ok {
			rep.Answered++
		} else {
			rep.Mismatched++
			logf("intent %d: answered %v, rows %v", i, answers[i], got)
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// intentKey is intent i's key: its name says which crash the tool server
// suffers on the intent's first attempt.
func intentKey(i int) string {
	switch i % 10 {
	case 2:
		return fmt.Sprintf("intent-%03d-crash-before", i)
	case 6:
		return fmt.Sprintf("intent-%03d-crash-after", i)
	}
	return fmt.Sprintf("intent-%03d", i)
}

// callIntent carries out one send of an intent, on a session of its own,
// and returns the invoice id it was answered with ("" for none).
func callIntent(ctx context.Context, client *mcp.Client, addr string, faults *faulty, key string, i int) string {
	ctx = idemclient.WithKey(ctx, key)
	for range 20 {
		cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
			Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: faults},
			MaxRetries: -1, DisableStandaloneSSE: true, // a dropped stream is re-issued by the agent, not resumed
		}, nil)
		if err != nil {
			time.Sleep(100 * time.Millisecond) // the tool server is restarting
			continue
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_invoice", Arguments: map[string]any{
			"customer": fmt.Sprintf("cus_%d", i), "currency": "EUR", "amount_cents": 100 + i,
		}})
		_ = cs.Close()
		if err != nil || res.IsError {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		var out mcpinvoice.InvoiceResult
		b, _ := json.Marshal(res.StructuredContent)
		if json.Unmarshal(b, &out) == nil {
			return out.Invoice.ID
		}
		return ""
	}
	return ""
}

// faulty is the agent's HTTP transport: of the tools/call requests it
// carries, it loses the response of one in ten after the call ran,
// answers 429 for one in ten without delivering it, and cuts the answer
// of one in ten mid-stream.
type faulty struct {
	n                      atomic.Int64
	lost, gateway, dropped atomic.Int64
}

func (f *faulty) counts() map[string]int {
	return map[string]int{FaultLost: int(f.lost.Load()), Fault429: int(f.gateway.Load()), FaultDropped: int(f.dropped.Load())}
}

func (f *faulty) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil {
		return http.DefaultTransport.RoundTrip(req)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, err
	}
	req.Body = io.NopCloser(bytes.NewReader(body))
	if !bytes.Contains(body, []byte(`"tools/call"`)) {
		return http.DefaultTransport.RoundTrip(req)
	}
	switch f.n.Add(1) % 10 {
	case 1:
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, res.Body)
		_ = res.Body.Close()
		f.lost.Add(1)
		return nil, errors.New("the response was lost")
	case 4:
		f.gateway.Add(1)
		return &http.Response{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Retry-After": {"0"}, "Content-Type": {"text/plain"}}, Body: io.NopCloser(strings.NewReader("slow down")), Request: req}, nil
	case 7:
		res, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		f.dropped.Add(1)
		res.Body = &cutBody{r: res.Body, left: 8}
		return res, nil
	}
	return http.DefaultTransport.RoundTrip(req)
}

// cutBody yields a few bytes of an answer, then fails: the stream dropped.
type cutBody struct {
	r    io.ReadCloser
	left int
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.left <= 0 {
		_, _ = io.Copy(io.Discard, c.r)
		return 0, errors.New("the stream was dropped")
	}
	n, err := c.r.Read(p[:min(len(p), c.left)])
	c.left -= n
	return n, err
}

func (c *cutBody) Close() error { return c.r.Close() }

// supervisor runs the tool server and starts it again when it dies.
type supervisor struct {
	cmd      func() *exec.Cmd
	log      func(string, ...any)
	restarts atomic.Int64

	mu      sync.Mutex
	cur     *exec.Cmd
	stopped bool
	done    chan struct{}
}

func (s *supervisor) start(ctx context.Context, addr string) error {
	s.done = make(chan struct{})
	if err := s.spawn(); err != nil {
		return err
	}
	go s.watch()
	return waitListening(ctx, addr)
}

func (s *supervisor) spawn() error {
	cmd := s.cmd()
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cur = cmd
	s.mu.Unlock()
	return nil
}

// watch waits for the tool server and starts it again unless stopping.
func (s *supervisor) watch() {
	defer close(s.done)
	for {
		s.mu.Lock()
		cmd := s.cur
		s.mu.Unlock()
		err := cmd.Wait()
		s.mu.Lock()
		stopped := s.stopped
		s.mu.Unlock()
		if stopped {
			return
		}
		s.restarts.Add(1)
		s.log("tool server died (%v); starting it again", err)
		for s.spawn() != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func (s *supervisor) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	cmd := s.cur
	s.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
}

func waitListening(ctx context.Context, addr string) error {
	for range 200 {
		if c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr); err == nil {
			return c.Close()
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("the tool server did not listen on %s", addr)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startLedger runs a LedgerService on the memory store on loopback, in
// this process: the ledger outlives the tool server's crashes.
func startLedger() (string, func(), error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "demo", Tenants: []string{"*"}}, nil
	})
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: auth}))
	go func() { _ = gs.Serve(lis) }()
	return lis.Addr().String(), gs.Stop, nil
}

// Serve runs the tool server (the child process): the example's tools
// over Streamable HTTP, create_invoice guarded, with the demo's crashes:
// a SIGKILL of itself before the write on the first attempt of an intent
// whose key ends in "-crash-before", after it for "-crash-after".
func Serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	ledgerAddr := fs.String("ledger", "", "ledger address")
	data := fs.String("data", "", "the invoice table's file")
	listen := fs.String("listen", "", "Streamable HTTP address")
	lease := fs.Duration("lease", time.Second, "create_invoice's lease")
	crashLog := fs.String("crash-log", "", "the file each crash is written to before it happens")
	if err := fs.Parse(args); err != nil {
		return err
	}
	conn, err := grpc.NewClient(*ledgerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	store, err := invoicedb.OpenFile(*data)
	if err != nil {
		return err
	}
	defer store.Close()
	var dying sync.Mutex // one crash at a time: a second one waits for the first to kill the process
	crash := func(suffix, kind string) func(context.Context) {
		return func(ctx context.Context) {
			if c, ok := guard.ClaimFromContext(ctx); ok && c.Attempt == 1 && strings.HasSuffix(c.Key, suffix) {
				dying.Lock() // never unlocked: the process dies holding it
				if f, err := os.OpenFile(*crashLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
					_, _ = f.WriteString(kind + "\n")
					_ = f.Sync()
					_ = f.Close()
				}
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal is on its way
			}
		}
	}
	tools := &mcpinvoice.Tools{Store: store, Tenant: mcpguard.Tenant("acme"), Lease: *lease,
		BeforeWrite: crash("-crash-before", FaultCrashBefore), AfterWrite: crash("-crash-after", FaultCrashAfter)}
	gd, err := guard.New(ledgerv1.NewLedgerServiceClient(conn))
	if err != nil {
		return err
	}
	g, err := tools.Guard(gd)
	if err != nil {
		return err
	}
	srv, err := tools.Server(g)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signalContext()
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
}
