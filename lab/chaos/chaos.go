// Package chaos runs many intents through the whole system while it
// injects faults everywhere, and checks the guarantees: every intent ends
// with exactly one effect, none is lost, and every answer and replay of an
// intent is byte for byte the same.
//
// The topology, with a fault proxy (package faultproxy) on every hop:
//
//	agents ─[proxy]─► invoice service (interceptor) ─[proxy]─► ledgerd ─[proxy]─► PostgreSQL
//
// ledgerd runs as a child process, so it can be killed with SIGKILL and
// started again mid-flight; without a database it runs on its embedded
// store, which the kills exercise instead.
package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/lab/faultproxy"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Config configures Run.
type Config struct {
	Ledgerd string // path to a ledgerd binary; required
	Intents int    // 300
	Agents  int    // intents in flight at once: 16
	Seed    uint64 // of the agents' and the faults' choices; 0 picks one
	// DatabaseURL runs ledgerd on PostgreSQL or CockroachDB (through a
	// proxy); empty runs it on its embedded store.
	DatabaseURL string
	// RestartDatabase, when set, restarts the database now and then.
	RestartDatabase func() error
	// FaultEvery is the mean pause between faults of each kind: 1 s. Cut
	// responses, latency and 429 storms last a third to a half of it;
	// ledgerd is killed every 4 and the database restarted every 10.
	FaultEvery time.Duration
	// Pace is the mean pause of an agent between two intents: 0.
	Pace time.Duration
	// Progress, when set, hears a line now and then.
	Progress io.Writer
	// LedgerStream has the write service call the ledger over a Stream
	// (ledger/ledgerclient) instead of unary calls.
	LedgerStream bool
}

// Report is what Run counted.
type Report struct {
	Intents           int
	Answered          int // intents answered while the faults ran
	AnsweredAfter     int // intents answered only by the final pass
	Lost              int // intents with no answer at all: must be 0
	Effects           int // invoice rows written
	MissingEffects    int // intents with no row: must be 0
	DuplicateEffects  int // rows beyond one per intent: must be 0
	Answers           int // successful answers recorded (first answers and replays)
	AnswerMismatches  int // answers of an intent that differ in a byte from its first: must be 0
	Calls             int64
	Replayed          int64 // answers marked idempotency-replayed
	Elapsed           time.Duration
	CutResponses      int64 // agent ← service responses cut after the service did the work
	TimeoutsAfterDone int64 // 504s answered after the write and Complete
	RateLimited       int64 // calls refused by a 429 storm
	Storms            int64
	Resets            int64 // connections reset, on every hop
	LatencySpells     int64
	LedgerdKills      int64 // SIGKILLs of ledgerd, each followed by a restart
	DatabaseRestarts  int64
}

// OK reports whether every guarantee held.
func (r Report) OK() bool {
	return r.Lost == 0 && r.MissingEffects == 0 && r.DuplicateEffects == 0 && r.AnswerMismatches == 0 && r.Effects == r.Intents
}

// Table writes the report as two tables: the faults, and the outcomes.
func (r Report) Table(w io.Writer) {
	fmt.Fprintf(w, "| fault | count |\n|---|---:|\n")
	for _, row := range []struct {
		name string
		n    int64
	}{
		{"responses cut after the service did the work (agent ← service)", r.CutResponses},
		{"504s after the write committed", r.TimeoutsAfterDone},
		{"429 storms", r.Storms},
		{"calls refused by 429 storms", r.RateLimited},
		{"connections reset (all hops)", r.Resets},
		{"latency spells (up to 25 ms a chunk)", r.LatencySpells},
		{"ledgerd killed with SIGKILL and restarted", r.LedgerdKills},
		{"database restarts", r.DatabaseRestarts},
	} {
		fmt.Fprintf(w, "| %s | %d |\n", row.name, row.n)
	}
	fmt.Fprintf(w, "\n| outcome | count |\n|---|---:|\n")
	for _, row := range []struct {
		name string
		n    int64
	}{
		{"intents", int64(r.Intents)},
		{"answered during the faults", int64(r.Answered)},
		{"answered by the final pass only", int64(r.AnsweredAfter)},
		{"lost (never answered)", int64(r.Lost)},
		{"effects (invoice rows)", int64(r.Effects)},
		{"intents without an effect", int64(r.MissingEffects)},
		{"duplicate effects", int64(r.DuplicateEffects)},
		{"answers compared (first answers and replays)", int64(r.Answers)},
		{"answers differing from the intent's first", int64(r.AnswerMismatches)},
		{"calls made (retries included)", r.Calls},
		{"answers replayed by the ledger", r.Replayed},
	} {
		fmt.Fprintf(w, "| %s | %d |\n", row.name, row.n)
	}
	fmt.Fprintf(w, "\nelapsed %s\n", r.Elapsed.Round(time.Millisecond))
}

