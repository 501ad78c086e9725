// Package crdb provides the production ledger.Store on CockroachDB, and on
// PostgreSQL in SERIALIZABLE isolation, over pgx v5 and cockroach-go.
//
// Every operation is one SQL statement on the common path (see sql.go),
// retried as a whole on serialization failures (SQLSTATE 40001) and
// deadlocks (40P01) with jittered exponential backoff, a bounded number
// of times: past the bound the
// caller gets CONTENTION, which is retryable. Time comes from the database
// (now()) unless Config.Now is set, so ledger instances with skewed clocks
// agree.
//
// Why not crdbpgxv5.ExecuteTx for everything: it retries on a savepoint and
// ignores the COMMIT error, which on PostgreSQL reports success for a
// transaction that was rolled back. Multi-statement transactions (only the
// migrations) therefore use crdbpgxv5.ExecuteTx on CockroachDB and
// crdbgo.ExecuteCtx around pgx.BeginTxFunc on PostgreSQL.
package crdb

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/puddle/v2"

	"github.com/idemledger/idemledger/internal/bufpool"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Dialect is the database engine behind a pool.
type Dialect int

const (
	// Postgres is PostgreSQL, run in SERIALIZABLE isolation.
	Postgres Dialect = iota + 1
	// Cockroach is CockroachDB.
	Cockroach
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case Cockroach:
		return "cockroach"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Config configures a Store. The zero value works.
type Config struct {
	// Now is the clock. nil (the default) means the database's now(); set it
	// only in tests.
	Now func() time.Time
	// MaxRetries bounds the retries of one statement after a serialization
	// failure: 10. Past it the caller gets CONTENTION.
	MaxRetries int
	// RetryBase and RetryCap shape the backoff between retries: full jitter
	// over an exponential from RetryBase (2 ms) capped at RetryCap (200 ms).
	RetryBase, RetryCap time.Duration
	// SweepInterval is the pause of Run between sweeps: 1 min.
	SweepInterval time.Duration
	// SweepBatch is how many expired rows one sweep statement deletes: 500.
	SweepBatch int
	// Batching coalesces concurrent Claims and Completes into batches of
	// multi-row statements, one round trip a batch (see batch.go): off by
	// default.
	Batching bool
	// MaxBatch caps the calls of one batch, claims and completes together:
	// 128.
	MaxBatch int
	// BatchInFlight caps the batches running at once; calls beyond wait
	// for the next batch. 0, the default, sets it from the round trip to
	// the database (see inflight.go): 1 while the database is near, which
	// measured best on PostgreSQL, and more as the round trip grows, up to
	// the pool's size (lab/results/README.md).
	BatchInFlight int
	// MaxBatchedOutcome is the largest outcome, in encoded bytes, whose
	// Complete goes through a batch: 64 KiB. A larger one runs its own
	// statement on a connection of its own, beside the batches: its bytes,
	// not the round trip, are its cost, and in a batch they would hold up
	// the batch's other calls and every call queued behind it. Measured
	// (lab/results/README.md): 256 KiB outcomes ran 0.46x direct SQL's pairs
	// at 8 clients batched and 0.77x alone; 10 KiB ones 1.20x at 32
	// clients batched and 0.84x alone. Negative batches every outcome.
	MaxBatchedOutcome int
	// StatementTimeout and LockTimeout are the sessions' statement_timeout
	// and lock_timeout, set by Open: 10 s and 5 s. The database itself then
	// ends a statement that runs or waits too long, whatever the client's
	// deadline, with a retryable error (SQLSTATE 57014: UPSTREAM_TIMEOUT;
	// 55P03: CONTENTION). Negative leaves the database's own setting.
	StatementTimeout, LockTimeout time.Duration
	// Homes is the platform's mapping of tenants to home regions (see
	// Homes and ApplyHomes). With it, a batch holds the calls of one home
	// region only, and each region's batches have their own limit, set
	// from a round trip to a row of that region: a call never waits
	// behind another region's batch (see batch.go). nil: one region.
	Homes *Homes
	// Region is the region this ledger instance runs in, one of Homes'
	// regions; it tells which tenants are homed away (FollowerReads).
	Region string
	// FollowerReads, above zero, lets a claim of a tenant homed outside
	// Region (of every tenant, without Homes) first read the record from
	// the nearest replica, at most FollowerReads stale (CockroachDB's
	// bounded-staleness follower reads), and answer a replay of a
	// completed record from it without the leaseholder (see follower.go).
	// On PostgreSQL the same read goes to the primary. 0, the default,
	// sends every claim to the leaseholder.
	FollowerReads time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxRetries <= 0 {
		c.MaxRetries = 10
	}
	if c.RetryBase <= 0 {
		c.RetryBase = 2 * time.Millisecond
	}
	if c.RetryCap <= 0 {
		c.RetryCap = 200 * time.Millisecond
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = time.Minute
	}
	if c.SweepBatch <= 0 {
		c.SweepBatch = 500
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 128
	}
	switch {
	case c.MaxBatchedOutcome == 0:
		c.MaxBatchedOutcome = 64 << 10
	case c.MaxBatchedOutcome < 0:
		c.MaxBatchedOutcome = math.MaxInt
	}
	if c.StatementTimeout == 0 {
		c.StatementTimeout = 10 * time.Second
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 5 * time.Second
	}
	return c
}

// Store is the SQL ledger.Store. It is safe for concurrent use, by any
// number of processes sharing the database.
type Store struct {
	pool    *pgxpool.Pool
	dialect Dialect
	cfg     Config
	ops     map[string]*batcher[op, opResult] // by home region; "" without Config.Homes
	follow  followerReader
	// followSQL is followerReadSQL with Config.FollowerReads.
	followSQL string
	reads     followerStats

	batchFailed func(error)                               // tests: sees the error of a batch before its calls fall back
	batchRan    func(region string, calls []ledger.Scope) // tests: sees each batch's region and scopes
}

var _ ledger.Store = (*Store)(nil)

// Open connects to the database at url (a PostgreSQL or CockroachDB
// connection string), makes SERIALIZABLE the default isolation of every
// connection, and returns a Store over the pool. Close the Store to close
// the pool.
func Open(ctx context.Context, url string, cfg Config) (*Store, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("crdb: parse url: %w", err)
	}
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	full := cfg.withDefaults()
	for param, d := range map[string]time.Duration{"statement_timeout": full.StatementTimeout, "lock_timeout": full.LockTimeout} {
		if d > 0 {
			pc.ConnConfig.RuntimeParams[param] = strconv.FormatInt(d.Milliseconds(), 10)
		}
	}
	pc.AfterConnect = ConfigureConn
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("crdb: connect: %w", err)
	}
	s, err := New(ctx, pool, cfg)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// ConfigureConn sets up a new connection's session for the store: Open
