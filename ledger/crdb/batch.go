package crdb

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/jackc/pgx/v5"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Batching (Config.Batching) coalesces concurrent Claims and Completes:
// the calls that arrive while Config.BatchInFlight batches are already
// running wait, and the next batch takes up to Config.MaxBatch of them, one
// claim and one complete per scope. A batch is one round trip and one
// implicit transaction: a multi-row statement for its claims, then one for
// its completes (see runOps). Nothing waits on a timer: a lone call runs
// at once, as its single-row statement, and batches grow only with load.
// Each row gets its own answer, decided by the same statement shape as the
// single-call path, so the semantics do not change.
//
// Locks. Each statement takes its row locks in scope order, and a single
// statement locks one row, so only two batches can wait on each other, and
// only when they run at once on different ledger instances (an instance
// runs one batch at a time by default) with a claim and a complete of two
// keys crossed: A claims x and completes y while B claims y and completes
// x. The database breaks that cycle (PostgreSQL after deadlock_timeout,
// 1 s by default, with SQLSTATE 40P01; CockroachDB at once, with a retry
// error), and the calls of the aborted batch fall back to their own
// statements: a pause, never a wrong answer (TestCrossedBatches). With
// more batches in flight (Config.BatchInFlight, or the tuned limit on a
// distant database) longer cycles can form, and a single-row statement,
// holding the lock the next in line waits for, can be the one aborted: it
// reruns itself, as after a serialization failure (retry). Sending
// each statement with its own Sync would rule the cycle out, and measured
// 10% slower at 8 and 32 clients: two commits a round trip instead of one.

// batchTimeout bounds one batched statement, retries included.
const batchTimeout = 30 * time.Second

// call is one caller's request in a batch.
type call[P any, R any] struct {
	ctx  context.Context
	p    P
	key  string // the scope, to keep one call per scope in a batch
	done chan result[R]
}

type result[R any] struct {
	r   R
	err error
}

// batcher runs batches of calls with at most maxInFlight at once, or as
// many as tune allows when it is set. It keeps no goroutine when idle.
type batcher[P any, R any] struct {
	max, maxInFlight int
	tune             *inFlight
	run              func(ctx context.Context, calls []*call[P, R])

	mu       sync.Mutex
	pending  []*call[P, R]
	inFlight int

	batches, calls atomic.Uint64
	busy           atomic.Int64 // nanoseconds
}

// BatchStats are the batcher's counters since the Store opened, for
// metrics: Calls/Batches is the mean batch size, and the rate of Busy is
// the mean number of batches in flight; over Limit, how busy the batches
// keep the database's round trips.
type BatchStats struct {
	Batches uint64        // batches started, lone calls' included
	Calls   uint64        // calls they carried, counted before they are answered
	Busy    time.Duration // time spent running them, summed over batches (a batch's once it ended, a moment after its callers have their answers)
	// Limit is the batches allowed in flight at once now:
	// Config.BatchInFlight, or as set from RoundTrip and BatchTime.
	Limit int
	// RoundTrip is the round trip to the database the limit is set from,
	// and BatchTime the recent batches' median time; zero with a fixed
	// Config.BatchInFlight.
	RoundTrip, BatchTime time.Duration
}

// BatchStats returns the batchers' counters, summed over the home
// regions (Limit too); RoundTrip and BatchTime are Config.Region's (the
// primary's without it). Zero without Config.Batching.
func (s *Store) BatchStats() BatchStats {
	if !s.cfg.Batching {
		return BatchStats{}
	}
	var sum BatchStats
	local := ""
	if s.cfg.Homes != nil {
		local = cmp.Or(s.cfg.Region, s.cfg.Homes.primary)
	}
	for region, st := range s.BatchStatsByRegion() {
		sum.Batches += st.Batches
		sum.Calls += st.Calls
		sum.Busy += st.Busy
		sum.Limit += st.Limit
		if region == local {
			sum.RoundTrip, sum.BatchTime = st.RoundTrip, st.BatchTime
		}
	}
	return sum
}

// BatchStatsByRegion returns each home region's batcher's counters ("":
// the only one, without Config.Homes); nil without Config.Batching.
func (s *Store) BatchStatsByRegion() map[string]BatchStats {
	if !s.cfg.Batching {
		return nil
	}
	out := make(map[string]BatchStats, len(s.ops))
	for region, b := range s.ops {
		st := BatchStats{Batches: b.batches.Load(), Calls: b.calls.Load(), Busy: time.Duration(b.busy.Load()), Limit: b.limit()}
		if b.tune != nil {
			st.RoundTrip, st.BatchTime = b.tune.roundTrip()
		}
		out[region] = st
	}
	return out
}

