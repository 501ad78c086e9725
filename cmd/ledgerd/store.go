package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/procs"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/pebble"
)

// store is what ledgerd needs of a store beyond ledger.Store: both of
// its stores (pebble and crdb) also answer a ping and sweep in Run. The
// compiler checks it (below).
type store interface {
	ledger.Store
	Ping(ctx context.Context) error
	Run(ctx context.Context, onError func(error)) error
}

var (
	_ store = (*pebble.Store)(nil)
	_ store = (*crdb.Store)(nil)
)

// lateStore is the store that ledgerd serves from before the real one is
// open: every call answers UNAVAILABLE (retryable, retry after a second)
// until openStore succeeds. So ledgerd listens at once, reports NOT_SERVING
// while the database is down at start, and serves as soon as it comes up.
type lateStore struct {
	cfg    config
	log    *slog.Logger
	s      atomic.Pointer[store]
	opened chan struct{} // closed once s is set
	// onClockStep hears of the embedded store's clock steps.
	onClockStep func(time.Duration)
	// holds holds ledgerd's Ps at the ceiling through the embedded
	// store's work in the background: its sweeps, flushes and compactions.
	holds *procs.Holds
	// onOp hears how long each store call took (op: claim, complete, …)
	// and the home region of its tenant (homes; "" without --homes, or
	// for a call of no one tenant); onOutcome the size of each outcome
	// stored. Both may be nil.
	onOp      func(op, home string, d time.Duration)
	onOutcome func(bytes int)
	homes     *crdb.Homes
}

// timed reports a store call's duration to onOp:
// defer l.timed("claim", tenant)().
func (l *lateStore) timed(op, tenant string) func() {
	if l.onOp == nil {
		return func() {}
	}
	home := ""
	if l.homes != nil && tenant != "" {
		home = l.homes.Home(tenant)
	}
	start := time.Now()
	return func() { l.onOp(op, home, time.Since(start)) }
}

// stored reports the size of an outcome the store took, which was valid:
// its encoding's length, counted without encoding it again.
func (l *lateStore) stored(o *ledger.Outcome) {
	if l.onOutcome == nil || o == nil {
		return
	}
	l.onOutcome(o.BinarySize())
}

func newLateStore(cfg config, log *slog.Logger) *lateStore {
	return &lateStore{cfg: cfg, log: log, opened: make(chan struct{}), homes: cfg.homes, holds: &procs.Holds{}}
}

var _ store = (*lateStore)(nil)

var errNotOpen = &errcode.Error{Code: errcode.Unavailable, Message: "the ledger's store is not open yet", RetryAfter: time.Second}

func (l *lateStore) get() (store, error) {
	if s := l.s.Load(); s != nil {
		return *s, nil
	}
	return nil, errNotOpen
}

// canaryWrite is the readiness canary's write on the store itself, timed
// as op "canary": its claim and release do not count among the write
// services' claims and releases.
func (l *lateStore) canaryWrite(ctx context.Context, c *canary) error {
	defer l.timed("canary", "")()
	s, err := l.get()
	if err != nil {
		return err
	}
	return c.write(ctx, s)
}

func (l *lateStore) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	defer l.timed("claim", p.Scope.Tenant)()
	s, err := l.get()
	if err != nil {
		return ledger.ClaimResult{}, err
	}
	return s.Claim(ctx, p)
}

func (l *lateStore) Complete(ctx context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	defer l.timed("complete", p.Scope.Tenant)()
	s, err := l.get()
	if err != nil {
		return ledger.Record{}, err
	}
	rec, err := s.Complete(ctx, p)
	if err == nil {
		l.stored(p.Outcome)
	}
	return rec, err
}

func (l *lateStore) Release(ctx context.Context, p ledger.ReleaseParams) error {
	defer l.timed("release", p.Scope.Tenant)()
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.Release(ctx, p)
}

func (l *lateStore) Extend(ctx context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	defer l.timed("extend", p.Scope.Tenant)()
	s, err := l.get()
	if err != nil {
		return ledger.Record{}, err
	}
	return s.Extend(ctx, p)
}

func (l *lateStore) Resolve(ctx context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	defer l.timed("resolve", p.Scope.Tenant)()
	s, err := l.get()
	if err != nil {
		return ledger.Record{}, err
	}
	rec, err := s.Resolve(ctx, p)
	if err == nil {
		l.stored(p.Outcome)
	}
	return rec, err
}

// GetMany is the store's own, so that the Lookup waiters' poller reads in
// one statement.
func (l *lateStore) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	defer l.timed("get_many", "")()
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.GetMany(ctx, scopes)
}

// List is the store's own.
func (l *lateStore) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	defer l.timed("list", "")()
	s, err := l.get()
	if err != nil {
		return ledger.ListPage{}, err
	}
	return s.List(ctx, p)
}

// Purge is the store's own.
func (l *lateStore) Purge(ctx context.Context, p ledger.PurgeParams) (ledger.PurgeResult, error) {
	defer l.timed("purge", "")()
	s, err := l.get()
	if err != nil {
		return ledger.PurgeResult{}, err
	}
	return s.Purge(ctx, p)
}

func (l *lateStore) Get(ctx context.Context, sc ledger.Scope) (ledger.Record, error) {
	defer l.timed("get", sc.Tenant)()
	s, err := l.get()
	if err != nil {
		return ledger.Record{}, err
	}
	return s.Get(ctx, sc)
}

