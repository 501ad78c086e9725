package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/pebble"
	"github.com/idemledger/idemledger/server"
)

// DemoConfig configures Demo. The zero value works.
type DemoConfig struct {
	Intents int    // invoices the agent means to create: 200
	Agents  int    // intents in flight at once: 8
	Seed    uint64 // of the faults; 0 picks one
	// LedgerAddr is a ledgerd to use (dev mode, plaintext); empty starts a
	// ledger in process, on loopback, on the embedded store in a temporary
	// directory.
	LedgerAddr string
	// Lease of a claim: 300 ms, so that crashed attempts are taken over
	// quickly.
	Lease time.Duration
	// Fault rates, each a probability per attempt: 0.1 by default.
	LostResponse, RateLimited, TimeoutAfterCommit, ParallelDuplicates, Crash float64
	// Unfenced turns off the store's token fence (see Store.Unfenced), to
	// show the duplicates a crash between the write and Complete makes
	// without it.
	Unfenced bool
	// Log hears of the interceptor's warnings; nil discards.
	Log *slog.Logger
}

// DemoReport is what Demo saw.
type DemoReport struct {
	Intents    int   // intents the agent formed
	Answered   int   // intents that ended with an invoice
	Invoices   int   // rows in the service's store
	Duplicates int   // rows beyond one per intent: must be 0
	Mismatched int   // intents whose answers named different invoices: must be 0
	Calls      int64 // CreateInvoice calls the agent made (retries included)
	Replays    int64 // answers marked idempotency-replayed
	Takeovers  int64 // handler runs on a taken-over claim (attempt > 1)
	// Faults injected.
	LostResponses, RateLimited, TimeoutsAfterCommit, ParallelDuplicates, CrashesBeforeWrite, CrashesAfterWrite int64
}

// Print writes the report as the README shows it.
func (r DemoReport) Print(w io.Writer) {
	fmt.Fprintf(w, "intents            %d\n", r.Intents)
	fmt.Fprintf(w, "answered           %d\n", r.Answered)
	fmt.Fprintf(w, "invoices written   %d\n", r.Invoices)
	fmt.Fprintf(w, "duplicates         %d\n", r.Duplicates)
	fmt.Fprintf(w, "mismatched answers %d\n", r.Mismatched)
	fmt.Fprintf(w, "calls              %d (replayed %d, taken over %d)\n", r.Calls, r.Replays, r.Takeovers)
	fmt.Fprintf(w, "faults             lost responses %d, 429s %d, 504s after commit %d, parallel duplicates %d, crashes before write %d, after write %d\n",
		r.LostResponses, r.RateLimited, r.TimeoutsAfterCommit, r.ParallelDuplicates, r.CrashesBeforeWrite, r.CrashesAfterWrite)
}

