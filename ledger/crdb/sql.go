package crdb

// The statements are the same on CockroachDB and PostgreSQL. Each is one
// statement (an implicit transaction on CockroachDB, one serializable
// statement on PostgreSQL), wrapped in the retry helper.
//
// $1 is always "now": NULL means the database's clock (now()), so ledger
// instances with skewed clocks agree; tests pass a fake clock.
//
// state: 1 IN_PROGRESS, 2 COMPLETED, 3 RELEASED (reads as absent, keeps the
// token counter), 4 EXPIRED (a tombstone whose outcome the sweeper
// dropped). on_lease_expiry: 0 TAKEOVER, 1 HOLD. expires_at ends a row's
// retention, forget_at its tombstone window.

const columns = `namespace, tenant, idem_key, state, method, fingerprint, token, attempt,
	created_at, lease_expires_at, completed_at, expires_at, outcome, claim_id, on_lease_expiry, forget_at, key_source`

const scope = `namespace = $2 AND tenant = $3 AND idem_key = $4`

// The views of a row (ledger.Record.View) at a time, in SQL. A row reads
// as absent when it is released, forgotten, or an attempt of the TAKEOVER
// policy past its retention (deadAt). A row is held (holdsAt) by its
// current token while it is an attempt that is neither absent nor past
// its tombstone window: IN_PROGRESS, or OUTCOME_UNKNOWN under HOLD.
func deadAt(r, now string) string {
	return `(` + r + `.state = 3 OR ` + r + `.forget_at <= ` + now +
		` OR (` + r + `.state = 1 AND ` + r + `.on_lease_expiry = 0 AND ` + r + `.expires_at <= ` + now + `))`
}

func holdsAt(r, now string) string {
	return `(` + r + `.state = 1 AND (` + r + `.expires_at > ` + now +
		` OR (` + r + `.on_lease_expiry = 1 AND ` + r + `.forget_at > ` + now + `)))`
}

// claimSQL claims, takes over or returns the row in one round trip.
//
// The proposed row is a fresh IN_PROGRESS claim, or, when first_attempt_at
// ($9) is older than the retention and tombstone windows ($8, $12), a
// RELEASED tombstone with token 0 that was forgotten when it was written:
// so a too-late request never claims, without a check-then-insert, and
// leaves no trace (the next claim still gets token 1, and no Release can
// match it). On conflict the row is updated only for a takeover
// (IN_PROGRESS of the TAKEOVER policy, live, lease expired, same
// fingerprint) or a re-claim of a row that reads as absent, and then gets
// token + 1. Otherwise the statement returns the existing row unchanged:
// the UNION's second half reads it at the statement's snapshot. claim_id
// ($10), a random nonce, tells the caller whether the claim is its own,
// also after an ambiguous commit. $11 is the policy, $12 the tombstone
// window in microseconds, $13 the key's source.
var claimSQL = `
WITH v AS (
	SELECT n AS now,
	       n + $7::INT8 * INTERVAL '1 microsecond' AS lease_end,
	       n + GREATEST($7::INT8, $8::INT8) * INTERVAL '1 microsecond' AS expires,
	       n + (GREATEST($7::INT8, $8::INT8) + $12::INT8) * INTERVAL '1 microsecond' AS forget,
	       ($9::TIMESTAMPTZ IS NOT NULL AND $9::TIMESTAMPTZ < n - ($8::INT8 + $12::INT8) * INTERVAL '1 microsecond') AS too_late
	FROM (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS n) AS c
), ins AS (
	INSERT INTO idempotency_records AS r (` + columns + `)
	SELECT $2, $3, $4, CASE WHEN v.too_late THEN 3 ELSE 1 END, $5, $6,
	       CASE WHEN v.too_late THEN 0 ELSE 1 END, 1, v.now, v.lease_end, NULL,
	       CASE WHEN v.too_late THEN v.now ELSE v.expires END, NULL, $10, $11::INT2,
	       CASE WHEN v.too_late THEN v.now ELSE v.forget END, $13::TEXT
	FROM v
	ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET ` + claimConflictSet + `
	RETURNING ` + columns + `
)
SELECT ` + columns + `, (SELECT now FROM v) FROM ins
UNION ALL
SELECT ` + columns + `, (SELECT now FROM v) FROM idempotency_records
WHERE ` + scope + ` AND NOT EXISTS (SELECT 1 FROM ins)`

