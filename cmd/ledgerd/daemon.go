package main

// The daemon: ledgerd's servers over its store, how they start, serve,
// drain and stop.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"sync"
	"syscall"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/procs"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/server"
)

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

// A client connection that sends nothing for pingAfter is pinged, on both
// listeners, and closed when the ping is not answered within pingTimeout:
// a client lost without a reset (its node powered off) holds its
// connection, its Streams and their waiting Lookups that long, not until
// TCP gives up, and a connection held open by a Stream is not idle, so
// --max-connections could not shed it.
const (
	pingAfter   = 30 * time.Second
	pingTimeout = 10 * time.Second
)

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
			Time:                  pingAfter,
			Timeout:               pingTimeout,
		}),
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
	if d.cfg.procs == "auto" {
		wg.Go(func() { procs.Size(bg, d.log, d.store.holds) })
	}
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

// ready is nil while ledgerd serves (its store takes writes).
func (d *daemon) ready(ctx context.Context) error {
	res, err := d.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return errors.New("NOT_SERVING: the store does not take writes")
	}
	return nil
}

func storeName(cfg config) string {
	if cfg.databaseURL != "" {
		return "sql"
	}
	return "embedded:" + cfg.dataDir
}