func (c Config) withDefaults() Config {
	if c.Intents <= 0 {
		c.Intents = 300
	}
	if c.Agents <= 0 {
		c.Agents = 16
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.FaultEvery <= 0 {
		c.FaultEvery = time.Second
	}
	return c
}

// Run builds the topology, runs the intents under faults, runs a final
// pass without faults, and checks the store. It returns an error only when
// the harness itself fails; broken guarantees are in the Report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	start := time.Now()
	w, err := build(ctx, cfg)
	if err != nil {
		return Report{}, err
	}
	defer w.close()
	keys, answers := w.underFaults(ctx)
	if err := ctx.Err(); err != nil {
		return w.rep, err
	}
	final := w.pass(ctx, func(i int) [][]byte {
		return runIntent(ctx, w.client, keys[i], i, newLocked(uint64(i)+1), time.Minute)
	})
	w.verdict(ctx, keys, answers, final)
	w.rep.Elapsed = time.Since(start)
	return w.rep, nil
}

// world is the topology of a run, and what it counted.
type world struct {
	cfg      Config
	rep      Report // counted atomically while the faults run
	rng      *locked
	closers  []func()
	ld       *child
	svcProxy *faultproxy.Proxy
	proxies  []*faultproxy.Proxy // every hop: service, ledgerd, and the database if any
	store    *invoice.Store
	storm    atomic.Bool // a 429 storm is on
	client   invoicev1.InvoiceServiceClient
}

func (w *world) close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
}

// build starts ledgerd (on the database through a proxy, or on its
// embedded store), the invoice service behind the interceptor, and the
// agents' connection, with a fault proxy on every hop. On error it closes
// what it started.
func build(ctx context.Context, cfg Config) (_ *world, err error) {
	w := &world{cfg: cfg, rng: newLocked(cfg.Seed), store: invoice.NewStore()}
	defer func() {
		if err != nil {
			w.close() // w, not the nil the error path returns
		}
	}()
	dir, err := os.MkdirTemp("", "idemledger-chaos-")
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, func() { _ = os.RemoveAll(dir) })
	ledgerConn, err := w.startLedgerd(ctx, dir)
	if err != nil {
		return nil, err
	}
	svcAddr, err := w.startService(ledgerConn)
	if err != nil {
		return nil, err
	}
	if w.svcProxy, err = w.proxy(svcAddr); err != nil {
		return nil, err
	}
	w.proxies = append([]*faultproxy.Proxy{w.svcProxy}, w.proxies...)
	conn, err := grpc.NewClient(w.svcProxy.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			idemclient.UnaryClientInterceptor(idemclient.WithKeyField("request_id"), idemclient.WithMaxAttempts(8), idemclient.WithBackoff(10*time.Millisecond, 500*time.Millisecond)),
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				atomic.AddInt64(&w.rep.Calls, 1)
				var header metadata.MD
				err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&header))...)
				if v := header.Get(grpcguard.ReplayedHeader); len(v) > 0 && v[0] == "true" {
					atomic.AddInt64(&w.rep.Replayed, 1)
				}
				return err
			}))
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, func() { _ = conn.Close() })
	w.client = invoicev1.NewInvoiceServiceClient(conn)
	return w, nil
}

// proxy starts a fault proxy in front of addr.
func (w *world) proxy(addr string) (*faultproxy.Proxy, error) {
	p, err := faultproxy.New(addr)
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, func() { _ = p.Close() })
	return p, nil
}

