// Command idemproxy puts the idempotency guard in front of a server
// written in any language, in one of two modes:
//
//   - MCP: it serves Streamable HTTP, guards the tools/call of the tools
//     its configuration names, and passes everything else to the upstream
//     MCP server (Streamable HTTP, or a stdio child process). A guarded
//     call reaches the upstream with its claim in
//     _meta["io.idemledger/claim"] = {token, attempt}.
//   - HTTP: a reverse proxy that protects the routes its configuration
//     names with the Idempotency-Key middleware. A protected request
//     reaches the upstream with its claim in the Idempotency-Token and
//     Idempotency-Attempt headers.
//
// An upstream that can fence its own writes with the token may do so.
//
//	idemproxy --config idemproxy.yaml [--listen 127.0.0.1:8091] [--admin-listen 127.0.0.1:8092]
//
// or, as the MCP server a host runs over stdio (the MCP mode only; no
// listener, and no admin listener unless --admin-listen names one):
//
//	idemproxy --config idemproxy.yaml --stdio
//
// Every flag may be set by its environment variable instead: IDEMPROXY_
// and the flag's name in capitals, - as _ (IDEMPROXY_LEDGER_CA).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/peterbourgon/ff/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/internal/bufpool"
	"github.com/idemledger/idemledger/internal/buildinfo"
	"github.com/idemledger/idemledger/internal/clienttls"
	"github.com/idemledger/idemledger/internal/procs"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// flags are the command line. Each may also be set by its environment
// variable, IDEMPROXY_ and its name in capitals with _ for -
// (IDEMPROXY_ADMIN_LISTEN); a flag on the command line wins.
type flags struct {
	config, listen, adminListen, ledger string
	ledgerTokenFile                     string
	ledgerTLS                           bool
	ledgerCA, ledgerCert, ledgerKey     string
	ledgerServerName                    string
	drainTimeout                        time.Duration
	logLevel, logFormat                 string
	procs                               string
	version, stdio                      bool
}