// limit is the batches allowed in flight at once now.
func (b *batcher[P, R]) limit() int {
	if b.tune != nil {
		return b.tune.limit()
	}
	return b.maxInFlight
}

// do submits p and waits for its answer.
func (b *batcher[P, R]) do(ctx context.Context, key string, p P) (R, error) {
	c := &call[P, R]{ctx: ctx, p: p, key: key, done: make(chan result[R], 1)}
	b.mu.Lock()
	b.pending = append(b.pending, c)
	var batch []*call[P, R]
	if b.inFlight < b.limit() {
		// take may find nothing to run (every pending caller gone, this
		// one included): then no batch starts and none is counted.
		if batch = b.take(); batch != nil {
			b.inFlight++
		}
	}
	b.mu.Unlock()
	if batch != nil {
		// The batch runs on a goroutine of its own, past this caller's
		// deadline if need be (it answers the others in it): the caller
		// waits for its answer or its deadline, whichever comes first, so
		// that a database that does not answer ends the call in time.
		go b.execute(ctx, batch)
	}
	select {
	case res := <-c.done:
		return res.r, res.err
	case <-ctx.Done():
		var zero R
		return zero, ctx.Err()
	}
}

// execute runs batch, then hands what is pending to a goroutine of its own.
func (b *batcher[P, R]) execute(ctx context.Context, batch []*call[P, R]) {
	bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	// Counted before run answers the callers: a caller that has its
	// answer finds its call in the stats.
	b.batches.Add(1)
	b.calls.Add(uint64(len(batch)))
	start := time.Now()
	b.run(bctx, batch)
	took := time.Since(start)
	b.busy.Add(int64(took))
	if b.tune != nil {
		b.tune.observe(took)
	}
	cancel()
	b.mu.Lock()
	next := b.take()
	if next == nil {
		b.inFlight--
	}
	b.mu.Unlock()
	if next != nil {
		go b.execute(ctx, next)
	}
}

// take removes up to max pending calls, one per scope, skipping calls
// whose callers are gone. The caller holds mu.
func (b *batcher[P, R]) take() []*call[P, R] {
	var batch, rest []*call[P, R]
	seen := map[string]bool{}
	for _, c := range b.pending {
		switch {
		case c.ctx.Err() != nil:
			c.done <- result[R]{err: c.ctx.Err()}
		case len(batch) < b.max && !seen[c.key]:
			seen[c.key] = true
			batch = append(batch, c)
		default:
			rest = append(rest, c)
		}
	}
	b.pending = rest
	return batch
}

// sortByScope orders a batch by scope, so that every batched statement
// takes its row locks in the same order and two of them do not deadlock.
func sortByScope[P any, R any](calls []*call[P, R]) {
	slices.SortFunc(calls, func(a, b *call[P, R]) int { return strings.Compare(a.key, b.key) })
}

func scopeID(sc ledger.Scope) string { return sc.Namespace + "\x00" + sc.Tenant + "\x00" + sc.Key }

// prefixed is the column list with every column qualified by alias.
func prefixed(alias string) string {
	var cols []string
	for _, c := range strings.Split(columns, ",") {
		cols = append(cols, alias+"."+strings.TrimSpace(c))
	}
	return strings.Join(cols, ", ")
}

// completedColumns is prefixed(alias) with the outcome left out (NULL):
// what a completion that applied returns. The caller has the outcome it
// sent, so the database need not send it back, which halves what a large
// outcome costs on the wire.
func completedColumns(alias string) string {
	return strings.Replace(prefixed(alias), alias+".outcome", "NULL::BYTEA AS outcome", 1)
}

// claimBatchSQL is claimSQL over arrays: $2..$13 hold, per row,
// namespace, tenant, key, method, fingerprint, lease µs, retention µs,
// first_attempt_at, nonce, on_lease_expiry, tombstone retention µs and
// the key's source.
var claimBatchSQL = `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS n),
q AS (
	SELECT b.namespace, b.tenant, b.idem_key, b.method, b.fingerprint, b.nonce, b.policy, b.key_source,
	       v.n AS now,
	       v.n + b.lease * INTERVAL '1 microsecond' AS lease_end,
	       v.n + GREATEST(b.lease, b.retention) * INTERVAL '1 microsecond' AS expires,
	       v.n + (GREATEST(b.lease, b.retention) + b.tombstone) * INTERVAL '1 microsecond' AS forget,
	       (b.first IS NOT NULL AND b.first < v.n - (b.retention + b.tombstone) * INTERVAL '1 microsecond') AS too_late
	FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], $7::INT8[], $8::INT8[], $9::TIMESTAMPTZ[], $10::BYTEA[],
	            $11::INT2[], $12::INT8[], $13::TEXT[])
	     AS b(namespace, tenant, idem_key, method, fingerprint, lease, retention, first, nonce, policy, tombstone, key_source), v
), ins AS (
	INSERT INTO idempotency_records AS r (` + columns + `)
	SELECT q.namespace, q.tenant, q.idem_key, CASE WHEN q.too_late THEN 3 ELSE 1 END, q.method, q.fingerprint,
	       CASE WHEN q.too_late THEN 0 ELSE 1 END, 1, q.now, q.lease_end, NULL,
	       CASE WHEN q.too_late THEN q.now ELSE q.expires END, NULL, q.nonce, q.policy,
	       CASE WHEN q.too_late THEN q.now ELSE q.forget END, q.key_source
	FROM q
	ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET ` + claimConflictSet + `
	RETURNING ` + columns + `
)
SELECT ` + columns + `, (SELECT n FROM v) FROM ins
UNION ALL
SELECT ` + prefixed("e") + `, (SELECT n FROM v)
FROM idempotency_records AS e JOIN q ON e.namespace = q.namespace AND e.tenant = q.tenant AND e.idem_key = q.idem_key
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.namespace = q.namespace AND ins.tenant = q.tenant AND ins.idem_key = q.idem_key)`