// startLedgerd starts ledgerd as a child process, behind a proxy, and
// returns a connection to it through the proxy.
func (w *world) startLedgerd(ctx context.Context, dir string) (*grpc.ClientConn, error) {
	args := []string{"--admin-listen", "", "--http-listen", "", "--drain-timeout", "1s", "--lease", "2s", "--log-level", "error"}
	if w.cfg.DatabaseURL != "" {
		u, host, err := splitHost(w.cfg.DatabaseURL)
		if err != nil {
			return nil, err
		}
		dbProxy, err := w.proxy(host)
		if err != nil {
			return nil, err
		}
		w.proxies = append(w.proxies, dbProxy)
		args = append(args, "--database-url", u(dbProxy.Addr()), "--migrate")
	} else {
		args = append(args, "--data-dir", filepath.Join(dir, "ledger"))
	}
	ld, err := startChild(ctx, w.cfg.Ledgerd, filepath.Join(dir, "ledgerd.log"), listenFirst(args))
	if err != nil {
		return nil, err
	}
	w.ld = ld
	w.closers = append(w.closers, ld.stop)
	ledgerProxy, err := w.proxy(ld.addr)
	if err != nil {
		return nil, err
	}
	w.proxies = append([]*faultproxy.Proxy{ledgerProxy}, w.proxies...)
	conn, err := grpc.NewClient(ledgerProxy.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	w.closers = append(w.closers, func() { _ = conn.Close() })
	return conn, nil
}

// startService serves the invoice service behind the idempotency
// interceptor, with a gateway in front that answers 429 during storms and
// 504 now and then after the write, and returns its address.
func (w *world) startService(ledgerConn *grpc.ClientConn) (string, error) {
	ledgerClient := ledgerv1.NewLedgerServiceClient(ledgerConn)
	if w.cfg.LedgerStream {
		sc := ledgerclient.New(ledgerClient)
		w.closers = append(w.closers, func() { _ = sc.Close() })
		ledgerClient = sc
	}
	g, err := guard.New(ledgerClient, guard.WithCompletion(2*time.Second, 24*time.Second))
	if err != nil {
		return "", err
	}
	icpt, err := grpcguard.UnaryServerInterceptor(g,
		grpcguard.WithMethod(invoice.CreateInvoiceMethod, grpcguard.Method{Policy: guard.Policy{Lease: 2 * time.Second, OnInProgress: guard.Reject}}),
		grpcguard.WithKeyField("request_id"))
	if err != nil {
		return "", err
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if w.storm.Load() {
				atomic.AddInt64(&w.rep.RateLimited, 1)
				return nil, ledgerstatus.Err(&errcode.Error{Code: errcode.RateLimited, Message: "429: slow down", RetryAfter: 50 * time.Millisecond})
			}
			res, err := next(ctx, req)
			if err == nil && w.rng.chance(0.03) {
				atomic.AddInt64(&w.rep.TimeoutsAfterDone, 1)
				return nil, status.Error(codes.DeadlineExceeded, "504: upstream timed out")
			}
			return res, err
		},
		icpt,
	))
	invoicev1.RegisterInvoiceServiceServer(gs, &invoice.Service{Store: w.store})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() { _ = gs.Serve(lis) }()
	w.closers = append(w.closers, gs.Stop)
	return lis.Addr().String(), nil
}

// underFaults runs every intent through the agents while the faults run,
// and stops the faults when the agents are done. It returns each intent's
// key and answers.
func (w *world) underFaults(ctx context.Context) ([]string, [][][]byte) {
	faultCtx, stopFaults := context.WithCancel(ctx)
	faults := w.startFaults(faultCtx)
	keys := make([]string, w.cfg.Intents)
	answers := w.pass(ctx, func(i int) [][]byte {
		if w.cfg.Pace > 0 {
			time.Sleep(time.Duration(w.rng.float() * 2 * float64(w.cfg.Pace)))
		}
		keys[i] = idemclient.NewKey()
		a := runIntent(ctx, w.client, keys[i], i, w.rng, 30*time.Second)
		if i%1000 == 999 {
			progress(w.cfg, "%d intents done", i+1)
		}
		return a
	})
	stopFaults()
	faults.Wait()
	for _, p := range w.proxies {
		p.SetLatency(0)
		p.SetCutResponses(0)
		p.Disarm()
	}
	return keys, answers
}

// pass runs intent(i) for every intent, Config.Agents at a time, and
// returns each one's answers.
func (w *world) pass(ctx context.Context, intent func(i int) [][]byte) [][][]byte {
	answers := make([][][]byte, w.cfg.Intents)
	var next atomic.Int64
	var agents sync.WaitGroup
	for range w.cfg.Agents {
		agents.Go(func() {
			for i := int(next.Add(1)) - 1; i < w.cfg.Intents && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				answers[i] = intent(i)
			}
		})
	}
	agents.Wait()
	return answers
}

