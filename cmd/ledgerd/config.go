package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// config is every setting of ledgerd. Each flag --some-name can also be set
// by the environment variable LEDGER_SOME_NAME; a flag on the command line
// wins over the environment.
type config struct {
	listen       string
	adminListen  string
	healthListen string
	httpListen   string
	// censusInterval is how often the records are counted by state.
	censusInterval time.Duration
	dataDir        string
	backupDir      string
	databaseURL    string
	migrate        bool
	job            string // the one-shot database job a subcommand names: "migrate", "homes apply", "homes print"; "" serves
	sqlBatching    bool
	homesFile      string
	homes          *crdb.Homes // read from homesFile by parseConfig
	region         string
	followerReads  time.Duration

	tokensFile string
	certsFile  string
	tlsCert    string
	tlsKey     string
	clientCA   string
	adminTLS   bool

	ledger ledger.Config

	rateLimit      float64
	rateBurst      int
	maxRecvBytes   int
	maxConnections int
	drainTimeout   time.Duration
	streamMaxAge   time.Duration
	sweepInterval  time.Duration
	sweepShare     float64
	procs          string
	logLevel       string
	logFormat      string
	auditFile      string
	version        bool
	reflection     bool
}

// The subcommands: one-shot database jobs that run and exit (a
// Kubernetes Job); without one ledgerd serves.
const jobsUsage = `Usage:
  ledgerd [flags]                     serve
  ledgerd migrate [flags]             apply the SQL schema migrations (--database-url) and exit
  ledgerd homes apply [flags]         render the homes file (--homes) into the database (regions, survival goal,
                                      the tenants' home column) and exit; with --migrate, the migrations first;
                                      as a SQL user allowed to alter the database
  ledgerd homes print [flags]         print the statements homes apply would run, and exit

Flags:
`

// jobOf splits a subcommand off args.
func jobOf(args []string) (job string, rest []string, err error) {
	switch {
	case len(args) > 0 && args[0] == "migrate":
		return "migrate", args[1:], nil
	case len(args) > 1 && args[0] == "homes" && (args[1] == "apply" || args[1] == "print"):
		return "homes " + args[1], args[2:], nil
	case len(args) > 0 && args[0] == "homes":
		return "", nil, errors.New("homes takes apply or print: ledgerd homes apply|print --homes FILE --database-url URL")
	}
	return "", args, nil
}