func parseFlags(args []string, stderr io.Writer) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("idemproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "idemproxy.yaml", "the configuration file: the ledger, the upstream, the tools to guard")
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8091", "the proxy's address (in MCP mode the endpoint is /mcp)")
	fs.StringVar(&f.adminListen, "admin-listen", "127.0.0.1:8092", "HTTP address of /metrics, /healthz and /readyz; empty turns it off")
	fs.StringVar(&f.ledger, "ledger", "", "ledgerd's gRPC address (overrides the file's ledger.address)")
	fs.StringVar(&f.ledgerTokenFile, "ledger-token-file", "", "a file holding the namespace's bearer token for ledgerd (overrides ledger.token_file)")
	fs.BoolVar(&f.ledgerTLS, "ledger-tls", false, "connect to ledgerd with TLS (ledger.tls.enabled; on when any of the files below is given)")
	fs.StringVar(&f.ledgerCA, "ledger-ca", "", "CA bundle (PEM) that ledgerd's certificate chains to (ledger.tls.ca_file; default: the system's)")
	fs.StringVar(&f.ledgerCert, "ledger-cert", "", "client certificate (PEM) for mutual TLS with ledgerd (ledger.tls.cert_file)")
	fs.StringVar(&f.ledgerKey, "ledger-key", "", "the client certificate's private key (PEM) (ledger.tls.key_file)")
	fs.StringVar(&f.ledgerServerName, "ledger-server-name", "", "the name ledgerd's certificate must carry (ledger.tls.server_name; default: from the address)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "how long SIGTERM waits for calls in flight")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&f.procs, "procs", "auto", "auto: over HTTP, schedule goroutines on as few Ps as the load needs, up to GOMAXPROCS (Go's default: the CPU limit); with --stdio, on one P unless GOMAXPROCS is set; max: on GOMAXPROCS always")
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	fs.BoolVar(&f.stdio, "stdio", false, "serve MCP on stdin and stdout, as the server a host runs, instead of on --listen")
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("IDEMPROXY")); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		return f, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	// A host may run many proxies over stdio: none takes the admin
	// port unless it is named.
	named := false
	fs.Visit(func(fl *flag.Flag) { named = named || fl.Name == "admin-listen" })
	if f.stdio && !named {
		f.adminListen = ""
	}
	return f, nil
}

// apply puts the flags that override the file into cfg.
func (f flags) apply(cfg *fileConfig) {
	t := &cfg.Ledger.TLS
	for _, o := range []struct {
		flag string
		file *string
	}{
		{f.ledger, &cfg.Ledger.Address}, {f.ledgerTokenFile, &cfg.Ledger.TokenFile},
		{f.ledgerCA, &t.CAFile}, {f.ledgerCert, &t.CertFile}, {f.ledgerKey, &t.KeyFile}, {f.ledgerServerName, &t.ServerName},
	} {
		if o.flag != "" {
			*o.file = o.flag
		}
	}
	t.Enabled = t.Enabled || f.ledgerTLS
	if cfg.Ledger.Address == "" {
		cfg.Ledger.Address = "127.0.0.1:7070"
	}
}

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

// cli runs the command and returns its exit code: 2 for a usage error.
func cli(args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if err != nil {
		return 2
	}
	if f.version {
		_, _ = fmt.Fprintln(stdout, "idemproxy", buildinfo.Read().String())
		return 0
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		_, _ = fmt.Fprintln(stderr, "idemproxy: --log-level:", err)
		return 2
	}
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	switch f.logFormat {
	case "json":
		log = slog.New(slog.NewJSONHandler(stderr, opts))
	case "text":
		log = slog.New(slog.NewTextHandler(stderr, opts))
	default:
		_, _ = fmt.Fprintf(stderr, "idemproxy: --log-format is json or text, not %q\n", f.logFormat)
		return 2
	}
	cfg, err := loadConfig(f.config)
	if err == nil && f.stdio {
		err = cfg.checkStdio()
	}
	if err != nil {
		_, _ = fmt.Fprintln(stderr, "idemproxy:", err)
		return 2
	}
	f.apply(&cfg)
	if f.procs != "auto" && f.procs != "max" {
		_, _ = fmt.Fprintf(stderr, "idemproxy: --procs is auto or max, not %q\n", f.procs)
		return 2
	}
	if f.stdio && f.procs == "auto" && os.Getenv("GOMAXPROCS") == "" {
		// Over stdio the proxy serves one host, a call or a few at a
		// time: on one P a hand-off between its goroutines is a switch on
		// the thread running, not a wake-up of another, which on a host
		// running many servers is a fifth to a quarter of its CPU a call
		// (docs/performance.md). GOMAXPROCS, when set, decides.
		runtime.GOMAXPROCS(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if !f.stdio && f.procs == "auto" {
		// Over HTTP the proxy serves every client: as few Ps as its load
		// needs (docs/mcp.md).
		sizing, endSizing := context.WithCancel(ctx)
		var sized sync.WaitGroup
		sized.Go(func() { procs.Size(sizing, log, nil) })
		defer func() { endSizing(); sized.Wait() }()
	}
	in, restore := os.Stdin, func() {}
	if f.stdio {
		in, restore = hostInput()
	}
	defer restore()
	if err := run(ctx, f, cfg, &listeners{in: in, out: stdout}, log); err != nil {
		log.Error("idemproxy stopped", "error", err)
		return 1
	}
	return 0
}

// listeners are the proxy's listeners, for tests; nil ones are opened
// from the flags. With --stdio the proxy serves in and out instead of
// front.
type listeners struct {
	front, admin net.Listener
	in           io.Reader
	out          io.Writer
}

// run serves until ctx ends (or, with --stdio, stdin does), then drains.
func run(ctx context.Context, f flags, cfg fileConfig, lis *listeners, log *slog.Logger) error {
	if lis == nil {
		lis = &listeners{}
	}
	if f.stdio {
		if err := cfg.checkStdio(); err != nil {
			return err
		}
	}
	var err error
	if lis.front == nil && !f.stdio {
		if lis.front, err = net.Listen("tcp", f.listen); err != nil {
			return err
		}
	}
	if lis.admin == nil && f.adminListen != "" {
		if lis.admin, err = net.Listen("tcp", f.adminListen); err != nil {
			return err
		}
	}
	conn, ledger, err := dialLedger(cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer ledger.Close()

	reg := prometheus.NewRegistry()
	bi := buildinfo.Read()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{Name: "idemproxy_build_info",
		Help:        "The build of this process: its version, VCS revision and Go version, as labels; always 1.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion}})
	buildInfo.Set(1)
	reg.MustRegister(buildInfo)
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := newMetrics(reg)

	var draining atomic.Bool
	drainCtx, startDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer startDrain()
	var handler http.Handler
	var ping func(context.Context) error
	mode := "http"
	if cfg.HTTP != nil {
		if handler, err = httpHandler(cfg.HTTP, ledger, reg, log); err != nil { //nolint:contextcheck // its handlers run on their requests' contexts
			return err
		}
	} else {
		mode = "mcp"
		var up *upstream
		var stop func()
		if handler, up, stop, err = mcpHandler(cfg.MCP, f.stdio, ledger, m, log); err != nil {
			return err
		}
		defer stop()
		defer up.close()
		ping = up.ping
		handler = untilDrain(drainCtx, handler)
	}
	admin := &http.Server{Handler: adminMux(reg, &draining, ping, conn), ReadHeaderTimeout: 10 * time.Second}
	if f.stdio {
		return serveAdminWith(admin, lis.admin, func() error {
			log.InfoContext(ctx, "idemproxy serving stdio", "admin", adminAddr(lis.admin),
				"ledger", cfg.Ledger.Address, "upstream", upstreamName(cfg), "procs", runtime.GOMAXPROCS(0))
			return serveStdio(ctx, handler, lis.in, lis.out, cmp.Or(cfg.MCP.MaxResultBytes, defaultMaxResultBytes), f.drainTimeout, log)
		})
	}
	fresh := &freshConns{}
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, ConnState: fresh.track}
	// Shutdown waits up to 5 s for a connection that was dialed and never
	// sent a request (a client's spare); it has nothing to finish, so the
	// drain closes it at once.
	hs.RegisterOnShutdown(fresh.close)

	errc := make(chan error, 2)
	go func() { errc <- serve(hs, lis.front) }()
	if lis.admin != nil {
		go func() { errc <- serve(admin, lis.admin) }()
	}
	endpoint := "http://" + lis.front.Addr().String()
	if mode == "mcp" {
		endpoint += "/mcp"
	}
	log.InfoContext(ctx, "idemproxy listening", "mode", mode, "endpoint", endpoint, "admin", adminAddr(lis.admin),
		"ledger", cfg.Ledger.Address, "upstream", upstreamName(cfg), "procs", runtime.GOMAXPROCS(0))
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	// Drain: not ready, stop taking calls, end the clients' listening
	// streams, let the calls in flight finish.
	draining.Store(true)
	startDrain()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.drainTimeout)
	defer cancel()
	log.InfoContext(sctx, "draining", "timeout", f.drainTimeout.String())
	err = hs.Shutdown(sctx)
	_ = admin.Shutdown(sctx)
	if err != nil {
		return fmt.Errorf("drain: %w", err)
	}
	log.InfoContext(sctx, "stopped")
	return nil
}

// untilDrain ends the GET requests (a client's stream that listens for
// server messages, open for as long as the client likes) when drain ends;
// calls (POST) run to their end.
func untilDrain(drain context.Context, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			ctx, cancel := context.WithCancel(r.Context())
			defer cancel()
			stop := context.AfterFunc(drain, cancel)
			defer stop()
			r = r.WithContext(ctx) //nolint:contextcheck // the request's own context, ended early by drain
		}
		h.ServeHTTP(w, r)
	})
}

