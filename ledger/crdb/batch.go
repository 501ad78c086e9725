package crdb

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemledger/idemledger/ledger"
)

// Batching (Config.Batching) coalesces concurrent Claims, and concurrent
// Completes, into multi-row statements: the calls that arrive while
// Config.BatchInFlight statements are already running wait, and the next
// statement takes up to Config.MaxBatch of them, one per scope. Nothing
// waits on a timer: a lone call runs at once, and batches grow only with
// load. Each row gets its own answer, decided by the same statement shape
// as the single-call path, so the semantics do not change.

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

// batcher runs batches of calls with at most maxInFlight at once. It keeps
// no goroutine when idle.
type batcher[P any, R any] struct {
	max, maxInFlight int
	run              func(ctx context.Context, calls []*call[P, R])

	mu       sync.Mutex
	pending  []*call[P, R]
	inFlight int
}

// do submits p and waits for its answer.
func (b *batcher[P, R]) do(ctx context.Context, key string, p P) (R, error) {
	c := &call[P, R]{ctx: ctx, p: p, key: key, done: make(chan result[R], 1)}
	b.mu.Lock()
	b.pending = append(b.pending, c)
	var batch []*call[P, R]
	if b.inFlight < b.maxInFlight {
		// take may find nothing to run (every pending caller gone, this
		// one included): then no batch starts and none is counted.
		if batch = b.take(); batch != nil {
			b.inFlight++
		}
	}
	b.mu.Unlock()
	if batch != nil {
		b.execute(ctx, batch)
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
	b.run(bctx, batch)
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

// claimBatchSQL is claimSQL over arrays: $2..$10 hold, per row, namespace,
// tenant, key, method, fingerprint, lease µs, retention µs,
// first_attempt_at and nonce.
var claimBatchSQL = `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS n),
q AS (
	SELECT b.namespace, b.tenant, b.idem_key, b.method, b.fingerprint, b.nonce,
	       v.n AS now,
	       v.n + b.lease * INTERVAL '1 microsecond' AS lease_end,
	       v.n + GREATEST(b.lease, b.retention) * INTERVAL '1 microsecond' AS expires,
	       (b.first IS NOT NULL AND b.first < v.n - b.retention * INTERVAL '1 microsecond') AS too_late
	FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::TEXT[], $7::INT8[], $8::INT8[], $9::TIMESTAMPTZ[], $10::BYTEA[])
	     AS b(namespace, tenant, idem_key, method, fingerprint, lease, retention, first, nonce), v
), ins AS (
	INSERT INTO idempotency_records AS r (` + columns + `)
	SELECT q.namespace, q.tenant, q.idem_key, CASE WHEN q.too_late THEN 3 ELSE 1 END, q.method, q.fingerprint,
	       CASE WHEN q.too_late THEN 0 ELSE 1 END, 1, q.now, q.lease_end, NULL,
	       CASE WHEN q.too_late THEN q.now ELSE q.expires END, NULL, q.nonce
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
	  AND r.token = q.token AND r.state = 1 AND r.expires_at > (SELECT now FROM v)
	RETURNING ` + prefixed("r") + `
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

// runClaims runs one batched claim statement and answers every call. On an
// error other than a serialization failure (which the statement's retry
// absorbs) each call falls back to its own statement, which resolves
// ambiguous commits by its nonce.
func (s *Store) runClaims(ctx context.Context, calls []*call[claimCall, ledger.ClaimResult]) {
	if len(calls) == 1 { // the single statement is cheaper
		c := calls[0]
		res, err := s.claimOne(ctx, c.p.p, c.p.nonce)
		c.done <- result[ledger.ClaimResult]{res, err}
		return
	}
	sortByScope(calls)
	n := len(calls)
	ns, tenants, keys, methods, fps := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	leases, retentions := make([]int64, n), make([]int64, n)
	firsts, nonces := make([]*time.Time, n), make([][]byte, n)
	for i, c := range calls {
		p := c.p.p
		ns[i], tenants[i], keys[i], methods[i], fps[i] = p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, p.Method, p.Fingerprint
		leases[i], retentions[i], nonces[i] = p.Lease.Microseconds(), p.Retention.Microseconds(), c.p.nonce
		if !p.FirstAttemptAt.IsZero() {
			t := p.FirstAttemptAt
			firsts[i] = &t
		}
	}
	var got map[string]row
	err := s.retry(ctx, func(ctx context.Context) error {
		got = map[string]row{}
		rows, err := s.pool.Query(ctx, claimBatchSQL, s.now(), ns, tenants, keys, methods, fps, leases, retentions, firsts, nonces)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r row
			if err := scanInto(rows, &r, &r.now); err != nil {
				return err
			}
			got[scopeID(r.rec.Scope)] = r
		}
		return rows.Err()
	})
	for _, c := range calls {
		r, ok := got[c.key]
		switch {
		case err != nil:
			res, cerr := s.claimOne(c.ctx, c.p.p, c.p.nonce)
			c.done <- result[ledger.ClaimResult]{res, cerr}
		case !ok:
			c.done <- result[ledger.ClaimResult]{err: ledger.Errorf(ledger.CodeInternal, "internal error")}
		default:
			c.done <- result[ledger.ClaimResult]{r: r.claimResult(c.p.nonce)}
		}
	}
}

type completeCall struct {
	p       ledger.CompleteParams
	outcome []byte
}

// runCompletes runs one batched complete statement and answers every call;
// on an error each call falls back to its own statement.
func (s *Store) runCompletes(ctx context.Context, calls []*call[completeCall, ledger.Record]) {
	if len(calls) == 1 {
		c := calls[0]
		rec, err := s.completeOne(ctx, c.p.p, c.p.outcome)
		c.done <- result[ledger.Record]{rec, err}
		return
	}
	sortByScope(calls)
	n := len(calls)
	ns, tenants, keys := make([]string, n), make([]string, n), make([]string, n)
	tokens, outcomes := make([]int64, n), make([][]byte, n)
	for i, c := range calls {
		p := c.p.p
		ns[i], tenants[i], keys[i], tokens[i], outcomes[i] = p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key, int64(p.Token), c.p.outcome
	}
	type casRow struct {
		r       row
		updated bool
	}
	var got map[string]casRow
	err := s.retryAmbiguous(ctx, func(ctx context.Context) error {
		got = map[string]casRow{}
		rows, err := s.pool.Query(ctx, completeBatchSQL, s.now(), ns, tenants, keys, tokens, outcomes)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var cr casRow
			if err := scanInto(rows, &cr.r, &cr.r.now, &cr.updated); err != nil {
				return err
			}
			got[scopeID(cr.r.rec.Scope)] = cr
		}
		return rows.Err()
	})
	for _, c := range calls {
		cr, ok := got[c.key]
		var res result[ledger.Record]
		switch {
		case err != nil:
			res.r, res.err = s.completeOne(c.ctx, c.p.p, c.p.outcome)
		case !ok:
			res.err = leaseLost(c.p.p.Token)
		default:
			res.r, res.err = completeAnswer(cr.r, cr.updated, c.p.p)
		}
		c.done <- res
	}
}