// parseConfig reads the subcommand, the flags and the LEDGER_*
// environment. Errors are usage errors.
func parseConfig(args []string, stderr io.Writer) (config, error) {
	var c config
	var err error
	if c.job, args, err = jobOf(args); err != nil {
		return c, err
	}
	fs := flag.NewFlagSet("ledgerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, jobsUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7070", "gRPC address")
	fs.StringVar(&c.adminListen, "admin-listen", "127.0.0.1:7071", "HTTP address of /metrics, /healthz and /readyz; empty turns it off")
	fs.StringVar(&c.httpListen, "http-listen", "127.0.0.1:7072", "HTTP address serving LedgerService over the Connect protocol (JSON POSTs), gRPC-Web and gRPC; empty turns it off")
	fs.StringVar(&c.healthListen, "health-listen", "", "plaintext gRPC address serving only grpc.health.v1, for kubelet probes when --listen uses TLS; empty turns it off")
	fs.StringVar(&c.dataDir, "data-dir", "ledgerd-data", "directory of the embedded store, used when --database-url is empty")
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL or CockroachDB URL; empty uses the embedded store in --data-dir")
	fs.StringVar(&c.backupDir, "backup-dir", "", "where AdminService.Backup (idemctl backup) writes online backups of the embedded store, each a data directory; empty: none")
	fs.BoolVar(&c.migrate, "migrate", false, "apply the SQL schema migrations at start (with --database-url; ledgerd migrate is the migration job)")
	fs.BoolVar(&c.sqlBatching, "sql-batching", true, "coalesce concurrent Begins and Completes into multi-row statements (with --database-url)")
	fs.StringVar(&c.homesFile, "homes", "", "the platform's homes file: the database's regions and each tenant's home region (with --database-url; docs/multi-region.md)")
	fs.StringVar(&c.region, "region", "", "the region this ledgerd runs in, one of the homes file's (with --homes)")
	fs.DurationVar(&c.followerReads, "follower-reads", 0, "answer replays of completed records of tenants homed outside --region from the nearest replica, at most this stale (CockroachDB follower reads); 0 turns it off")
	fs.StringVar(&c.tokensFile, "tokens", "", "bearer token file: lines of sha256:<hex> <namespace> <tenants>")
	fs.StringVar(&c.certsFile, "certs", "", "client certificate file: lines of uri:|dns:|cn:<identity> <namespace> <tenants> (needs --client-ca)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "server certificate (PEM); with --tls-key, serve TLS")
	fs.StringVar(&c.tlsKey, "tls-key", "", "server private key (PEM)")
	fs.StringVar(&c.clientCA, "client-ca", "", "CA bundle (PEM) that client certificates must chain to")
	fs.BoolVar(&c.adminTLS, "admin-tls", false, "serve --admin-listen over TLS with --tls-cert, verifying a client certificate against --client-ca when one is given (never requiring one, so probes and scrapers without one still connect); the console then signs in an admin certificate by itself")
	fs.DurationVar(&c.ledger.DefaultLease, "lease", ledger.DefaultLease, "lease of a claim when the request sets none")
	fs.DurationVar(&c.ledger.MaxLease, "max-lease", ledger.DefaultMaxLease, "longest lease a request may ask")
	fs.DurationVar(&c.ledger.DefaultRetention, "retention", ledger.DefaultRetention, "retention of a record when the request sets none")
	fs.DurationVar(&c.ledger.MaxRetention, "max-retention", ledger.DefaultMaxRetention, "longest retention a request may ask")
	fs.DurationVar(&c.ledger.DefaultTombstoneRetention, "tombstone-retention", ledger.DefaultTombstoneRetention, "how long a completed record stays a tombstone after its retention, when the request sets none; 0 turns tombstones off")
	fs.DurationVar(&c.ledger.MaxTombstoneRetention, "max-tombstone-retention", ledger.DefaultMaxTombstone, "longest tombstone retention a request may ask")
	fs.IntVar(&c.ledger.MaxOutcomeBytes, "max-outcome-bytes", ledger.DefaultMaxOutcomeBytes, "largest stored outcome")
	fs.IntVar(&c.ledger.MaxWaiters, "max-waiters", ledger.DefaultMaxWaiters, "Lookups with a wait one namespace may have waiting at once; past it, RATE_LIMITED")
	fs.IntVar(&c.ledger.MaxWaitersTotal, "max-waiters-total", ledger.DefaultMaxWaitersTotal, "Lookups with a wait every namespace together may have waiting at once; past it, RATE_LIMITED")
	fs.DurationVar(&c.ledger.StoreTimeout, "store-timeout", ledger.DefaultStoreTimeout, "bound on every store call, whatever the caller's deadline; SQL sessions get it as statement_timeout and half of it as lock_timeout")
	fs.Float64Var(&c.rateLimit, "rate-limit", 0, "calls a second per namespace (token bucket); 0 turns the limit off")
	fs.IntVar(&c.rateBurst, "rate-burst", 0, "burst of the rate limit; 0 means one second's worth")
	fs.IntVar(&c.maxRecvBytes, "max-recv-bytes", 0, "largest request message; 0 means four times --max-outcome-bytes plus 64 KiB, so that outcomes up to four times the limit are refused typed (OUTCOME_TOO_LARGE)")
	fs.IntVar(&c.maxConnections, "max-connections", 10000, "connections served at once on --listen, and on --http-listen; at the bound a new one takes the place of the connection idle longest (no call in flight, nothing read for 1 s), or waits")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "how long SIGTERM waits for in-flight calls before it cuts them")
	fs.DurationVar(&c.streamMaxAge, "stream-max-age", 5*time.Minute, "age at which a Stream is drained, so that its client moves to a new one (and, after GOAWAY, to a new connection)")
	fs.DurationVar(&c.censusInterval, "census-interval", 5*time.Minute, "how often idemledger_records{state} counts the records (a read of every record); 0 turns it off")
	fs.DurationVar(&c.sweepInterval, "sweep-interval", time.Minute, "pause between sweeps of expired records")
	fs.Float64Var(&c.sweepShare, "sweep-share", 0.25, "embedded store: the share of the time sweeps may take while a backlog of expired records lasts, above 0 and at most 1; lower keeps writes' tail shorter during a large sweep, which then takes longer")
	fs.StringVar(&c.procs, "procs", "auto", "auto: schedule goroutines on as few Ps as the load needs, up to GOMAXPROCS (Go's default: the CPU limit), and on every P while the embedded store sweeps, flushes or compacts; max: on GOMAXPROCS always")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or text")
	fs.StringVar(&c.auditFile, "audit-file", "", "also append the audit lines alone, as JSON, to this file (reopened on SIGHUP, for rotation); empty: the log only")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	fs.BoolVar(&c.reflection, "reflection", false, "serve gRPC reflection (default: on in dev mode, off with credentials)")
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("LEDGER")); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	reflectionSet, sweepShareSet := false, false
	fs.Visit(func(f *flag.Flag) {
		reflectionSet = reflectionSet || f.Name == "reflection"
		sweepShareSet = sweepShareSet || f.Name == "sweep-share"
	})
	if sweepShareSet && c.databaseURL != "" {
		return c, errors.New("--sweep-share paces the embedded store's sweeps; a SQL store sweeps in its own batches, so it does not go with --database-url")
	}
	if !reflectionSet {
		c.reflection = c.devMode()
	}
	switch {
	case c.ledger.DefaultTombstoneRetention < 0 || c.ledger.MaxTombstoneRetention <= 0:
		return c, errors.New("--tombstone-retention must not be negative, and --max-tombstone-retention must be positive")
	case c.ledger.DefaultTombstoneRetention > c.ledger.MaxTombstoneRetention:
		return c, errors.New("--tombstone-retention is longer than --max-tombstone-retention")
	case c.ledger.DefaultTombstoneRetention == 0:
		c.ledger.DefaultTombstoneRetention = -1 // ledger.Config: negative turns tombstones off
	}
	if c.maxRecvBytes == 0 {
		// Room for an outcome four times the limit, so that the ledger,
		// not gRPC's untyped RESOURCE_EXHAUSTED, refuses a reasonable
		// outcome that is too large: typed OUTCOME_TOO_LARGE.
		c.maxRecvBytes = 4*c.ledger.MaxOutcomeBytes + 64<<10
	}
	if c.rateBurst == 0 {
		c.rateBurst = max(int(c.rateLimit), 1)
	}
	if err := c.check(); err != nil {
		return c, err
	}
	if c.homesFile != "" {
		// A file that does not parse, or a region it does not declare, is
		// the operator's mistake: refused at once, not retried as a store
		// that is not there yet.
		h, err := crdb.LoadHomes(c.homesFile)
		if err != nil {
			return c, err
		}
		if c.region != "" && !slices.Contains(h.Regions(), c.region) {
			return c, fmt.Errorf("--region %q is not one of the regions of %s: %v", c.region, c.homesFile, h.Regions())
		}
		c.homes = h
	}
	return c, nil
}

