// Command ledgerd serves the idempotency ledger (idemledger.v1.LedgerService)
// over gRPC. It only wires: flags and LEDGER_* environment, the store
// (embedded Pebble by default, PostgreSQL or CockroachDB with
// --database-url), credentials, interceptors, health, reflection, metrics,
// the expiry sweeper and a graceful stop. See the README for every flag.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/grpclog"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/buildinfo"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is ledgerd until ctx ends (SIGTERM or SIGINT). It returns the exit
// code: 0 after a clean stop, 1 when serving failed, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "ledgerd:", err)
		return 2
	}
	if cfg.version {
		fmt.Fprintln(stdout, "ledgerd", version())
		return 0
	}
	log, err := newLogger(cfg, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "ledgerd:", err)
		return 2
	}
	// gRPC's own log lines (accept errors, bad clients) go to the same
	// structured log, at warn and above.
	grpclog.SetLoggerV2(grpcLogger{log})
	if cfg.oneShot() {
		if err := databaseJob(ctx, cfg, stdout, log); err != nil {
			log.ErrorContext(ctx, "database job failed", "error", err)
			return 1
		}
		return 0
	}
	stopTracing, err := setupTracing(ctx, log)
	if err != nil {
		log.ErrorContext(ctx, "tracing", "error", err)
		return 1
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = stopTracing(sctx)
	}()
	if err := serve(ctx, cfg, log); err != nil {
		log.ErrorContext(ctx, "ledgerd stopped", "error", err)
		return 1
	}
	return 0
}

// serve runs ledgerd until ctx ends: it builds the daemon, opens its
// listeners, starts the store and the background work, serves, drains,
// and stops the background work, the store last.
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	d, err := newDaemon(ctx, cfg, log)
	if err != nil {
		return err
	}
	if d.auditFile != nil {
		defer func() { _ = d.auditFile.close() }()
	}
	if err := d.listen(ctx); err != nil {
		return err
	}
	defer d.closeListeners(ctx)
	bg := d.startBackground(ctx)
	serveErr := d.serve(ctx, bg.storeDone)
	d.drain(ctx)
	bg.stop()
	log.InfoContext(ctx, "ledgerd stopped")
	if serveErr != nil && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return serveErr
	}
	return nil
}

// daemon is ledgerd's servers over its store, built by newDaemon.
type daemon struct {
	cfg       config
	log       *slog.Logger
	creds     *credentialSet
	reg       *prometheus.Registry
	store     *lateStore
	storeMet  *storeMetrics
	ledgerSrv *server.Server
	grpc      *grpc.Server
	health    *health.Server
	conns     *connLimit // gRPC's
	httpConns *connLimit
	console   *console.Console
	auditFile *auditFile // nil without --audit-file
	census    latestCensus
	decisions decisionRate

	// Set by listen.
	lis        net.Listener
	healthOnly *grpc.Server
	healthAddr string
	http       *http.Server
	httpAddr   string
	admin      *http.Server
}