// makes it the pool's AfterConnect; do the same for a pool passed to New.
//
// On PostgreSQL it plans the store's few statements once per connection
// (plan_cache_mode = force_generic_plan): their custom plans cost more to
// make than to run. Such a plan is made at a statement's first run and kept
// until the table's statistics change, so one made while the table is small
// (a new ledger) must still find rows by key as the table grows: every
// statement finds its rows through an index, so scans and hash or merge
// joins are turned off for the session (TestPlansUseIndexes). Without
// that, a new ledger's batched completes scanned the table and throughput
// fell from 3,400 to 250 pairs/s within 15 seconds (8 callers), until
// autovacuum analyzed the table a minute later. CockroachDB (which reports
// crdb_version) caches plans itself and is left as it is.
func ConfigureConn(ctx context.Context, c *pgx.Conn) error {
	if c.PgConn().ParameterStatus("crdb_version") != "" {
		return nil
	}
	_, err := c.Exec(ctx, "SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_hashjoin = off; SET enable_mergejoin = off")
	return err
}

// New returns a Store over pool. It detects the dialect (SELECT version())
// and refuses a pool whose connections do not default to SERIALIZABLE. Give
// the pool ConfigureConn as its AfterConnect.
func New(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Store, error) {
	var version, isolation string
	if err := pool.QueryRow(ctx, `SELECT version()`).Scan(&version); err != nil {
		return nil, fmt.Errorf("crdb: detect dialect: %w", err)
	}
	if err := pool.QueryRow(ctx, `SHOW default_transaction_isolation`).Scan(&isolation); err != nil {
		return nil, fmt.Errorf("crdb: read isolation: %w", err)
	}
	if !strings.EqualFold(isolation, "serializable") {
		return nil, fmt.Errorf("crdb: default_transaction_isolation is %q; the ledger needs serializable (use Open, or set it on the pool)", isolation)
	}
	d := Postgres
	if strings.Contains(version, "CockroachDB") {
		d = Cockroach
	}
	s := &Store{pool: pool, dialect: d, cfg: cfg.withDefaults()}
	if h := s.cfg.Homes; h != nil && s.cfg.Region != "" && !slices.Contains(h.Regions(), s.cfg.Region) {
		return nil, fmt.Errorf("crdb: region %q is not one of the homes' regions %v", s.cfg.Region, h.Regions())
	}
	s.follow = s.readFollower
	s.followSQL = followerReadSQL(d, fmt.Sprintf("%dms", max(s.cfg.FollowerReads.Milliseconds(), 1)))
	regions := []string{""}
	if s.cfg.Homes != nil {
		regions = s.cfg.Homes.Regions()
	}
	s.ops = make(map[string]*batcher[op, opResult], len(regions))
	for _, region := range regions {
		b := &batcher[op, opResult]{max: s.cfg.MaxBatch, maxInFlight: s.cfg.BatchInFlight,
			run: func(ctx context.Context, calls []*call[op, opResult]) { s.runOps(ctx, region, calls) }}
		if s.cfg.Batching && s.cfg.BatchInFlight <= 0 {
			ping := s.roundTrip
			if s.cfg.Homes != nil {
				ping = s.regionRoundTrip(s.cfg.Homes.homeOf(region))
			}
			b.tune = newInFlight(ctx, ping, max(int(pool.Config().MaxConns), 1))
			b.tune.measure(ctx)
		}
		s.ops[region] = b
	}
	return s, nil
}