// serveAdminWith runs serve, with the admin server on lis when there is
// one, and ends the admin server when serve returns.
func serveAdminWith(admin *http.Server, lis net.Listener, serve func() error) error {
	if lis != nil {
		go func() { _ = admin.Serve(lis) }()
		defer admin.Close()
	}
	return serve()
}

func serve(hs *http.Server, lis net.Listener) error {
	if err := hs.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// dialLedger connects to ledgerd, carrying the token on a Stream.
func dialLedger(cfg fileConfig) (*grpc.ClientConn, *ledgerclient.Client, error) {
	var opts []ledgerclient.Option
	if cfg.Ledger.TokenFile != "" {
		b, err := os.ReadFile(cfg.Ledger.TokenFile)
		if err != nil {
			return nil, nil, fmt.Errorf("ledger token: %w", err)
		}
		opts = append(opts, ledgerclient.WithMetadata(metadata.Pairs("authorization", "Bearer "+strings.TrimSpace(string(b)))))
	}
	creds := insecure.NewCredentials()
	if t := cfg.Ledger.TLS; t.on() {
		tc, err := clienttls.Config(clienttls.Options{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName})
		if err != nil {
			return nil, nil, fmt.Errorf("ledger TLS: %w", err)
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(cfg.Ledger.Address, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(creds))...)
	if err != nil {
		return nil, nil, err
	}
	return conn, ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn), opts...), nil
}

// adminMux serves /metrics, /healthz (the process is up) and /readyz
// (not draining, the upstream answers a ping, the ledger's connection is
// not failing).
func adminMux(reg *prometheus.Registry, draining *atomic.Bool, ping func(context.Context) error, conn *grpc.ClientConn) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		why := ""
		switch {
		case draining.Load():
			why = "draining"
		case conn.GetState() == connectivity.TransientFailure || conn.GetState() == connectivity.Shutdown:
			why = "the ledger cannot be reached"
		case ping != nil:
			if err := ping(ctx); err != nil {
				why = "the upstream does not answer: " + err.Error()
			}
		}
		if why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ready\n")
	})
	return mux
}