func (l *lateStore) Ping(ctx context.Context) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.Ping(ctx)
}

// Run opens the store, retrying every second or so until it opens or ctx
// ends, serves from it, runs its expiry sweeper until ctx ends, and then
// closes it. Call it once, and end ctx only after the gRPC server drained.
// mustRestart says why the store must be opened again by a restart of
// ledgerd (ledger.ErrMustRestart: the embedded store after a failed write
// of its log), nil while it need not: /healthz, for the supervisor.
func (l *lateStore) mustRestart(ctx context.Context) error {
	s := l.s.Load()
	if s == nil {
		return nil // not open yet: it opens by itself
	}
	if err := (*s).Ping(ctx); errors.Is(err, ledger.ErrMustRestart) {
		return err
	}
	return nil
}

func (l *lateStore) Run(ctx context.Context, onError func(error)) error {
	var s store
	var closeStore func()
	for pause := 250 * time.Millisecond; ; pause = min(2*pause, 5*time.Second) {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var err error
		s, closeStore, err = openStore(octx, l.cfg, l.log, l.onClockStep, l.holds)
		cancel()
		if err == nil {
			break
		}
		if errors.Is(err, pebble.ErrRefused) {
			return err // a damaged or replaced file: waiting will not mend it
		}
		l.log.WarnContext(ctx, "the store did not open; trying again", "error", err, "in", pause.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
	}
	defer closeStore()
	l.s.Store(&s)
	close(l.opened)
	return s.Run(ctx, onError)
}

func openStore(ctx context.Context, cfg config, log *slog.Logger, onClockStep func(time.Duration), holds *procs.Holds) (store, func(), error) {
	if cfg.databaseURL == "" {
		s, err := pebble.Open(cfg.dataDir, pebble.Config{Logger: log, SweepInterval: cfg.sweepInterval, SweepShare: cfg.sweepShare,
			OnClockStep: onClockStep, OnBackground: holds.Hold})
		if err != nil {
			return nil, nil, err
		}
		if s.Created() {
			// Loud, so that a data directory on a volume that was not
			// mounted is seen: it starts empty as a new ledger would.
			log.WarnContext(ctx, "created a new embedded ledger", "data_dir", cfg.dataDir, "identity", s.Identity(), "sweep_share", s.SweepShare())
		} else {
			log.InfoContext(ctx, "opened the embedded ledger", "data_dir", cfg.dataDir, "identity", s.Identity(), "sweep_share", s.SweepShare())
		}
		return s, func() {
			if err := s.Close(); err != nil {
				log.ErrorContext(ctx, "closing the store", "error", err)
			}
		}, nil
	}
	homes := cfg.homes
	s, err := crdb.Open(ctx, cfg.databaseURL, crdb.Config{
		SweepInterval: cfg.sweepInterval, Batching: cfg.sqlBatching,
		StatementTimeout: cfg.ledger.StoreTimeout, LockTimeout: cfg.ledger.StoreTimeout / 2,
		Homes: homes, Region: cfg.region, FollowerReads: cfg.followerReads,
	})
	if err != nil {
		return nil, nil, err
	}
	if cfg.migrate {
		applied, err := s.Migrate(ctx)
		if err != nil {
			s.Close()
			return nil, nil, err
		}
		log.InfoContext(ctx, "schema migrated", "applied", applied, "dialect", s.Dialect().String())
	}
	if homes != nil {
		// A file the database has not applied only mis-groups batches
		// (the database homes the rows): say so, and serve.
		switch gen, same, err := s.AppliedHomes(ctx, homes); {
		case err != nil:
			log.WarnContext(ctx, "could not read the database's homes", "error", err)
		case !same:
			log.WarnContext(ctx, "the homes file is not the mapping the database applied: batches may mix regions until ledgerd homes apply runs", "file", cfg.homesFile, "applied_generation", gen)
		default:
			log.InfoContext(ctx, "homes", "file", cfg.homesFile, "generation", gen, "region", cfg.region)
		}
	}
	return s, s.Close, nil
}

// CountByState is the store's own.
func (l *lateStore) CountByState(ctx context.Context) (ledger.Census, error) {
	defer l.timed("census", "")()
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.CountByState(ctx)
}

// backup is AdminService's Backup on the embedded store: a backup named
// name in dir. A name taken is VALIDATION_FAILED; a store not open yet is
// UNAVAILABLE.
func (l *lateStore) backup(dir string) func(ctx context.Context, name string) (*ledgerv1.BackupResponse, error) {
	return func(_ context.Context, name string) (*ledgerv1.BackupResponse, error) {
		s, err := l.get()
		if err != nil {
			return nil, err
		}
		p, ok := s.(*pebble.Store)
		if !ok {
			return nil, errcode.Errorf(errcode.ValidationFailed, "this ledgerd's store takes no backup")
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("--backup-dir: %w", err)
		}
		dest := filepath.Join(dir, name)
		if _, err := os.Stat(dest); err == nil {
			return nil, errcode.Errorf(errcode.ValidationFailed, "a backup named %q is there already: name another", name)
		}
		b, err := p.Backup(dest)
		if err != nil {
			return nil, err
		}
		return &ledgerv1.BackupResponse{Path: b.Dir, Bytes: b.Bytes, Sequence: b.Sequence}, nil
	}
}