// newDaemon builds the gRPC server with its services, the store that
// opens later (lateStore), the ledger over it, health and the metrics.
func newDaemon(ctx context.Context, cfg config, log *slog.Logger) (*daemon, error) {
	cs, err := newCredentialSet(cfg, log)
	if err != nil {
		return nil, err
	}
	d := &daemon{cfg: cfg, log: log, creds: cs, reg: prometheus.NewRegistry(), store: newLateStore(cfg, log), health: health.NewServer()}
	// The Go collector's defaults and the scheduler's latencies
	// (go_sched_latencies_seconds): how long goroutines ready to run
	// waited for a CPU, which is in every call's tail when ledgerd has
	// fewer cores than work.
	goCollector := collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
		collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/latencies:seconds$`)}))
	d.reg.MustRegister(goCollector, collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoGauge())
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram())
	decisions, observe := decisionCounter()
	d.reg.MustRegister(grpcMetrics, decisions)
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "idemledger", Name: "connections_shed_total",
		Help: "Idle connections closed to make room for a new one at --max-connections, by listener (grpc, http)."}, []string{"listener"})
	d.reg.MustRegister(shed)
	d.conns = newConnLimit(cfg.maxConnections, shed.WithLabelValues("grpc"))
	d.httpConns = newConnLimit(cfg.maxConnections, shed.WithLabelValues("http"))
	// A call on a Stream is counted by the same metrics as its unary
	// call: the alerts on Begin's latency and errors see write services.
	srvCfg := server.Config{Auth: cs.authenticator(), Logger: log, Observe: observe, StreamMaxAge: cfg.streamMaxAge,
		CallInterceptor: grpcMetrics.UnaryServerInterceptor()}
	if cfg.rateLimit > 0 {
		srvCfg.RateLimit = server.NewRateLimit(cfg.rateLimit, cfg.rateBurst)
	}
	d.grpc = grpc.NewServer(append(server.TransportOptions(), d.grpcOptions(grpcMetrics)...)...) //nolint:contextcheck // a stream interceptor takes its context from the stream
	d.storeMetrics(ctx)
	l := ledger.New(d.store, cfg.ledger)
	d.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "idemledger", Name: "lookup_waiters",
		Help: "Lookups with a wait waiting now (bounded per namespace by --max-waiters, in all by --max-waiters-total)."}, func() float64 { return float64(l.Waiters()) }))
	d.ledgerSrv = server.New(l, srvCfg)
	ledgerv1.RegisterLedgerServiceServer(d.grpc, d.ledgerSrv)
	// AdminService's audit lines go to the log, and the latest to the
	// console's audit page.
	audit := &auditRing{}
	if cfg.auditFile != "" {
		if audit.file, err = openAuditFile(cfg.auditFile); err != nil {
			return nil, err
		}
		d.auditFile = audit.file
	}
	adminCfg := srvCfg
	adminCfg.Logger = slog.New(audit.handler(log.Handler()))
	if cfg.databaseURL == "" && cfg.backupDir != "" {
		adminCfg.Backup = d.store.backup(cfg.backupDir)
	}
	admin := server.NewAdmin(l, adminCfg)
	ledgerv1.RegisterAdminServiceServer(d.grpc, admin)
	if d.console, err = console.New(console.Config{Admin: admin, Auth: cs.authenticator(), Census: d.census.get, Decisions: d.decisions.lastHour,
		Ready: d.ready, Store: storeName(cfg), Audit: audit.recent, Log: adminCfg.Logger}); err != nil {
		return nil, err
	}
	d.setServing(healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(d.grpc, probes{Server: d.health, mustRestart: d.store.mustRestart})
	d.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "idemledger", Name: "ready",
		Help: "1 while ledgerd serves (its store takes writes), 0 while it reports NOT_SERVING."}, func() float64 {
		res, err := d.health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return 1
		}
		return 0
	}))
	if cfg.reflection {
		reflection.Register(d.grpc)
	}
	grpcMetrics.InitializeMetrics(d.grpc)
	return d, nil
}

// grpcOptions are the gRPC server's settings: credentials, limits,
// keepalives and interceptors.
func (d *daemon) grpcOptions(metrics *grpcprom.ServerMetrics) []grpc.ServerOption {
	cfg := d.cfg
	return []grpc.ServerOption{
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		grpc.StatsHandler(d.conns),
		grpc.Creds(d.creds.transport()),
		grpc.MaxRecvMsgSize(cfg.maxRecvBytes),
		grpc.MaxSendMsgSize(cfg.maxRecvBytes),
		grpc.MaxConcurrentStreams(server.MaxConnectionStreams),
		// Metadata is read before a call is authenticated: bound it.
		grpc.MaxHeaderListSize(server.MaxHeaderListBytes),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: 15 * time.Minute,
			MaxConnectionAge:  30 * time.Minute, // spread clients over new replicas
			// Let a long Lookup finish, and a Stream opened just before the
			// GOAWAY reach its age, drain and finish its calls.
			MaxConnectionAgeGrace: cfg.streamMaxAge + ledger.DefaultMaxLookupWait + server.DrainGrace + 10*time.Second,
			Time:                  time.Minute,
			Timeout:               20 * time.Second,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(unaryInterceptors(d.log, metrics)...),
		grpc.ChainStreamInterceptor(streamInterceptors(d.log, metrics)...),
	}
}

// storeMetrics registers the store's metrics: call durations, the clock
// steps and write stalls of the embedded store, SQL batches and follower
// reads.
func (d *daemon) storeMetrics(ctx context.Context) {
	d.storeMet = newStoreMetrics(d.reg)
	d.storeMet.bind(d.store)
	clockSteps := prometheus.NewCounter(prometheus.CounterOpts{Namespace: "idemledger", Name: "clock_steps_total",
		Help: "Steps of the wall clock the embedded store noticed; none of them expired a lease or a record early."})
	d.reg.MustRegister(clockSteps)
	d.store.onClockStep = func(step time.Duration) {
		clockSteps.Inc()
		d.log.WarnContext(ctx, "the wall clock stepped: the embedded store keeps time by the monotonic clock until ledgerd restarts", "step", step.String())
	}
	if d.cfg.databaseURL != "" && d.cfg.sqlBatching {
		d.reg.MustRegister(d.store.batchMetrics()...)
	}
	if d.cfg.databaseURL == "" { // the embedded store's own; a SQL ledgerd has no Pebble to report
		d.reg.MustRegister(d.store.stallMetrics()...)
		d.reg.MustRegister(d.store.walSyncMetric())
	}
	if d.cfg.followerReads > 0 {
		d.reg.MustRegister(d.store.followerMetrics()...)
	}
}

// livenessService is the grpc.health.v1 service a liveness probe asks for:
// SERVING unless the store must be reopened by a restart, as /healthz.
const livenessService = "liveness"

// probes is grpc.health.v1 as ledgerd serves it: livenessService answers
// what /healthz answers (a liveness probe on the health listener, which
// the NetworkPolicy opens to the kubelet, needs no admin port), every
// other service what the health server holds (readiness: the canary).
type probes struct {
	*health.Server
	mustRestart func(context.Context) error
}

func (p probes) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.GetService() != livenessService {
		return p.Server.Check(ctx, req)
	}
	status := healthpb.HealthCheckResponse_SERVING
	if p.mustRestart(ctx) != nil { // said as the status, not as the call's error
		status = healthpb.HealthCheckResponse_NOT_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: status}, nil
}

// setServing reports st for the whole server and for LedgerService.
func (d *daemon) setServing(st healthpb.HealthCheckResponse_ServingStatus) {
	d.health.SetServingStatus("", st)
	d.health.SetServingStatus(ledgerv1.LedgerService_ServiceDesc.ServiceName, st)
}

// listen opens every listener: gRPC and HTTP (each bounded by
// --max-connections, where a newcomer sheds an idle connection or waits:
// connLimit), the plaintext health port and admin. On an error it closes
// what it opened.
func (d *daemon) listen(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			d.closeListeners(ctx)
		}
	}()
	lis, err := net.Listen("tcp", d.cfg.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	d.lis = d.conns.listen(lis)
	if d.cfg.healthListen != "" {
		hl, err := net.Listen("tcp", d.cfg.healthListen)
		if err != nil {
			return fmt.Errorf("health listen: %w", err)
		}
		d.healthAddr = hl.Addr().String()
		d.healthOnly = grpc.NewServer()
		healthpb.RegisterHealthServer(d.healthOnly, probes{Server: d.health, mustRestart: d.store.mustRestart})
		go func() { _ = d.healthOnly.Serve(hl) }()
	}
	if d.cfg.httpListen != "" {
		if d.http, d.httpAddr, err = startHTTP(d.cfg.httpListen, d.grpc, d.creds.httpTLS(), d.creds.authenticator(), d.httpConns, d.cfg, d.log); err != nil {
			return err
		}
	}
	if d.cfg.adminListen != "" {
		if d.admin, err = startAdmin(d.cfg.adminListen, d.creds.adminTLS(), d.reg, d.health, d.store.mustRestart, d.console, d.log); err != nil {
			return err
		}
	}
	return nil
}

// closeListeners stops what listen started and serve did not: the
// health port, the admin server, and the gRPC listener if it never
// served.
func (d *daemon) closeListeners(ctx context.Context) {
	if d.healthOnly != nil {
		d.healthOnly.Stop()
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if d.admin != nil {
		_ = d.admin.Shutdown(sctx)
	}
	if d.lis != nil {
		_ = d.lis.Close()
	}
	stopHTTP(sctx, d.http)
}

// background is the work that runs beside the servers, until stop: the
// store (its sweeper), the health watch, the census and the SIGHUP
// reload. storeDone says why the store ended early (it refused to open).
type background struct {
	storeDone <-chan error
	stop      func()
}

// startBackground starts the background work. It ends with stop, after
// the gRPC server drained; the store closes last.
func (d *daemon) startBackground(ctx context.Context) background {
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Go(func() { watchHealth(bg, d.store, d.health, d.log) })
	wg.Go(func() { d.decisions.run(bg, d.reg) })
	if d.cfg.censusInterval > 0 {
		wg.Go(func() { d.storeMet.census(bg, d.store, d.cfg.censusInterval, &d.census, d.log) })
	}
	// SIGHUP reloads the credentials files (tokens, certificate principals,
	// the server's certificate and the client CA).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	wg.Go(func() {
		for {
			select {
			case <-bg.Done():
				return
			case <-hup:
				d.creds.reload(bg)
				if d.auditFile != nil {
					if err := d.auditFile.reopen(); err != nil {
						d.log.ErrorContext(bg, "audit file not reopened", "error", err)
					}
				}
			}
		}
	})
	storeDone := make(chan error, 1)
	wg.Go(func() {
		storeDone <- d.store.Run(bg, func(err error) { d.log.WarnContext(bg, "expiry sweep failed", "error", err) })
	})
	return background{storeDone: storeDone, stop: func() {
		signal.Stop(hup)
		cancel()
		wg.Wait()
	}}
}

// serve gives the store a moment to open, so that the first calls find
// it (past that it serves anyway and answers UNAVAILABLE until the store
// opens), then serves gRPC until ctx ends, serving fails, or the store
// refuses to open.
func (d *daemon) serve(ctx context.Context, storeDone <-chan error) error {
	select {
	case <-d.store.opened:
	case err := <-storeDone:
		return err
	case <-time.After(2 * time.Second):
		d.log.WarnContext(ctx, "the store is not open yet: serving NOT_SERVING until it is")
	case <-ctx.Done():
		return nil
	}
	served := make(chan error, 1)
	lis := d.lis
	d.lis = nil // Serve closes it
	go func() { served <- d.grpc.Serve(lis) }()
	d.log.InfoContext(ctx, "ledgerd listening", "grpc", lis.Addr().String(), "admin", adminAddr(d.admin), "health", d.healthAddr,
		"http", d.httpAddr, "store", storeName(d.cfg), "version", version())
	select {
	case <-ctx.Done():
		d.log.InfoContext(ctx, "ledgerd draining", "timeout", d.cfg.drainTimeout.String())
		return nil
	case err := <-served:
		return err
	case err := <-storeDone:
		return err
	}
}

// drain reports NOT_SERVING, tells Streams to end once their calls are
// answered (their clients reopen them on another instance), and stops
// HTTP and gRPC gracefully; past --drain-timeout it cuts the calls left.
func (d *daemon) drain(ctx context.Context) {
	d.health.Shutdown()
	d.ledgerSrv.Drain()
	// Serve returns as soon as GracefulStop begins; the drain is over only
	// when GracefulStop returns.
	drained := make(chan struct{})
	go func() {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.drainTimeout)
		defer cancel()
		stopHTTP(hctx, d.http)
		d.http = nil
		d.grpc.GracefulStop()
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(d.cfg.drainTimeout):
		d.log.WarnContext(ctx, "drain timed out: cutting the calls left")
		d.grpc.Stop()
		<-drained
	}
}

// unaryInterceptors are ledgerd's interceptors, outermost first: metrics,
// a summary of refused credentials, logging of every finished call (once,
// with the cause callers are not told), and recovery from panics, which
// are logged with their stack and answered INTERNAL.
func unaryInterceptors(log *slog.Logger, metrics *grpcprom.ServerMetrics) []grpc.UnaryServerInterceptor {
	refused := newRefusals(log)
	return []grpc.UnaryServerInterceptor{
		metrics.UnaryServerInterceptor(),
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			res, err := next(ctx, req)
			refused.note(ctx, err)
			return res, err
		},
		logging.UnaryServerInterceptor(slogAdapter(log), logOptions...),
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandlerContext(recovered(log))),
		answerInTime,
	}
}

// answerInTime runs a call with its deadline brought forward by a margin
// (a quarter of the time left, at most 250 ms), so that a store that does not
// answer (a database cut off, a path that drops every packet) ends the
// call with ledgerd's typed UPSTREAM_TIMEOUT, which reaches the caller
// before its own deadline, instead of the caller's untyped
// DEADLINE_EXCEEDED.
func answerInTime(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	d, ok := ctx.Deadline()
	if !ok {
		return next(ctx, req)
	}
	ctx, cancel := context.WithDeadline(ctx, d.Add(-min(time.Until(d)/4, 250*time.Millisecond)))
	defer cancel()
	return next(ctx, req)
}

// streamInterceptors are the same for streams (LedgerService.Stream): a
// stream is counted and logged once, when it ends; each call on it is
// counted by the decision counters and answered like a unary call.
func streamInterceptors(log *slog.Logger, metrics *grpcprom.ServerMetrics) []grpc.StreamServerInterceptor {
	refused := newRefusals(log)
	return []grpc.StreamServerInterceptor{
		metrics.StreamServerInterceptor(),
		func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			err := next(srv, ss)
			refused.note(ss.Context(), err)
			return err
		},
		logging.StreamServerInterceptor(slogAdapter(log), logOptions...),
		recovery.StreamServerInterceptor(recovery.WithRecoveryHandlerContext(recovered(log))),
	}
}

var logOptions = []logging.Option{
	logging.WithLogOnEvents(logging.FinishCall),
	logging.WithLevels(codeToLevel),
	logging.WithErrorFields(func(err error) logging.Fields {
		if cause := server.Cause(err); cause != nil {
			return logging.Fields{"error.cause", cause.Error()}
		}
		return nil
	}),
}

// refusals turns calls refused for their credentials into one INFO line a
// minute at most, with their count: each one is logged at debug only, so
// that a scanner or a misconfigured client does not flood the log.
type refusals struct {
	log  *slog.Logger
	mu   sync.Mutex
	n    int
	next time.Time // the next summary is due then
}

func newRefusals(log *slog.Logger) *refusals { return &refusals{log: log} }

func (r *refusals) note(ctx context.Context, err error) {
	if status.Code(err) != codes.Unauthenticated {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if now := time.Now(); !now.Before(r.next) {
		r.log.InfoContext(ctx, "calls refused for their credentials", "count", r.n, "error", err.Error())
		r.n, r.next = 0, now.Add(time.Minute)
	}
}

// recovered logs a panic with its stack and answers INTERNAL.
func recovered(log *slog.Logger) recovery.RecoveryHandlerFuncContext {
	return func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in a handler", "panic", p, "stack", string(debug.Stack()))
		return ledgerstatus.Err(errcode.Errorf(errcode.Internal, "internal error"))
	}
}

// watchHealth reports SERVING while the store takes a write (the canary),
// checked at once and then every few seconds, and NOT_SERVING otherwise:
// a store that reads but cannot write (a full disk, a read-only database)
// is not ready. While the store refuses writes the checks back off, from
// half a second to the serving pace, so that an idle ledgerd costs a
// failing database a write every few seconds, not a loop of them.
func watchHealth(ctx context.Context, st *lateStore, h *health.Server, log *slog.Logger) {
	const servingPause, firstRetry = 5 * time.Second, 500 * time.Millisecond
	serving := false
	canary := newCanary()
	retry := firstRetry
	opened := st.opened // wakes the watch once, when the store opens
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.Ping(pctx)
		if err == nil {
			err = st.canaryWrite(pctx, canary)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		status := healthpb.HealthCheckResponse_SERVING
		if err != nil {
			status = healthpb.HealthCheckResponse_NOT_SERVING
		}
		if (err == nil) != serving {
			serving = err == nil
			h.SetServingStatus("", status)
			h.SetServingStatus(ledgerv1.LedgerService_ServiceDesc.ServiceName, status)
			if err != nil {
				log.WarnContext(ctx, "store not answering: NOT_SERVING", "error", err)
			} else {
				log.InfoContext(ctx, "store answering: SERVING")
			}
		}
		pause := servingPause
		if serving {
			retry = firstRetry
		} else {
			pause, retry = retry, min(2*retry, servingPause)
		}
		select {
		case <-ctx.Done():
			return
		case <-opened:
			opened = nil // closed for good: waiting on it again would not wait
		case <-time.After(pause):
		}
	}
}

// startAdmin serves /metrics, /healthz (the process is up, and its store
// needs no restart: mustRestart), /readyz (the store answers) and the
// operator's console (/console/) over HTTP, or HTTPS with tc.
func startAdmin(addr string, tc *tls.Config, reg *prometheus.Registry, h *health.Server, mustRestart func(context.Context) error, con *console.Console, log *slog.Logger) (*http.Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle(console.Prefix, con)
	// The profiles show what the process holds: admin principals only.
	mux.Handle("/debug/pprof/", con.AdminOnly(http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/cmdline", con.AdminOnly(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("/debug/pprof/profile", con.AdminOnly(http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", con.AdminOnly(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", con.AdminOnly(http.HandlerFunc(pprof.Trace)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := mustRestart(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		res, err := h.Check(r.Context(), &healthpb.HealthCheckRequest{})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	srv.Addr = lis.Addr().String()
	serve := func() error { return srv.Serve(lis) }
	if tc != nil {
		srv.TLSConfig = tc
		serve = func() error { return srv.ServeTLS(lis, "", "") }
	}
	go func() {
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server failed", "error", err)
		}
	}()
	return srv, nil
}

// ready is nil while ledgerd serves (its store takes writes).
func (d *daemon) ready(ctx context.Context) error {
	res, err := d.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errors.New("NOT_SERVING: the store does not take writes")
	}
	return nil
}

func adminAddr(s *http.Server) string {
	if s == nil {
		return ""
	}
	return s.Addr
}

func storeName(cfg config) string {
	if cfg.databaseURL != "" {
		return "sql"
	}
	return "embedded:" + cfg.dataDir
}

func newLogger(cfg config, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	if cfg.logFormat == "text" {
		return slog.New(traceHandler{slog.NewTextHandler(w, opts)}), nil
	}
	return slog.New(traceHandler{slog.NewJSONHandler(w, opts)}), nil
}

// slogAdapter lets the go-grpc-middleware logging interceptor write to slog.
func slogAdapter(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// codeToLevel keeps the ledger's everyday answers (replays, IN_PROGRESS,
// KEY_REUSED, NOT_FOUND) at debug, callers' mistakes at info, and the
// ledger's own failures at warn and error.
func codeToLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.NotFound, codes.Aborted, codes.FailedPrecondition, codes.Canceled:
		return logging.LevelDebug
	case codes.Unauthenticated:
		return logging.LevelDebug // summarized by refusals
	case codes.InvalidArgument, codes.PermissionDenied, codes.ResourceExhausted:
		return logging.LevelInfo
	case codes.Unavailable, codes.DeadlineExceeded:
		return logging.LevelWarn
	}
	return logging.LevelError
}

// version is ledgerd's build, as --version prints it.
func version() string { return buildinfo.Read().String() }

// databaseJob applies the schema migrations (--migrate-only), then the
// homes file (--apply-homes), or prints what the homes file would run
// (--print-homes-sql), and returns: ledgerd as a Job.
func databaseJob(ctx context.Context, cfg config, stdout io.Writer, log *slog.Logger) error {
	homes := cfg.homes
	s, err := crdb.Open(ctx, cfg.databaseURL, crdb.Config{})
	if err != nil {
		return err
	}
	defer s.Close()
	if cfg.migrateOnly {
		applied, err := s.Migrate(ctx)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "schema migrated", "applied", applied, "dialect", s.Dialect().String())
	}
	if cfg.printHomesSQL {
		stmts, err := s.ApplyHomes(ctx, homes, true)
		for _, stmt := range stmts {
			fmt.Fprintln(stdout, stmt+";")
		}
		return err
	}
	if cfg.applyHomes {
		stmts, err := s.ApplyHomes(ctx, homes, false)
		for _, stmt := range stmts {
			log.InfoContext(ctx, "homes: ran", "statement", stmt)
		}
		if err != nil {
			return err
		}
		gen, _, err := s.AppliedHomes(ctx, homes)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "homes applied", "generation", gen, "statements", len(stmts), "file", cfg.homesFile)
	}
	return nil
}

// buildInfoGauge is idemledger_build_info{version, revision, goversion}, 1:
// which build a process runs, for dashboards and alerts across a rollout.
func buildInfoGauge() prometheus.Collector {
	bi := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idemledger", Name: "build_info",
		Help:        "The build of this process: its version, VCS revision and Go version, as labels; always 1.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion}})
	g.Set(1)
	return g
}
