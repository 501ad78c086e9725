package crdb

import (
	"context"

	"github.com/idemledger/idemledger/ledger"
)

// The admin statements. Every one reads through the primary key
// (namespace, tenant, idem_key), so a page costs the rows it returns, and
// a purge the rows it deletes. A row is erasable unless it reads as in
// progress or unknown (state 1 and not past its end).
const (
	nowArg         = `COALESCE($1::TIMESTAMPTZ, now())`
	erasable       = `(state <> 1 OR COALESCE(forget_at, expires_at) <= ` + nowArg + `)`
	liveAfterPurge = `state IN (2, 4) AND COALESCE(forget_at, expires_at) > ` + nowArg

	listTenantSQL = `SELECT ` + columns + `, ` + nowArg + ` FROM idempotency_records
WHERE namespace = $2 AND tenant = $3 AND idem_key > $4
ORDER BY tenant, idem_key LIMIT $5`
	listNamespaceSQL = `SELECT ` + columns + `, ` + nowArg + ` FROM idempotency_records
WHERE namespace = $2 AND (tenant, idem_key) > ($3, $4)
ORDER BY tenant, idem_key LIMIT $5`

	purgeKeySQL = `DELETE FROM idempotency_records WHERE ` + scope + ` AND ` + erasable + `
RETURNING ` + liveAfterPurge
	heldKeySQL = `SELECT count(*) FROM idempotency_records WHERE ` + scope + ` AND NOT ` + erasable

	purgeTenantPostgresSQL = `DELETE FROM idempotency_records WHERE ctid IN (
	SELECT ctid FROM idempotency_records WHERE namespace = $2 AND tenant = $3 AND ` + erasable + `
	LIMIT $4 FOR UPDATE SKIP LOCKED
) AND ` + erasable + ` RETURNING ` + liveAfterPurge
	purgeTenantCockroachSQL = `DELETE FROM idempotency_records WHERE namespace = $2 AND tenant = $3 AND ` + erasable + `
LIMIT $4 RETURNING ` + liveAfterPurge
	heldTenantSQL = `SELECT count(*) FROM (SELECT 1 FROM idempotency_records
WHERE namespace = $2 AND tenant = $3 AND NOT ` + erasable + ` LIMIT 10001) AS held`
)

// List implements ledger.Store, in order of tenant and key.
func (s *Store) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	var page ledger.ListPage
	err := s.retry(ctx, func(ctx context.Context) error {
		page = ledger.ListPage{}
		sql, tenant, afterKey := listNamespaceSQL, p.After.Tenant, p.After.Key
		if p.Tenant != "" {
			sql, tenant = listTenantSQL, p.Tenant
			if p.After.Tenant != p.Tenant {
				afterKey = ""
			}
		}
		rows, err := s.pool.Query(ctx, sql, s.now(), p.Namespace, tenant, afterKey, p.Limit+1)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r row
			if err := scanInto(rows, &r, &r.now); err != nil {
				return err
			}
			page.Now = r.now
			if page.Scanned == p.Limit {
				page.More = true
				break
			}
			page.Scanned++
			page.Last = r.rec.Scope
			if live, ok := r.rec.AsOf(r.now); ok {
				page.Records = append(page.Records, live)
			}
		}
		return rows.Err()
	})
	if err != nil {
		return ledger.ListPage{}, s.classify("list", err)
	}
	return page, nil
}

// Purge implements ledger.Store: one statement erases, another
// counts what it had to leave.
func (s *Store) Purge(ctx context.Context, p ledger.PurgeParams) (ledger.PurgeResult, error) {
	var res ledger.PurgeResult
	err := s.retry(ctx, func(ctx context.Context) error {
		res = ledger.PurgeResult{}
		sql, held := purgeKeySQL, heldKeySQL
		args := []any{s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Scope.Key}
		if p.Scope.Key == "" {
			sql, held = purgeTenantPostgresSQL, heldTenantSQL
			if s.dialect == Cockroach {
				sql = purgeTenantCockroachSQL
			}
			args = []any{s.now(), p.Scope.Namespace, p.Scope.Tenant, p.Limit}
		}
		rows, err := s.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		deleted := 0
		for rows.Next() {
			var live bool
			if err := rows.Scan(&live); err != nil {
				rows.Close()
				return err
			}
			deleted++
			if live {
				res.Purged++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		res.More = p.Scope.Key == "" && deleted >= p.Limit
		return s.pool.QueryRow(ctx, held, args[:3+min(1, len(p.Scope.Key))]...).Scan(&res.Skipped)
	})
	if err != nil {
		return ledger.PurgeResult{}, s.classify("purge", err)
	}
	return res, nil
}

// censusSQL counts the rows by namespace and by the state they read in
// now (Record.View). It reads the whole table: ledgerd runs it every
// --census-interval.
const censusSQL = `SELECT namespace, v, count(*) FROM (
	SELECT namespace, CASE
		WHEN state = 3 OR COALESCE(forget_at, expires_at) <= c.n THEN 0
		WHEN state = 1 AND on_lease_expiry = 1 AND lease_expires_at <= c.n THEN 5
		WHEN state = 1 THEN 1
		WHEN state = 4 OR (state = 2 AND expires_at <= c.n) THEN 4
		ELSE 2 END AS v
	FROM idempotency_records, (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS n) AS c
) AS views WHERE v <> 0 GROUP BY namespace, v`

// CountByState implements ledger.Store.
func (s *Store) CountByState(ctx context.Context) (ledger.Census, error) {
	counts := ledger.Census{}
	err := s.retry(ctx, func(ctx context.Context) error {
		clear(counts)
		rows, err := s.pool.Query(ctx, censusSQL, s.now())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var ns string
			var v, n int
			if err := rows.Scan(&ns, &v, &n); err != nil {
				return err
			}
			if counts[ns] == nil {
				counts[ns] = map[ledger.State]int{}
			}
			counts[ns][censusState[v]] = n
		}
		return rows.Err()
	})
	if err != nil {
		return nil, s.classify("census", err)
	}
	return counts, nil
}

// censusState maps censusSQL's codes to states.
var censusState = map[int]ledger.State{1: ledger.StateInProgress, 2: ledger.StateCompleted, 4: ledger.StateExpired, 5: ledger.StateUnknown}