// claimConflictSet is what a claim does to an existing row: it updates it
// only for a takeover or a re-claim of a row that reads as absent, and
// then gives it token + 1. A takeover keeps the record (its method, its
// creation, its policy, its key's source) and extends its retention and tombstone window to
// cover the new lease; a re-claim starts a new record.
var claimConflictSet = `
		state            = 1,
		token            = r.token + 1,
		attempt          = CASE WHEN ` + takeover + ` THEN r.attempt + 1 ELSE 1 END,
		method           = CASE WHEN ` + takeover + ` THEN r.method ELSE excluded.method END,
		fingerprint      = excluded.fingerprint,
		created_at       = CASE WHEN ` + takeover + ` THEN r.created_at ELSE excluded.created_at END,
		lease_expires_at = excluded.lease_expires_at,
		completed_at     = NULL,
		expires_at       = CASE WHEN ` + takeover + `
		                        THEN GREATEST(r.expires_at, excluded.lease_expires_at) ELSE excluded.expires_at END,
		forget_at        = CASE WHEN ` + takeover + `
		                        THEN r.forget_at + (GREATEST(r.expires_at, excluded.lease_expires_at) - r.expires_at)
		                        ELSE excluded.forget_at END,
		on_lease_expiry  = CASE WHEN ` + takeover + ` THEN r.on_lease_expiry ELSE excluded.on_lease_expiry END,
		key_source       = CASE WHEN ` + takeover + ` THEN r.key_source ELSE excluded.key_source END,
		outcome          = NULL,
		claim_id         = excluded.claim_id
	WHERE (` + takeover + ` AND r.lease_expires_at <= excluded.created_at AND r.fingerprint = excluded.fingerprint)
	   OR (` + deadAt("r", "excluded.created_at") + ` AND excluded.state = 1)`

// takeover is true, in claimConflictSet, of a row that a claim would take
// over rather than re-claim: a live attempt of the TAKEOVER policy.
const takeover = `(r.state = 1 AND r.on_lease_expiry = 0 AND r.expires_at > excluded.created_at)`

// casSQL is a compare-and-set on the token ($5) of a row its holder holds
// (holdsAt): it applies set, and otherwise returns the row as it is, with
// the clock and whether it updated, so the caller can tell a repeated call
// from a fenced one in the same round trip.
func casSQL(set string) string { return casReturning(set, prefixed("r")) }

// casReturning is casSQL whose update returns the columns returning.
func casReturning(set, returning string) string {
	return `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS now),
upd AS (
	UPDATE idempotency_records AS r SET ` + set + `
	WHERE ` + scope + ` AND token = $5 AND ` + holdsAt("r", "(SELECT now FROM v)") + `
	RETURNING ` + returning + `
)
SELECT ` + columns + `, (SELECT now FROM v), true FROM upd
UNION ALL
SELECT ` + columns + `, (SELECT now FROM v), false FROM idempotency_records
WHERE ` + scope + ` AND NOT EXISTS (SELECT 1 FROM upd)`
}

var (
	// completeSQL stores the outcome ($6). It touches no indexed column.
	// When it applies it returns the row without its outcome, which the
	// caller sent (completedColumns).
	completeSQL = casReturning(`state = 2, completed_at = (SELECT now FROM v), outcome = $6`, completedColumns("r"))
	// releaseSQL turns the row into a tombstone that reads as absent.
	releaseSQL = casSQL(`state = 3`)
	// extendSQL renews the lease of token $5 to now + $6 microseconds, and
	// keeps the row, and its tombstone window, at least as long.
	extendSQL = casSQL(`
		lease_expires_at = (SELECT now FROM v) + $6::INT8 * INTERVAL '1 microsecond',
		forget_at = r.forget_at + (GREATEST(r.expires_at, (SELECT now FROM v) + $6::INT8 * INTERVAL '1 microsecond') - r.expires_at),
		expires_at = GREATEST(r.expires_at, (SELECT now FROM v) + $6::INT8 * INTERVAL '1 microsecond')`)
)

