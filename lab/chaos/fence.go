package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// The fence's chaos run: intents through the example invoice service on
// PostgreSQL, run as several processes of its own that are killed with
// SIGKILL at random moments, that kill themselves between their commit
// and Complete (the fault hook of the service this file starts, which only
// the lab has), and that are frozen with SIGSTOP for longer than a lease,
// so that another attempt takes their key over while theirs still runs
// (a zombie, once thawed). With the fence, no intent may end with two
// invoices or an unknown outcome; without it, the same run shows what the
// fence prevents.

// FenceConfig configures RunFence.
type FenceConfig struct {
	Ledgerd string // path to a ledgerd binary
	// Service is the path to the ledgerchaos binary, whose serve command
	// is the invoice service (Serve).
	Service string
	// DatabaseURL is the PostgreSQL of the invoices; with LedgerOnPostgres,
	// ledgerd's store too. Required.
	DatabaseURL      string
	LedgerOnPostgres bool
	Intents          int  // 1000
	Agents           int  // intents in flight at once: 16
	Services         int  // service processes: 2
	Fence            bool // false: the same run, unfenced
	// Hold has the unfenced run's method hold its key when a lease runs
	// out (OUTCOME_UNKNOWN) instead of taking over.
	Hold             bool
	Lease            time.Duration // the method's: 500 ms
	KillEvery        time.Duration // mean pause between SIGKILLs: 300 ms
	PauseEvery       time.Duration // mean pause between SIGSTOPs: 1 s
	CrashAfterCommit float64       // chance a service kills itself before a Complete: 0.02
	Seed             uint64
	Progress         io.Writer
}

// FenceReport is what RunFence counted.
type FenceReport struct {
	Intents       int
	Kills         int64 // SIGKILLs from the harness, and self-kills between commit and Complete
	SelfKills     int64
	Pauses        int64 // SIGSTOPs longer than a lease
	Double        int   // invoices beyond one per intent
	Unknown       int   // intents answered OUTCOME_UNKNOWN
	Replays       int   // intents whose answer was a replay
	Missing       int   // intents answered with an invoice that is not in the table
	Lost          int   // intents with no answer by the end
	Errors        int   // intents answered with another permanent error
	Calls         int64
	Elapsed       time.Duration
	Fenced        bool
	OnLeaseExpiry string
}

// Line is the run's last line.
func (r FenceReport) Line() string {
	return fmt.Sprintf("%d intents, %d kills, %d double effects, %d unknown outcomes, %d replays", r.Intents, r.Kills, r.Double, r.Unknown, r.Replays)
}

// Table writes the run's counts.
func (r FenceReport) Table(w io.Writer) {
	mode := "fenced"
	if !r.Fenced {
		mode = "unfenced, " + r.OnLeaseExpiry
	}
	fmt.Fprintf(w, "| %s | count |\n|---|---:|\n", mode)
	for _, row := range []struct {
		name string
		n    int64
	}{
		{"intents", int64(r.Intents)},
		{"calls", r.Calls},
		{"service processes killed with SIGKILL (the harness's and their own)", r.Kills},
		{"of which killed themselves between their commit and Complete", r.SelfKills},
		{"service processes frozen past a lease (zombies once thawed)", r.Pauses},
		{"double effects (invoices beyond one an intent)", int64(r.Double)},
		{"unknown outcomes", int64(r.Unknown)},
		{"replays", int64(r.Replays)},
		{"answered invoices missing from the table", int64(r.Missing)},
		{"intents with no answer", int64(r.Lost)},
		{"intents answered with another permanent error", int64(r.Errors)},
	} {
		fmt.Fprintf(w, "| %s | %d |\n", row.name, row.n)
	}
	fmt.Fprintf(w, "| seconds | %.1f |\n\n", r.Elapsed.Seconds())
}

// OK reports whether the run kept the fence's promise: no double effect,
// no unknown outcome, nothing lost.
func (r FenceReport) OK() bool {
	return r.Double == 0 && r.Unknown == 0 && r.Missing == 0 && r.Lost == 0 && r.Errors == 0
}