func upstreamName(cfg fileConfig) string {
	switch {
	case cfg.HTTP != nil:
		return cfg.HTTP.Upstream
	case cfg.MCP.Upstream.URL != "":
		return cfg.MCP.Upstream.URL
	}
	return strings.Join(cfg.MCP.Upstream.Command, " ")
}

func adminAddr(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// mcpHandler is the MCP mode: Streamable HTTP on /mcp, the named tools
// guarded, everything else passed through to the upstream MCP server
// (front.go). A stdio upstream is served as Streamable HTTP by a bridge
// first (bridge.go), which the front reaches in process. It returns the
// upstream as the readiness check sees it, and what ends the bridge.
//
// Over stdio the proxy has one client, whose session lasts as long as the
// host runs it: the bridge closes no session for being idle.
func mcpHandler(cfg *mcpConfig, stdio bool, ledger *ledgerclient.Client, m *metrics, log *slog.Logger) (http.Handler, *upstream, func(), error) {
	opts := []mcpguard.Option{mcpguard.WithTenant(cfg.Tenant.tenant()), mcpguard.WithClaimInMeta()}
	for name, t := range cfg.Tools {
		tool, err := t.tool(time.Duration(cfg.RunTimeout))
		if err != nil {
			return nil, nil, nil, err
		}
		opts = append(opts, mcpguard.WithTool(name, tool))
	}
	gd, err := guard.New(ledger, guard.WithLogger(log))
	if err != nil {
		return nil, nil, nil, err
	}
	g, err := mcpguard.New(gd, opts...)
	if err != nil {
		return nil, nil, nil, err
	}
	limit := cmp.Or(cfg.MaxResultBytes, defaultMaxResultBytes)
	endpoint, stop := cfg.Upstream.URL, func() {}
	var transport http.RoundTripper = upstreamTransport()
	if len(cfg.Upstream.HeaderFiles) > 0 {
		h, err := cfg.upstreamHeaders()
		if err != nil {
			return nil, nil, nil, err
		}
		transport = withHeaders{base: transport, header: h}
	}
	if endpoint == "" {
		idle := cmp.Or(time.Duration(cfg.Upstream.SessionIdle), defaultSessionIdle)
		if stdio {
			idle = never
		}
		b := newBridge(cfg.Upstream.Command, limit, cfg.Upstream.MaxSessions, idle, log)
		t := newHandlerTransport(b)
		endpoint, transport, stop = bridgeEndpoint, t, func() { b.closeAll(); t.Close() }
	}
	f, err := newFront(endpoint, transport, limit, cfg.Tools, g, m, log)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", f)
	return mux, &upstream{endpoint: endpoint, client: &http.Client{Transport: transport}}, stop, nil
}

// withHeaders sends header with every request, in place of the client's
// own values of those headers: mcp.upstream.header_files.
type withHeaders struct {
	base   http.RoundTripper
	header http.Header
}

func (t withHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range t.header {
		req.Header[k] = v
	}
	return t.base.RoundTrip(req)
}

// bridgeEndpoint is the stdio bridge's endpoint, which the proxy reaches
// in process: the host names nothing on the network.
const bridgeEndpoint = "http://stdio-upstream/mcp"

// maxIdleUpstream is how many idle connections the proxy keeps to its
// upstream; a proxy with more calls in flight at once dials for the rest.
// Each costs a socket and about 8 KiB of buffers, and is closed after
// DefaultTransport's 90 s without a request.
const maxIdleUpstream = 1024

// upstreamTransport is the transport of the proxy's requests to its one
// upstream: http.DefaultTransport's, keeping up to maxIdleUpstream idle
// connections to that host where DefaultTransport keeps 2 a host (made for
// a client of many hosts). With 2, a proxy serving 32 calls at once closed
// and dialed an upstream connection for most of them.
func upstreamTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = maxIdleUpstream
	t.MaxIdleConnsPerHost = maxIdleUpstream
	return t
}

// copyBuffers lends a ReverseProxy the buffers it copies bodies through,
// where it would allocate 32 KiB for each body it copies: an unguarded
// call's answer, every answer of a stream.
type copyBuffers struct{}

const copyBufferSize = 32 << 10

func (copyBuffers) Get() []byte  { return *bufpool.Pool.Get(copyBufferSize) }
func (copyBuffers) Put(b []byte) { bufpool.Pool.Put(&b) }

// version is the module version from the build info.
func version() string { return buildinfo.Read().Version }

// freshConns are the connections that have not sent a request yet.
type freshConns struct {
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (f *freshConns) track(c net.Conn, st http.ConnState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	if st == http.StateNew {
		f.conns[c] = struct{}{}
	} else {
		delete(f.conns, c)
	}
}

// close closes every connection that has sent no request.
func (f *freshConns) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		_ = c.Close()
	}
}