// completeBatchSQL is completeSQL over arrays: $2..$6 hold, per row,
// namespace, tenant, key, token and outcome.
var completeBatchSQL = `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS now),
q AS (
	SELECT * FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[], $5::INT8[], $6::BYTEA[])
	       AS b(namespace, tenant, idem_key, token, outcome)
), upd AS (
	UPDATE idempotency_records AS r SET state = 2, completed_at = (SELECT now FROM v), outcome = q.outcome
	FROM q
	WHERE r.namespace = q.namespace AND r.tenant = q.tenant AND r.idem_key = q.idem_key
	  AND r.token = q.token AND ` + holdsAt("r", "(SELECT now FROM v)") + `
	RETURNING ` + completedColumns("r") + `
)
SELECT ` + columns + `, (SELECT now FROM v), true FROM upd
UNION ALL
SELECT ` + prefixed("e") + `, (SELECT now FROM v), false
FROM idempotency_records AS e JOIN q ON e.namespace = q.namespace AND e.tenant = q.tenant AND e.idem_key = q.idem_key
WHERE NOT EXISTS (SELECT 1 FROM upd WHERE upd.namespace = q.namespace AND upd.tenant = q.tenant AND upd.idem_key = q.idem_key)`

type claimCall struct {
	p     ledger.ClaimParams
	nonce []byte
}

type completeCall struct {
	p       ledger.CompleteParams
	outcome []byte
}

// op is one batched call: a claim or a complete.
type op struct {
	claim    *claimCall
	complete *completeCall
}

// opResult is the answer to an op: ClaimResult for a claim, the record for
// a complete.
type opResult struct {
	claim ledger.ClaimResult
	rec   ledger.Record
}

// opKey is an op's batch key: one claim and one complete per scope.
func opKey(kind byte, sc ledger.Scope) string { return string(kind) + scopeID(sc) }

// casRow is a row returned by a compare-and-set statement.
type casRow struct {
	r       row
	updated bool
}