func (c *FenceConfig) defaults() {
	if c.Intents <= 0 {
		c.Intents = 1000
	}
	if c.Agents <= 0 {
		c.Agents = 16
	}
	if c.Services <= 0 {
		c.Services = 2
	}
	if c.Lease <= 0 {
		c.Lease = 500 * time.Millisecond
	}
	if c.KillEvery <= 0 {
		c.KillEvery = 300 * time.Millisecond
	}
	if c.PauseEvery <= 0 {
		c.PauseEvery = time.Second
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
}

// RunFence runs the fence's chaos and reports what happened.
func RunFence(ctx context.Context, cfg FenceConfig) (FenceReport, error) {
	cfg.defaults()
	rep := FenceReport{Intents: cfg.Intents, Fenced: cfg.Fence, OnLeaseExpiry: "takeover"}
	if cfg.Hold {
		rep.OnLeaseExpiry = "hold"
	}
	dir, err := os.MkdirTemp("", "idemledger-fence-chaos-")
	if err != nil {
		return rep, err
	}
	defer os.RemoveAll(dir)
	args := []string{"--admin-listen", "", "--http-listen", "", "--drain-timeout", "1s", "--log-level", "error"}
	if cfg.LedgerOnPostgres {
		args = append(args, "--database-url", cfg.DatabaseURL, "--migrate")
	} else {
		args = append(args, "--data-dir", filepath.Join(dir, "ledger"))
	}
	// The invoice tables are applied once, before the services start, as
	// a migration tool would.
	db, err := invoice.OpenPostgres(ctx, cfg.DatabaseURL)
	if err != nil {
		return rep, err
	}
	err = db.Migrate(ctx)
	db.Close()
	if err != nil {
		return rep, err
	}
	ld, err := startChild(ctx, cfg.Ledgerd, filepath.Join(dir, "ledgerd.log"), listenFirst(args))
	if err != nil {
		return rep, err
	}
	defer ld.stop()

	rng := newLocked(cfg.Seed)
	services := make([]*child, cfg.Services)
	for i := range services {
		serve := func(addr string) []string {
			return []string{"serve", "--listen", addr, "--ledger", ld.addr, "--database-url", cfg.DatabaseURL, "--lease", cfg.Lease.String(),
				fmt.Sprintf("--fence=%t", cfg.Fence), fmt.Sprintf("--hold=%t", cfg.Hold),
				"--crash-after-commit", fmt.Sprint(cfg.CrashAfterCommit), "--seed", fmt.Sprint(cfg.Seed + uint64(i))}
		}
		if services[i], err = startChild(ctx, cfg.Service, filepath.Join(dir, fmt.Sprintf("service-%d.log", i)), serve); err != nil {
			return rep, err
		}
	}
	conns := make([]invoicev1.InvoiceServiceClient, len(services))
	for i, s := range services {
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return rep, err
		}
		defer conn.Close()
		conns[i] = invoicev1.NewInvoiceServiceClient(conn)
	}

	faults, stopFaults := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i, s := range services {
		wg.Go(func() { supervise(faults, s, &rep, cfg, i) })
	}
	wg.Go(func() { killer(faults, services, rng, cfg.KillEvery, &rep.Kills) })
	wg.Go(func() { pauser(faults, services, rng, cfg, &rep.Pauses) })

	start := time.Now()
	answers := make([]fenceAnswer, cfg.Intents)
	next := atomic.Int64{}
	var agents sync.WaitGroup
	for range cfg.Agents {
		agents.Go(func() {
			for i := int(next.Add(1)) - 1; i < cfg.Intents && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				answers[i] = intent(ctx, conns, rng, i, &rep.Calls)
				if done := i + 1; cfg.Progress != nil && done%100 == 0 {
					fmt.Fprintf(cfg.Progress, "%d intents answered, %d kills\n", done, atomic.LoadInt64(&rep.Kills))
				}
			}
		})
	}
	agents.Wait()
	rep.Elapsed = time.Since(start)
	stopFaults()
	wg.Wait()
	for _, s := range services {
		s.stop()
	}
	if err := ctx.Err(); err != nil {
		return rep, err
	}
	return rep, countEffects(ctx, cfg.DatabaseURL, answers, &rep)
}