func (c DemoConfig) withDefaults() DemoConfig {
	if c.Intents <= 0 {
		c.Intents = 200
	}
	if c.Agents <= 0 {
		c.Agents = 8
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Lease <= 0 {
		c.Lease = 300 * time.Millisecond
	}
	for _, p := range []*float64{&c.LostResponse, &c.RateLimited, &c.TimeoutAfterCommit, &c.ParallelDuplicates, &c.Crash} {
		if *p == 0 {
			*p = 0.1
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// errCrash is the panic of a crashing handler.
var errCrash = errors.New("chaos: the handler crashed")

// Demo runs the invoice service behind the idempotency interceptor against a
// real ledger, on loopback, and plays an agent against it: every intent is
// one key, retried through idemclient and resumed until it gets its invoice,
// while the service and the network lose responses, answer 429, time out
// after the write committed, and crash mid-handler, and the agent sends
// some intents twice at once. It returns what it counted.
func Demo(ctx context.Context, cfg DemoConfig) (DemoReport, error) {
	cfg = cfg.withDefaults()
	var (
		rep   DemoReport
		mu    sync.Mutex
		rng   = rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
		draws = func(p float64) bool { mu.Lock(); defer mu.Unlock(); return rng.Float64() < p }
	)
	ledgerAddr, stopLedger, err := startLedger(cfg)
	if err != nil {
		return rep, err
	}
	defer stopLedger()
	ledgerConn, err := grpc.NewClient(ledgerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return rep, err
	}
	defer ledgerConn.Close()

	store := invoice.NewStore()
	store.Unfenced = cfg.Unfenced
	svc := &invoice.Service{
		Store: store,
		BeforeWrite: func(ctx context.Context) {
			if c, _ := guard.ClaimFromContext(ctx); c.Attempt > 1 {
				atomic.AddInt64(&rep.Takeovers, 1)
			}
			if draws(cfg.Crash / 2) {
				atomic.AddInt64(&rep.CrashesBeforeWrite, 1)
				panic(errCrash)
			}
		},
		AfterWrite: func(context.Context) {
			if draws(cfg.Crash / 2) {
				atomic.AddInt64(&rep.CrashesAfterWrite, 1)
				panic(errCrash)
			}
		},
	}
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(ledgerConn), guard.WithLogger(cfg.Log))
	if err != nil {
		return rep, err
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod(invoice.CreateInvoiceMethod, grpcguard.Method{Policy: guard.Policy{Lease: cfg.Lease, OnInProgress: guard.Reject}}),
		grpcguard.WithKeyField("request_id"))
	if err != nil {
		return rep, err
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(
		// A crash looks like a lost connection to the agent.
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(func(any) error {
			return status.Error(codes.Unavailable, "connection reset by peer")
		})),
		// The gateway's rate limiter, in front of everything.
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if draws(cfg.RateLimited) {
				atomic.AddInt64(&rep.RateLimited, 1)
				return nil, ledgerstatus.Err(&errcode.Error{Code: errcode.RateLimited, Message: "429: slow down", RetryAfter: 20 * time.Millisecond})
			}
			return next(ctx, req)
		},
		// The gateway gives up (504) after the write committed.
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			res, err := next(ctx, req)
			if err == nil && draws(cfg.TimeoutAfterCommit) {
				atomic.AddInt64(&rep.TimeoutsAfterCommit, 1)
				return nil, status.Error(codes.DeadlineExceeded, "504: upstream timed out")
			}
			return res, err
		},
		icpt,
	))
	invoicev1.RegisterInvoiceServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return rep, err
	}
	go func() { _ = gs.Serve(lis) }()
	// GracefulStop waits for the handlers, whose Complete may still be
	// retrying after their callers gave up, before the ledger stops.
	defer gs.GracefulStop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			idemclient.UnaryClientInterceptor(idemclient.WithKeyField("request_id"), idemclient.WithBackoff(5*time.Millisecond, 200*time.Millisecond)),
			// Inside the retries: count every attempt and replay, and lose
			// some responses on the way back.
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				atomic.AddInt64(&rep.Calls, 1)
				var header metadata.MD
				err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&header))...)
				if v := header.Get(grpcguard.ReplayedHeader); len(v) > 0 && v[0] == "true" {
					atomic.AddInt64(&rep.Replays, 1)
				}
				if err == nil && draws(cfg.LostResponse) {
					atomic.AddInt64(&rep.LostResponses, 1)
					return status.Error(codes.Unavailable, "the response was lost")
				}
				return err
			}))
	if err != nil {
		return rep, err
	}
	defer conn.Close()
	client := invoicev1.NewInvoiceServiceClient(conn)

	answers := make([]map[string]bool, cfg.Intents)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range cfg.Agents {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Intents || ctx.Err() != nil {
					return
				}
				copies := 1
				if draws(cfg.ParallelDuplicates) {
					copies = 3
					atomic.AddInt64(&rep.ParallelDuplicates, 1)
				}
				answers[i] = demoIntent(ctx, client, i, copies)
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return rep, err
	}

	rep.Intents = cfg.Intents
	for _, ids := range answers {
		if len(ids) > 0 {
			rep.Answered++
		}
		if len(ids) > 1 {
			rep.Mismatched++
		}
	}
	rows, _ := store.Rows(ctx) // in memory: no error
	keys := map[string]bool{}
	for _, r := range rows {
		keys[r.Invoice.GetTenant()+"/"+r.Key] = true
	}
	rep.Invoices, rep.Duplicates = len(rows), len(rows)-len(keys)
	return rep, nil
}

// demoIntent is one intent of the agent: one key, sent by copies callers at
// once, each retried by idemclient and resumed (as an agent that timed out
// would) until it gets an invoice. It returns the invoice ids it was told.
func demoIntent(ctx context.Context, client invoicev1.InvoiceServiceClient, i, copies int) map[string]bool {
	ictx := idemclient.WithIntent(ctx)
	req := func() *invoicev1.CreateInvoiceRequest {
		return &invoicev1.CreateInvoiceRequest{
			Tenant: fmt.Sprintf("tenant-%d", i%5), CustomerId: fmt.Sprintf("cus_%d", i), Currency: "EUR",
			LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: int64(1 + i%7), UnitAmountMicros: 12_500_000}},
		}
	}
	var mu sync.Mutex
	ids := map[string]bool{}
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() {
			for resume := 0; resume < 50 && ctx.Err() == nil; resume++ {
				res, err := client.CreateInvoice(ictx, req())
				if err == nil {
					mu.Lock()
					ids[res.GetInvoice().GetId()] = true
					mu.Unlock()
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return ids
}

// startLedger returns the address of the ledger to use, starting one in
// process when cfg names none.
func startLedger(cfg DemoConfig) (string, func(), error) {
	if cfg.LedgerAddr != "" {
		return cfg.LedgerAddr, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "invoice-demo-ledger")
	if err != nil {
		return "", nil, err
	}
	st, err := pebble.Open(dir, pebble.Config{})
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	dev := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "invoices", Tenants: []string{"*"}}, nil
	})
	gs := grpc.NewServer()
	ledgerv1.RegisterLedgerServiceServer(gs, server.New(ledger.New(st, ledger.Config{}), server.Config{Auth: dev}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = st.Close()
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	go func() { _ = gs.Serve(lis) }()
	return lis.Addr().String(), func() {
		gs.Stop()
		_ = st.Close()
		_ = os.RemoveAll(dir)
	}, nil
}