// home is the region of a tenant's records: "" without Config.Homes.
func (s *Store) home(tenant string) string {
	if s.cfg.Homes == nil {
		return ""
	}
	return s.cfg.Homes.Home(tenant)
}

// regionRoundTrip times a point read of a row homed in region, through
// tenant (Homes.homeOf): on CockroachDB a round trip to the region's
// leaseholder, where a ping would reach only the gateway.
func (s *Store) regionRoundTrip(tenant string) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		c, err := s.pool.Acquire(ctx)
		if err != nil {
			return 0, err
		}
		defer c.Release()
		start := time.Now()
		_, err = c.Exec(ctx, `SELECT 1 FROM idempotency_records WHERE namespace = '' AND tenant = $1 AND idem_key = ''`, tenant)
		return time.Since(start), err
	}
}

// roundTrip times one exchange with the database on a connection already
// acquired, so that neither the pool's wait nor a new connection counts.
func (s *Store) roundTrip(ctx context.Context) (time.Duration, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Release()
	start := time.Now()
	err = c.Conn().PgConn().Ping(ctx)
	return time.Since(start), err
}

// Dialect returns the detected engine.
func (s *Store) Dialect() Dialect { return s.dialect }

// Pool returns the connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Close closes the pool.
func (s *Store) Close() {
	for _, b := range s.ops {
		if b.tune != nil {
			b.tune.close()
		}
	}
	s.pool.Close()
}

// Ping reports whether the store can answer: the database is reachable and
// the schema is there (run Migrate otherwise). Errors are UNAVAILABLE.
func (s *Store) Ping(ctx context.Context) error {
	err := s.retry(ctx, func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, `SELECT 1 FROM idempotency_records LIMIT 0`)
		return err
	})
	if err != nil {
		return errcode.Wrap(errcode.Unavailable, fmt.Errorf("crdb: ping: %w", err), "the ledger's database is unavailable")
	}
	return nil
}

// now returns the $1 argument of every statement: the fake clock, or NULL
// for the database's.
func (s *Store) now() any {
	if s.cfg.Now == nil {
		return nil
	}
	return s.cfg.Now()
}

// Claim implements ledger.Store in one statement (claimSQL). An ambiguous
// commit is resolved by reading the row again: the claim is the caller's
// exactly when the row carries its claim nonce.
func (s *Store) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	if res, ok := s.replayFromFollower(ctx, p); ok {
		return res, nil
	}
	nonce := make([]byte, 16)
	_, _ = crand.Read(nonce)
	if s.cfg.Batching {
		res, err := s.ops[s.home(p.Scope.Tenant)].do(ctx, opKey('c', p.Scope), op{claim: &claimCall{p: p, nonce: nonce}})
		if err != nil {
			return ledger.ClaimResult{}, s.classify("claim", err)
		}
		return res.claim, nil
	}
	return s.claimOne(ctx, p, nonce)
}