// fenceAnswer is how an intent ended.
type fenceAnswer struct {
	invoice  string // its invoice's id
	replayed bool
	failed   bool         // it ended with an error
	code     errcode.Code // that error's
	lost     bool
}

// intentDeadline bounds an intent's retries.
const intentDeadline = 2 * time.Minute

// intent sends intent i until it has an answer: to a random service, each
// attempt bounded, retried on every error but a permanent one.
func intent(ctx context.Context, conns []invoicev1.InvoiceServiceClient, rng *locked, i int, calls *int64) fenceAnswer {
	key := fmt.Sprintf("intent-%d", i)
	req := &invoicev1.CreateInvoiceRequest{RequestId: key, Tenant: fmt.Sprintf("t%d", i%32), CustomerId: "cus_1", Currency: "EUR",
		LineItems: []*invoicev1.LineItem{{Description: "seats", Quantity: 1, UnitAmountMicros: int64(1000 + i)}}}
	deadline := time.Now().Add(intentDeadline)
	for try := 0; time.Now().Before(deadline) && ctx.Err() == nil; try++ {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var header metadata.MD
		res, err := conns[rng.intn(len(conns))].CreateInvoice(actx, req, grpc.Header(&header))
		cancel()
		atomic.AddInt64(calls, 1)
		if err == nil {
			v := header.Get(grpcguard.ReplayedHeader)
			return fenceAnswer{invoice: res.GetInvoice().GetId(), replayed: len(v) > 0 && v[0] == "true"}
		}
		le := ledgerstatus.FromError(err)
		switch le.Code {
		case errcode.OutcomeUnknown, errcode.ValidationFailed, errcode.KeyReused, errcode.KeyExpired:
			return fenceAnswer{failed: true, code: le.Code}
		}
		pause := min(time.Second, max(le.RetryAfter, time.Duration(10<<min(try, 6))*time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(pause/2 + time.Duration(rng.intn(int(pause/2)+1))):
		}
	}
	return fenceAnswer{lost: true}
}

// countEffects reads the invoice table: how many invoices each intent
// wrote.
func countEffects(ctx context.Context, url string, answers []fenceAnswer, rep *FenceReport) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	perKey := map[string]int{}
	rows, err := conn.Query(ctx, `SELECT idem_key FROM invoice_rows`)
	if err != nil {
		return err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, k := range keys {
		perKey[k]++
	}
	ids := map[string]bool{}
	idRows, err := conn.Query(ctx, `SELECT invoice FROM invoice_rows`)
	if err != nil {
		return err
	}
	invoices, err := pgx.CollectRows(idRows, pgx.RowTo[[]byte])
	if err != nil {
		return err
	}
	for _, b := range invoices {
		var inv invoicev1.Invoice
		if err := proto.Unmarshal(b, &inv); err == nil {
			ids[inv.GetId()] = true
		}
	}
	for i, a := range answers {
		n := perKey[fmt.Sprintf("intent-%d", i)]
		rep.Double += max(0, n-1)
		switch {
		case a.lost:
			rep.Lost++
		case a.failed && a.code == errcode.OutcomeUnknown:
			rep.Unknown++
		case a.failed:
			rep.Errors++
		case !ids[a.invoice]:
			rep.Missing++
		case a.replayed:
			rep.Replays++
		}
	}
	return nil
}

// supervise restarts service i whenever it exits (a SIGKILL, the
// harness's or its own), until ctx ends; an exit it did not cause is a
// self-kill.
func supervise(ctx context.Context, s *child, rep *FenceReport, cfg FenceConfig, i int) {
	for {
		s.mu.Lock()
		exited := s.exited
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-exited:
		}
		if ctx.Err() != nil {
			return
		}
		selfKilled := func() {
			if !s.takeKilled() {
				atomic.AddInt64(&rep.SelfKills, 1)
				atomic.AddInt64(&rep.Kills, 1)
			}
		}
		selfKilled()
		// A restart may be killed again before the harness sees it serve
		// (it takes calls as soon as it listens): it is started again.
		for ctx.Err() == nil {
			err := s.start(ctx)
			if err == nil {
				break
			}
			if s.exitedBy(syscall.SIGKILL) {
				selfKilled()
			} else if ctx.Err() == nil && cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "service %d did not restart: %v\n", i, err)
			}
		}
	}
}