// resolveSQL settles a row whose outcome nobody knows: an attempt its
// holder holds whose lease ran out (holdsAt, and lease_expires_at past).
// With $5 true (applied) it completes the row with the outcome $6;
// otherwise it releases it. Like casSQL it returns the row, the clock and
// whether it updated, so the caller can say why it did not.
var resolveSQL = `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS now),
upd AS (
	UPDATE idempotency_records AS r
	SET state = CASE WHEN $5::BOOL THEN 2 ELSE 3 END,
	    completed_at = CASE WHEN $5::BOOL THEN (SELECT now FROM v) END,
	    outcome = $6
	WHERE ` + scope + ` AND r.lease_expires_at <= (SELECT now FROM v) AND ` + holdsAtConst + `
	RETURNING ` + columns + `
)
SELECT ` + columns + `, (SELECT now FROM v), true FROM upd
UNION ALL
SELECT ` + columns + `, (SELECT now FROM v), false FROM idempotency_records
WHERE ` + scope + ` AND NOT EXISTS (SELECT 1 FROM upd)`

// holdsAtConst is holdsAt("r", now) for resolveSQL.
var holdsAtConst = holdsAt("r", "(SELECT now FROM v)")

// getManySQL reads the rows of many scopes ($2, $3, $4: arrays of
// namespaces, tenants and keys) and the clock, in one statement; the
// caller matches them to the scopes and reads each as of the clock.
const getManySQL = `SELECT ` + columns + `, COALESCE($1::TIMESTAMPTZ, now()) FROM idempotency_records
WHERE (namespace, tenant, idem_key) IN (SELECT * FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[]))`

// getSQL reads the row and the clock; the caller reads it as of the clock.
const getSQL = `SELECT ` + columns + `, COALESCE($1::TIMESTAMPTZ, now()) FROM idempotency_records WHERE ` + scope

// The sweeper's statements. forget deletes up to $2 rows past their
// forget_at; shrink, which runs after it, drops the outcomes of up to $2
// completed rows past their retention, which stay as tombstones until
// forget_at. PostgreSQL has no
// UPDATE or DELETE ... LIMIT, so it picks its rows by ctid and skips rows
// that others hold.
const (
	shrinkPostgresSQL = `
UPDATE idempotency_records SET state = 4, outcome = NULL
WHERE ctid IN (
	SELECT ctid FROM idempotency_records
	WHERE expires_at <= COALESCE($1::TIMESTAMPTZ, now()) AND state = 2
	LIMIT $2 FOR UPDATE SKIP LOCKED
) AND state = 2`

	forgetPostgresSQL = `
DELETE FROM idempotency_records
WHERE ctid IN (
	SELECT ctid FROM idempotency_records WHERE forget_at <= COALESCE($1::TIMESTAMPTZ, now())
	LIMIT $2 FOR UPDATE SKIP LOCKED
) AND forget_at <= COALESCE($1::TIMESTAMPTZ, now())`

	shrinkCockroachSQL = `
UPDATE idempotency_records SET state = 4, outcome = NULL
WHERE state = 2 AND expires_at <= COALESCE($1::TIMESTAMPTZ, now())
LIMIT $2`

	// Row-level TTL does the same job on CockroachDB; this is a fallback
	// and a test hook.
	forgetCockroachSQL = `
DELETE FROM idempotency_records
WHERE forget_at <= COALESCE($1::TIMESTAMPTZ, now())
LIMIT $2`
)

// Statements are the SQL texts of the store's common path, for tools that
// compare the store with the same SQL sent straight through pgx
// (lab/cmd/ledgerbench). Their arguments:
//   - Claim: now (NULL for the database's), namespace, tenant, key, method,
//     fingerprint, lease µs, retention µs, first_attempt_at (or NULL),
//     nonce, on_lease_expiry (0 or 1), tombstone retention µs;
//   - Complete: now, namespace, tenant, key, token, outcome (Outcome.MarshalBinary);
//   - Release: now, namespace, tenant, key, token.
var Statements = struct{ Claim, Complete, Release string }{claimSQL, completeSQL, releaseSQL}