// claimOne runs the claim statement for one call.
func (s *Store) claimOne(ctx context.Context, p ledger.ClaimParams, nonce []byte) (ledger.ClaimResult, error) {
	var first any
	if !p.FirstAttemptAt.IsZero() {
		first = p.FirstAttemptAt
	}
	var res ledger.ClaimResult
	claim := func(ctx context.Context) error {
		r, err := s.scanOne(ctx, claimSQL, s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key,
			p.Method, p.Fingerprint, p.Lease.Microseconds(), p.Retention.Microseconds(), first, nonce,
			int16(p.OnLeaseExpiry), p.TombstoneRetention.Microseconds(), p.KeySource)
		if err != nil {
			return err
		}
		res = r.claimResult(nonce)
		return nil
	}
	err := s.retry(ctx, claim)
	if isAmbiguous(err) {
		// The claim may or may not have committed. If the row carries our
		// nonce, it did; otherwise it did not (nobody else writes our nonce),
		// and running the same statement again is a first attempt.
		if r, gerr := s.get(ctx, p.Scope); gerr == nil && bytes.Equal(r.claimID, nonce) {
			res, err = r.claimResult(nonce), nil
		} else {
			err = s.retry(ctx, claim)
		}
	}
	if err != nil {
		return ledger.ClaimResult{}, s.classify("claim", err)
	}
	return res, nil
}

// Complete implements ledger.Store. The statement is safe to repeat, so an
// ambiguous commit is resolved by running it again.
//
// An outcome sent in a statement of its own is encoded into a borrowed
// buffer, given back when the statement is done: pgx has copied it by then.
// One sent in a batch is not, since the batch may still hold it when a
// cancelled call returns.
func (s *Store) Complete(ctx context.Context, p ledger.CompleteParams) (ledger.Record, error) {
	if err := p.Outcome.Validate(); err != nil {
		return ledger.Record{}, err
	}
	if n := p.Outcome.BinarySize(); !s.cfg.Batching || n > s.cfg.MaxBatchedOutcome {
		buf := bufpool.Pool.Get(n)
		defer bufpool.Pool.Put(buf)
		b, err := p.Outcome.AppendBinary((*buf)[:0])
		if err != nil {
			return ledger.Record{}, err
		}
		*buf = b
		return s.completeOne(ctx, p, b)
	}
	b, err := p.Outcome.MarshalBinary()
	if err != nil {
		return ledger.Record{}, err
	}
	res, err := s.ops[s.home(p.Scope.Tenant)].do(ctx, opKey('u', p.Scope), op{complete: &completeCall{p: p, outcome: b}})
	if err != nil {
		return ledger.Record{}, s.classify("complete", err)
	}
	return res.rec, nil
}