// killer sends SIGKILL to a random service every every (on average).
func killer(ctx context.Context, services []*child, rng *locked, every time.Duration, kills *int64) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every/2 + time.Duration(rng.intn(int(every)))):
		}
		if services[rng.intn(len(services))].signal(syscall.SIGKILL) {
			atomic.AddInt64(kills, 1)
		}
	}
}

// pauser freezes a random service for one and a half leases every
// PauseEvery (on average): its attempts' leases run out and another
// attempt takes their keys over while they still run.
func pauser(ctx context.Context, services []*child, rng *locked, cfg FenceConfig, pauses *int64) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cfg.PauseEvery/2 + time.Duration(rng.intn(int(cfg.PauseEvery)))):
		}
		s := services[rng.intn(len(services))]
		if !s.signal(syscall.SIGSTOP) {
			continue
		}
		atomic.AddInt64(pauses, 1)
		select {
		case <-ctx.Done():
		case <-time.After(cfg.Lease * 3 / 2):
		}
		s.signal(syscall.SIGCONT)
	}
}

// Serve is the chaos run's invoice service (ledgerchaos serve): the
// example's InvoiceService on PostgreSQL behind the interceptor, with the
// lab's fault hook: before a Complete it kills itself with SIGKILL at the
// chance --crash-after-commit, after the invoice's commit and before the
// ledger hears of it.
func Serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "gRPC address")
	ledgerAddr := fs.String("ledger", "", "ledgerd's gRPC address")
	databaseURL := fs.String("database-url", "", "the invoices' PostgreSQL")
	lease := fs.Duration("lease", 500*time.Millisecond, "CreateInvoice's lease")
	fenced := fs.Bool("fence", true, "write each invoice with its key's fence")
	hold := fs.Bool("hold", false, "unfenced: hold a key whose lease ran out (OUTCOME_UNKNOWN) instead of taking it over")
	crash := fs.Float64("crash-after-commit", 0, "the chance of a SIGKILL of its own before a Complete")
	seed := fs.Uint64("seed", 1, "of the crashes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	db, err := invoice.OpenPostgres(ctx, *databaseURL)
	if err != nil {
		return err
	}
	defer db.Close()
	db.Unfenced = !*fenced
	conn, err := grpc.NewClient(*ledgerAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	var ledger ledgerv1.LedgerServiceClient = &crashBeforeComplete{LedgerServiceClient: ledgerv1.NewLedgerServiceClient(conn), chance: *crash, rng: newLocked(*seed)}
	g, err := guard.New(ledger, guard.WithCompletion(2*time.Second, 24*time.Second))
	if err != nil {
		return err
	}
	method := grpcguard.Method{Policy: guard.Policy{Lease: *lease}}
	switch {
	case *fenced:
		method.Policy.Fence = db.Fence()
	case *hold:
		method.Policy.OnLeaseExpiry = guard.Hold
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g, grpcguard.WithMethod(invoice.CreateInvoiceMethod, method), grpcguard.WithKeyField("request_id"))
	if err != nil {
		return err
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(icpt))
	invoicev1.RegisterInvoiceServiceServer(gs, &invoice.Service{Store: db})
	healthpb.RegisterHealthServer(gs, health.NewServer())
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	go func() {
		<-ctx.Done()
		gs.Stop()
	}()
	if err := gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// crashBeforeComplete is the lab's fault hook: a ledger client that, at
// its chance, kills its own process before it sends a Complete.
type crashBeforeComplete struct {
	ledgerv1.LedgerServiceClient
	chance float64
	rng    *locked
}

func (c *crashBeforeComplete) Complete(ctx context.Context, req *ledgerv1.CompleteRequest, opts ...grpc.CallOption) (*ledgerv1.CompleteResponse, error) {
	if c.rng.chance(c.chance) {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	return c.LedgerServiceClient.Complete(ctx, req, opts...)
}