// runOps runs one batch: its claims and its completes go to the database in
// one round trip and one transaction, a multi-row statement for each kind,
// claims first, and every call gets its own answer. A lone call uses its
// single-row statement. A serialization failure, also at COMMIT, reruns the
// batch. On any other error (a deadlock, an ambiguous commit) each call
// falls back to its own statement, which is safe: a statement that did
// commit answers the same again (a claim knows its nonce, a complete its
// token and outcome). A single-row statement reruns itself after a
// serialization failure or a deadlock (retry).
func (s *Store) runOps(ctx context.Context, region string, calls []*call[op, opResult]) {
	for _, c := range calls {
		trace.SpanFromContext(c.ctx).SetAttributes(ledger.AttrBatchSize.Int(len(calls))) //nolint:contextcheck // each call's own span
	}
	if s.batchRan != nil {
		scopes := make([]ledger.Scope, len(calls))
		for i, c := range calls {
			if c.p.claim != nil {
				scopes[i] = c.p.claim.p.Scope
			} else {
				scopes[i] = c.p.complete.p.Scope
			}
		}
		s.batchRan(region, scopes)
	}
	if len(calls) == 1 {
		s.runOne(ctx, calls[0])
		return
	}
	var claims, completes []*call[op, opResult]
	for _, c := range calls {
		if c.p.claim != nil {
			claims = append(claims, c)
		} else {
			completes = append(completes, c)
		}
	}
	sortByScope(claims)
	sortByScope(completes)
	var gotClaims map[string]row
	var gotCompletes map[string]casRow
	err := s.retrySerialization(ctx, func(ctx context.Context) (err error) {
		b := &pgx.Batch{}
		if len(claims) > 0 {
			b.Queue(claimBatchSQL, claimArgs(s.now(), claims)...)
		}
		if len(completes) > 0 {
			b.Queue(completeBatchSQL, completeArgs(s.now(), completes)...)
		}
		// One write, one Sync: one implicit transaction. Close reads the
		// COMMIT's outcome, which may be a serialization failure.
		br := s.pool.SendBatch(ctx, b)
		defer func() { err = errors.Join(err, br.Close()) }()
		if len(claims) > 0 {
			if gotClaims, err = readRows(br, scanClaimRow); err != nil {
				return err
			}
		}
		if len(completes) > 0 {
			gotCompletes, err = readRows(br, scanCASRow)
		}
		return err
	})
	if err != nil {
		if s.batchFailed != nil {
			s.batchFailed(err)
		}
		for _, c := range calls {
			s.runOne(c.ctx, c) //nolint:contextcheck // each call falls back under its own caller's context
		}
		return
	}
	for _, c := range claims {
		r, ok := gotClaims[scopeID(c.p.claim.p.Scope)]
		if !ok {
			c.done <- result[opResult]{err: errcode.Errorf(errcode.Internal, "internal error")}
			continue
		}
		c.done <- result[opResult]{r: opResult{claim: r.claimResult(c.p.claim.nonce)}}
	}
	for _, c := range completes {
		p := c.p.complete.p
		var res result[opResult]
		if cr, ok := gotCompletes[scopeID(p.Scope)]; ok {
			res.r.rec, res.err = completeAnswer(cr.r, cr.updated, p)
		} else {
			res.err = leaseLost(p.Token)
		}
		c.done <- res
	}
}

// runOne answers one call with its single-row statement.
func (s *Store) runOne(ctx context.Context, c *call[op, opResult]) {
	var res result[opResult]
	if cl := c.p.claim; cl != nil {
		res.r.claim, res.err = s.claimOne(ctx, cl.p, cl.nonce)
	} else {
		res.r.rec, res.err = s.completeOne(ctx, c.p.complete.p, c.p.complete.outcome)
	}
	c.done <- res
}

// readRows reads the next result of br into a map by scope.
func readRows[R any](br pgx.BatchResults, scan func(pgx.Rows) (R, ledger.Scope, error)) (map[string]R, error) {
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := map[string]R{}
	for rows.Next() {
		r, sc, err := scan(rows)
		if err != nil {
			return nil, err
		}
		got[scopeID(sc)] = r
	}
	return got, rows.Err()
}

func scanClaimRow(rows pgx.Rows) (row, ledger.Scope, error) {
	var r row
	err := scanInto(rows, &r, &r.now)
	return r, r.rec.Scope, err
}

func scanCASRow(rows pgx.Rows) (casRow, ledger.Scope, error) {
	var cr casRow
	err := scanInto(rows, &cr.r, &cr.r.now, &cr.updated)
	return cr, cr.r.rec.Scope, err
}

// claimArgs are the arguments of claimBatchSQL for calls.
func claimArgs(now any, calls []*call[op, opResult]) []any {
	n := len(calls)
	ns, tenants, keys, methods, fps := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	leases, retentions, tombstones := make([]int64, n), make([]int64, n), make([]int64, n)
	firsts, nonces, policies, sources := make([]*time.Time, n), make([][]byte, n), make([]int16, n), make([]string, n)
	for i, c := range calls {
		p := c.p.claim.p
		ns[i], tenants[i], keys[i], methods[i], fps[i] = p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, p.Method, p.Fingerprint
		leases[i], retentions[i], nonces[i] = p.Lease.Microseconds(), p.Retention.Microseconds(), c.p.claim.nonce
		policies[i], tombstones[i], sources[i] = int16(p.OnLeaseExpiry), p.TombstoneRetention.Microseconds(), p.KeySource
		if !p.FirstAttemptAt.IsZero() {
			t := p.FirstAttemptAt
			firsts[i] = &t
		}
	}
	return []any{now, ns, tenants, keys, methods, fps, leases, retentions, firsts, nonces, policies, tombstones, sources}
}

// completeArgs are the arguments of completeBatchSQL for calls.
func completeArgs(now any, calls []*call[op, opResult]) []any {
	n := len(calls)
	ns, tenants, keys := make([]string, n), make([]string, n), make([]string, n)
	tokens, outcomes := make([]int64, n), make([][]byte, n)
	for i, c := range calls {
		p := c.p.complete.p
		ns[i], tenants[i], keys[i], tokens[i], outcomes[i] = p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, int64(p.Token), c.p.complete.outcome
	}
	return []any{now, ns, tenants, keys, tokens, outcomes}
}
