// Command ledgerd serves the idempotency ledger (idemledger.v1.LedgerService)
// over gRPC. It only wires: flags and LEDGER_* environment, the store
// (embedded Pebble by default, PostgreSQL or CockroachDB with
// --database-url), credentials, interceptors, health, reflection, metrics,
// the expiry sweeper and a graceful stop. See the README for every flag.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/grpclog"

	"github.com/idemledger/idemledger/internal/buildinfo"
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

// version is ledgerd's build, as --version prints it.
func version() string { return buildinfo.Read().String() }