// completeOne runs the complete statement for one call.
func (s *Store) completeOne(ctx context.Context, p ledger.CompleteParams, outcome []byte) (ledger.Record, error) {
	var r row
	var updated bool
	err := s.retryAmbiguous(ctx, func(ctx context.Context) (err error) {
		r, updated, err = s.scanCASBytes(ctx, completeSQL, outcome, s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, int64(p.Token))
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ledger.Record{}, leaseLost(p.Token)
	case err != nil:
		return ledger.Record{}, s.classify("complete", err)
	}
	return completeAnswer(r, updated, p)
}

// completeAnswer decides Complete from the row the statement returned: the
// update happened, or the same Complete was repeated, or the token lost.
func completeAnswer(r row, updated bool, p ledger.CompleteParams) (ledger.Record, error) {
	if updated {
		// The statement left the outcome out: it is the one sent.
		r.rec.Outcome = p.Outcome
		return r.rec, nil
	}
	if r.rec.Token == p.Token && r.rec.View(r.now) == ledger.StateCompleted {
		if r.rec.Outcome.Equal(p.Outcome) {
			return r.rec, nil
		}
		return ledger.Record{}, errcode.Errorf(errcode.LeaseLost, "the record is already completed with another outcome")
	}
	return ledger.Record{}, leaseLost(p.Token)
}

// Release implements ledger.Store. A repeated Release succeeds.
func (s *Store) Release(ctx context.Context, p ledger.ReleaseParams) error {
	var r row
	var updated bool
	err := s.retryAmbiguous(ctx, func(ctx context.Context) (err error) {
		r, updated, err = s.scanCAS(ctx, releaseSQL, s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, int64(p.Token))
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return leaseLost(p.Token)
	case err != nil:
		return s.classify("release", err)
	case updated || (r.rec.State == ledger.StateReleased && r.rec.Token == p.Token && r.now.Before(r.rec.ExpiresAt)):
		return nil
	}
	return leaseLost(p.Token)
}

// Extend implements ledger.Store.
func (s *Store) Extend(ctx context.Context, p ledger.ExtendParams) (ledger.Record, error) {
	var r row
	var updated bool
	err := s.retryAmbiguous(ctx, func(ctx context.Context) (err error) {
		r, updated, err = s.scanCAS(ctx, extendSQL, s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key,
			int64(p.Token), p.Lease.Microseconds())
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err == nil && !updated):
		return ledger.Record{}, leaseLost(p.Token)
	case err != nil:
		return ledger.Record{}, s.classify("extend", err)
	}
	return r.rec, nil
}

// Resolve implements ledger.Store in one statement (resolveSQL). When the
// statement does not apply, the rule (ledger.NextResolve) says why, from
// the row it read.
func (s *Store) Resolve(ctx context.Context, p ledger.ResolveParams) (ledger.Record, error) {
	var outcome []byte
	if p.Outcome != nil {
		var err error
		if outcome, err = p.Outcome.MarshalBinary(); err != nil {
			return ledger.Record{}, err
		}
	}
	var r row
	var updated bool
	err := s.retryAmbiguous(ctx, func(ctx context.Context) (err error) {
		r, updated, err = s.scanCAS(ctx, resolveSQL, s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, p.Outcome != nil, outcome)
		return err
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return ledger.Record{}, errcode.Errorf(errcode.NotFound, "no record for this key")
	case err != nil:
		return ledger.Record{}, s.classify("resolve", err)
	case !updated:
		if _, err := ledger.NextResolve(&r.rec, p, r.now); err != nil {
			return ledger.Record{}, err
		}
		// An ambiguous first try that did apply: the row is resolved.
	}
	rec, _ := r.rec.AsOf(r.now)
	return rec, nil
}

// Get implements ledger.Store with a strong (non-stale) read.
func (s *Store) Get(ctx context.Context, sc ledger.Scope) (ledger.Record, error) {
	r, err := s.get(ctx, sc)
	if errors.Is(err, pgx.ErrNoRows) {
		return ledger.Record{}, errcode.Errorf(errcode.NotFound, "no record for this key")
	}
	if err != nil {
		return ledger.Record{}, s.classify("get", err)
	}
	rec, ok := r.rec.AsOf(r.now)
	if !ok {
		return ledger.Record{}, errcode.Errorf(errcode.NotFound, "no record for this key")
	}
	return rec, nil
}

// GetMany implements ledger.Store in one statement.
func (s *Store) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	ns, tenants, keys := make([]string, len(scopes)), make([]string, len(scopes)), make([]string, len(scopes))
	at := make(map[ledger.Scope]int, len(scopes))
	for i, sc := range scopes {
		ns[i], tenants[i], keys[i] = sc.Namespace, sc.Tenant, sc.Key
		at[sc] = i
	}
	recs := make([]ledger.Record, len(scopes))
	err := s.retry(ctx, func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, getManySQL, s.now(), ns, tenants, keys)
		if err != nil {
			return err
		}
		defer rows.Close()
		clear(recs)
		for rows.Next() {
			var r row
			if err := scanInto(rows, &r, &r.now); err != nil {
				return err
			}
			if i, ok := at[r.rec.Scope]; ok {
				recs[i], _ = r.rec.AsOf(r.now)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.classify("get", err)
	}
	return recs, nil
}

func (s *Store) get(ctx context.Context, sc ledger.Scope) (row, error) {
	var r row
	err := s.retry(ctx, func(ctx context.Context) error {
		var err error
		r, err = s.scanOne(ctx, getSQL, s.now(), sc.Namespace, sc.Tenant, sc.Key)
		return err
	})
	return r, err
}

func leaseLost(token uint64) *errcode.Error {
	return errcode.Errorf(errcode.LeaseLost, "token %d does not hold the key", token)
}

// isUnreachable reports whether err says the database could not be
// reached: no SQLSTATE, but a connection that failed or broke.
func isUnreachable(err error) bool {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var ne net.Error
	return sqlState(err) == "" && (errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, puddle.ErrClosedPool))
}