func (c config) check() error {
	switch {
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return errors.New("--tls-cert and --tls-key go together")
	case c.adminTLS && c.tlsCert == "":
		return errors.New("--admin-tls needs --tls-cert and --tls-key")
	case c.clientCA != "" && c.tlsCert == "":
		return errors.New("--client-ca needs --tls-cert and --tls-key")
	case c.certsFile != "" && c.clientCA == "":
		return errors.New("--certs needs --client-ca")
	case c.clientCA != "" && c.certsFile == "":
		return errors.New("--client-ca needs --certs, the table of certificate principals")
	case (c.migrate || c.job != "") && c.databaseURL == "":
		return errors.New("--migrate, ledgerd migrate and ledgerd homes need --database-url")
	case (c.homesFile != "" || c.followerReads != 0) && c.databaseURL == "":
		return errors.New("--homes and --follower-reads need --database-url: the embedded store has one region")
	case strings.HasPrefix(c.job, "homes ") && c.homesFile == "":
		return errors.New("ledgerd homes apply and homes print need --homes")
	case c.region != "" && c.homesFile == "":
		return errors.New("--region needs --homes")
	case c.followerReads < 0:
		return errors.New("--follower-reads must not be negative")
	case c.maxRecvBytes < c.ledger.MaxOutcomeBytes:
		return errors.New("--max-recv-bytes is smaller than --max-outcome-bytes")
	case c.maxRecvBytes < ledgerclient.MaxStreamedBytes+4<<10:
		return fmt.Errorf("--max-recv-bytes must be at least %d: clients send calls of up to %d bytes on a Stream", ledgerclient.MaxStreamedBytes+4<<10, ledgerclient.MaxStreamedBytes)
	case c.maxConnections <= 0:
		return errors.New("--max-connections must be positive")
	case c.ledger.StoreTimeout <= 0:
		return errors.New("--store-timeout must be positive")
	case c.streamMaxAge <= 0:
		return errors.New("--stream-max-age must be positive")
	case c.rateLimit < 0, c.drainTimeout < 0, c.sweepInterval <= 0, c.censusInterval < 0:
		return errors.New("--rate-limit, --drain-timeout, --census-interval and --sweep-interval must not be negative")
	case !(c.sweepShare > 0 && c.sweepShare <= 1): // NaN too
		return errors.New("--sweep-share must be above 0 and at most 1")
	case c.logFormat != "json" && c.logFormat != "text":
		return errors.New("--log-format is json or text")
	case c.procs != "auto" && c.procs != "max":
		return errors.New("--procs is auto or max")
	}
	if c.devMode() && !c.oneShot() {
		for _, l := range []struct{ flag, addr string }{{"--listen", c.listen}, {"--admin-listen", c.adminListen}, {"--health-listen", c.healthListen}, {"--http-listen", c.httpListen}} {
			if l.addr != "" && !loopback(l.addr) {
				return fmt.Errorf("no --tokens or --certs: dev mode accepts every caller and listens on loopback only, not %s %q", l.flag, l.addr)
			}
		}
	}
	return nil
}

// oneShot: ledgerd runs a database job (migrations, homes) and exits.
func (c config) oneShot() bool { return c.job != "" }

// devMode: no credentials are configured, so every caller is the principal
// "dev" with every tenant.
func (c config) devMode() bool { return c.tokensFile == "" && c.certsFile == "" }

// loopback reports whether addr binds to the loopback interface only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
