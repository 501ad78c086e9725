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
	erasable       = `(state <> 1 OR forget_at <= ` + nowArg + `)`
	liveAfterPurge = `state IN (2, 4) AND forget_at > ` + nowArg

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

// The statements of a listing by state. A page by state first finds the
// last row it may read, Scan rows on (an index-only read of the primary
// key), then reads the rows of the state up to it; so it reads at most
// Scan rows whatever the state's share, and returns only the state's.
const (
	boundTenantSQL = `SELECT tenant, idem_key FROM idempotency_records
WHERE namespace = $1 AND tenant = $2 AND idem_key > $3
ORDER BY tenant, idem_key OFFSET $4 LIMIT 2`
	boundNamespaceSQL = `SELECT tenant, idem_key FROM idempotency_records
WHERE namespace = $1 AND (tenant, idem_key) > ($2, $3)
ORDER BY tenant, idem_key OFFSET $4 LIMIT 2`
	inStates = ` AND state = ANY($6::INT2[])`
	upTo     = ` AND (tenant, idem_key) <= ($7, $8)`
	orderBy  = `
ORDER BY tenant, idem_key LIMIT $5`
	listTenantWhere = `SELECT ` + columns + `, ` + nowArg + ` FROM idempotency_records
WHERE namespace = $2 AND tenant = $3 AND idem_key > $4`
	listNamespaceWhere = `SELECT ` + columns + `, ` + nowArg + ` FROM idempotency_records
WHERE namespace = $2 AND (tenant, idem_key) > ($3, $4)`

	listTenantSQL             = listTenantWhere + orderBy
	listNamespaceSQL          = listNamespaceWhere + orderBy
	listTenantStateSQL        = listTenantWhere + inStates + orderBy
	listNamespaceStateSQL     = listNamespaceWhere + inStates + orderBy
	listTenantStateUpToSQL    = listTenantWhere + inStates + upTo + orderBy
	listNamespaceStateUpToSQL = listNamespaceWhere + inStates + upTo + orderBy
)

// storedStates are the stored states of the records that may read in
// state v.
func storedStates(v ledger.State) []int16 {
	switch v {
	case ledger.StateInProgress, ledger.StateUnknown:
		return []int16{int16(ledger.StateInProgress)}
	case ledger.StateCompleted:
		return []int16{int16(ledger.StateCompleted)}
	case ledger.StateExpired:
		return []int16{int16(ledger.StateCompleted), int16(ledger.StateExpired)}
	}
	return nil
}

// List implements ledger.Store, in order of tenant and key.
func (s *Store) List(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	var page ledger.ListPage
	err := s.retry(ctx, func(ctx context.Context) error {
		var err error
		if p.State == ledger.StateAbsent {
			page, err = s.listRows(ctx, p)
		} else {
			page, err = s.listState(ctx, p)
		}
		return err
	})
	if err != nil {
		return ledger.ListPage{}, s.classify("list", err)
	}
	return page, nil
}

// listArgs are a page's first arguments: the clock, the namespace, and
// where the page starts; tenant says whether it lists one tenant.
func (s *Store) listArgs(p ledger.ListParams) (args []any, tenant bool) {
	t, afterKey := p.After.Tenant, p.After.Key
	if p.Tenant != "" {
		t = p.Tenant
		if p.After.Tenant != p.Tenant {
			afterKey = ""
		}
	}
	return []any{s.now(), p.Namespace, t, afterKey}, p.Tenant != ""
}

// pick is the tenant's statement or the namespace's.
func pick(tenant bool, ofTenant, ofNamespace string) string {
	if tenant {
		return ofTenant
	}
	return ofNamespace
}

// listRows reads the next Limit rows.
func (s *Store) listRows(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	args, tenant := s.listArgs(p)
	rows, err := s.pool.Query(ctx, pick(tenant, listTenantSQL, listNamespaceSQL), append(args, p.Limit+1)...)
	if err != nil {
		return ledger.ListPage{}, err
	}
	defer rows.Close()
	var l *ledger.Lister
	for rows.Next() {
		var r row
		if err := scanInto(rows, &r, &r.now); err != nil {
			return ledger.ListPage{}, err
		}
		if l == nil {
			l = ledger.NewLister(p, r.now)
		}
		if l.Full() {
			break
		}
		l.Add(&r.rec)
	}
	if err := rows.Err(); err != nil || l == nil {
		return ledger.ListPage{}, err
	}
	return l.Page, nil
}

// listState reads the rows of the state among the next Scan rows.
func (s *Store) listState(ctx context.Context, p ledger.ListParams) (ledger.ListPage, error) {
	args, tenant := s.listArgs(p)
	var last []ledger.Scope
	brows, err := s.pool.Query(ctx, pick(tenant, boundTenantSQL, boundNamespaceSQL), p.Namespace, args[2], args[3], max(p.Scan, p.Limit)-1)
	if err != nil {
		return ledger.ListPage{}, err
	}
	for brows.Next() {
		sc := ledger.Scope{Namespace: p.Namespace}
		if err := brows.Scan(&sc.Tenant, &sc.Key); err != nil {
			brows.Close()
			return ledger.ListPage{}, err
		}
		last = append(last, sc)
	}
	brows.Close()
	if err := brows.Err(); err != nil {
		return ledger.ListPage{}, err
	}
	sql := pick(tenant, listTenantStateSQL, listNamespaceStateSQL)
	args = append(args, p.Limit+1, storedStates(p.State))
	if len(last) > 0 {
		sql = pick(tenant, listTenantStateUpToSQL, listNamespaceStateUpToSQL)
		args = append(args, last[0].Tenant, last[0].Key)
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return ledger.ListPage{}, err
	}
	defer rows.Close()
	// Only the state's rows come back: the page counts what it keeps.
	page := ledger.ListPage{}
	kept := 0
	for rows.Next() {
		var r row
		if err := scanInto(rows, &r, &r.now); err != nil {
			return ledger.ListPage{}, err
		}
		page.Now = r.now
		if kept == p.Limit {
			page.More = true
			return page, nil
		}
		kept++
		page.Last = r.rec.Scope
		if live, ok := r.rec.AsOf(r.now); ok && live.State == p.State {
			page.Records = append(page.Records, live)
		}
	}
	if err := rows.Err(); err != nil {
		return ledger.ListPage{}, err
	}
	if len(last) > 0 {
		// The page read up to its bound: it resumes there.
		page.Last, page.More = last[0], len(last) > 1
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
		WHEN state = 3 OR forget_at <= c.n THEN 0
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