// startFaults injects every kind of fault, each about once a
// Config.FaultEvery, until ctx ends; wait on the group it returns.
func (w *world) startFaults(ctx context.Context) *sync.WaitGroup {
	var faults sync.WaitGroup
	every := func(mean time.Duration, fault func()) {
		faults.Go(func() {
			// The first one comes within one mean, then a mean apart on
			// average.
			for scale := 1.0; ; scale = 2 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(w.rng.float() * scale * float64(mean))):
				}
				fault()
			}
		})
	}
	spell := func(d time.Duration, on, off func()) {
		on()
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		off()
	}
	mean := w.cfg.FaultEvery
	every(mean, func() {
		// Each spell cuts one answer for certain, the first to a request
		// after it began, and then one chunk in twenty while it lasts.
		spell(mean/3, func() {
			w.svcProxy.CutAfter(lineItem)
			w.svcProxy.SetCutResponses(0.05)
		}, func() { w.svcProxy.SetCutResponses(0) })
	})
	every(mean, func() {
		p := w.proxies[w.rng.intn(len(w.proxies))]
		atomic.AddInt64(&w.rep.LatencySpells, 1)
		spell(mean/2, func() { p.SetLatency(25 * time.Millisecond) }, func() { p.SetLatency(0) })
	})
	every(mean, func() { w.proxies[w.rng.intn(len(w.proxies))].ResetAll() })
	every(2*mean, func() {
		atomic.AddInt64(&w.rep.Storms, 1)
		spell(mean/3, func() { w.storm.Store(true) }, func() { w.storm.Store(false) })
	})
	every(4*mean, func() {
		if err := w.ld.restart(ctx); err != nil {
			progress(w.cfg, "restarting ledgerd: %v", err)
			return
		}
		atomic.AddInt64(&w.rep.LedgerdKills, 1)
	})
	if w.cfg.RestartDatabase != nil {
		every(10*mean, func() {
			if err := w.cfg.RestartDatabase(); err != nil {
				progress(w.cfg, "restarting the database: %v", err)
				return
			}
			atomic.AddInt64(&w.rep.DatabaseRestarts, 1)
		})
	}
	return &faults
}

// verdict fills the report from the answers of both passes and the
// service's store.
func (w *world) verdict(ctx context.Context, keys []string, answers, final [][][]byte) {
	rep := &w.rep
	for i := range w.cfg.Intents {
		if len(answers[i]) > 0 {
			rep.Answered++
		} else if len(final[i]) > 0 {
			rep.AnsweredAfter++
		}
		answers[i] = append(answers[i], final[i]...)
		if len(answers[i]) == 0 {
			rep.Lost++
		}
	}
	rep.Intents = w.cfg.Intents
	for _, as := range answers {
		rep.Answers += len(as)
		for _, a := range as[min(1, len(as)):] {
			if !bytes.Equal(a, as[0]) {
				rep.AnswerMismatches++
			}
		}
	}
	perKey := map[string]int{}
	rows, _ := w.store.Rows(ctx) // in memory: no error
	for _, row := range rows {
		perKey[row.Key]++
	}
	rep.Effects = len(rows)
	for _, k := range keys {
		switch n := perKey[k]; {
		case n == 0:
			rep.MissingEffects++
		case n > 1:
			rep.DuplicateEffects += n - 1
		}
	}
	for _, p := range w.proxies {
		rep.Resets += p.Resets.Load()
	}
	rep.CutResponses = w.svcProxy.Cuts.Load()
}

// lineItem is what every intent's invoice is for: its request holds it,
// which arms a certain cut (Proxy.CutAfter).
const lineItem = "seats"

// runIntent is one intent: a key, sent until answered (idemclient retries,
// and the agent resumes after the retries give up) or until the deadline,
// and sent again now and then after an answer, as a duplicate delivery. It
// returns the bytes of every answer.
func runIntent(ctx context.Context, client invoicev1.InvoiceServiceClient, key string, i int, rng *locked, deadline time.Duration) [][]byte {
	ictx, cancel := context.WithTimeout(idemclient.WithKey(ctx, key), deadline)
	defer cancel()
	req := &invoicev1.CreateInvoiceRequest{
		RequestId: key, Tenant: fmt.Sprintf("tenant-%d", i%7), CustomerId: fmt.Sprintf("cus_%d", i), Currency: "EUR",
		LineItems: []*invoicev1.LineItem{{Description: lineItem, Quantity: int64(1 + i%9), UnitAmountMicros: 9_990_000}},
	}
	var answers [][]byte
	for ictx.Err() == nil {
		cctx, cancelCall := context.WithTimeout(ictx, 5*time.Second)
		res, err := client.CreateInvoice(cctx, proto.Clone(req).(*invoicev1.CreateInvoiceRequest))
		cancelCall()
		if err == nil {
			b, merr := proto.MarshalOptions{Deterministic: true}.Marshal(res)
			if merr == nil {
				answers = append(answers, b)
			}
			if !rng.chance(0.2) { // a duplicate delivery one time in five
				return answers
			}
			continue
		}
		time.Sleep(time.Duration(20+rng.intn(80)) * time.Millisecond)
	}
	return answers
}

// child is a child process that serves gRPC health: ledgerd, or the fence
// run's invoice service.
type child struct {
	bin, log string
	args     []string
	addr     string
	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}           // closed when cmd has exited
	killed   bool                    // the harness sent the last SIGKILL
	state    func() *os.ProcessState // how the process ended, once it has
}

// startChild starts bin with args(addr), addr a free loopback port it is
// to listen on, and waits for it to serve.
func startChild(ctx context.Context, bin, log string, args func(addr string) []string) (*child, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	c := &child{bin: bin, log: log, args: args(addr), addr: addr}
	if err := c.start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// listenFirst is startChild's args for ledgerd: --listen, then args.
func listenFirst(args []string) func(string) []string {
	return func(addr string) []string { return append([]string{"--listen", addr}, args...) }
}

func (l *child) start(ctx context.Context) error {
	f, err := os.OpenFile(l.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(l.bin, l.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = f.Close(); close(exited) }()
	l.state = func() *os.ProcessState { return cmd.ProcessState }
	l.mu.Lock()
	l.cmd, l.exited = cmd, exited
	l.mu.Unlock()
	return l.waitServing(ctx, exited, 30*time.Second)
}

// waitServing waits for gRPC health to say SERVING, or the process to
// exit.
func (l *child) waitServing(ctx context.Context, exited <-chan struct{}, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	conn, err := grpc.NewClient(l.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	for {
		res, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(l.log)
			l.mu.Lock()
			state := l.state()
			l.mu.Unlock()
			return fmt.Errorf("%s exited before it served (%s)\n%s", filepath.Base(l.bin), state.String(), tail(log))
		default:
		}
		if ctx.Err() != nil {
			log, _ := os.ReadFile(l.log)
			return fmt.Errorf("%s did not serve within %s: %w\n%s", filepath.Base(l.bin), d, err, tail(log))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restart kills the process with SIGKILL and starts it again.
func (l *child) restart(ctx context.Context) error {
	l.kill()
	return l.start(ctx)
}

func (l *child) kill() {
	l.mu.Lock()
	cmd, exited := l.cmd, l.exited
	l.mu.Unlock()
	if cmd != nil {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
	}
}

func (l *child) stop() { l.kill() }

// signal sends sig to the process while it runs, and says whether it did;
// a SIGKILL it sent is the harness's (takeKilled).
func (l *child) signal(sig syscall.Signal) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.exited:
		return false
	default:
	}
	if sig == syscall.SIGKILL {
		l.killed = true
	}
	return l.cmd.Process.Signal(sig) == nil
}

// exitedBy says whether the process that exited last was ended by sig.
func (l *child) exitedBy(sig syscall.Signal) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.exited:
	default:
		return false
	}
	ws, ok := l.state().Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// takeKilled says whether the harness killed the process that exited last,
// and forgets it.
func (l *child) takeKilled() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.killed
	l.killed = false
	return k
}

func tail(b []byte) []byte {
	if len(b) > 2000 {
		return b[len(b)-2000:]
	}
	return b
}

func progress(cfg Config, format string, args ...any) {
	if cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, format+"\n", args...)
	}
}

// locked is a seeded random source safe for concurrent use.
type locked struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLocked(seed uint64) *locked { return &locked{r: rand.New(rand.NewPCG(seed, seed>>1|1))} }

func (l *locked) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

func (l *locked) chance(p float64) bool { return l.float() < p }

func (l *locked) intn(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}
