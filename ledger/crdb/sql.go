package crdb

// The statements are the same on CockroachDB and PostgreSQL. Each is one
// statement (an implicit transaction on CockroachDB, one serializable
// statement on PostgreSQL), wrapped in the retry helper.
//
// $1 is always "now": NULL means the database's clock (now()), so ledger
// instances with skewed clocks agree; tests pass a fake clock.

const columns = `namespace, tenant, idem_key, state, method, fingerprint, token, attempt,
	created_at, lease_expires_at, completed_at, expires_at, outcome, claim_id`

const scope = `namespace = $2 AND tenant = $3 AND idem_key = $4`

// claimSQL claims, takes over or returns the row in one round trip.
//
// The proposed row is a fresh IN_PROGRESS claim, or, when first_attempt_at
// ($9) is older than the retention, a RELEASED tombstone with token 0 that
// expired when it was written: so a too-late request never claims, without
// a check-then-insert, and leaves no trace (the next claim still gets token
// 1, and no Release can match it).
// On conflict the row is updated only for a takeover (IN_PROGRESS, live,
// lease expired, same fingerprint) or a re-claim of a row that is no longer
// live (released or expired), and then gets token + 1. Otherwise the
// statement returns the existing row unchanged: the UNION's second half
// reads it at the statement's snapshot. claim_id ($10), a random nonce,
// tells the caller whether the claim is its own, also after an ambiguous
// commit.
const claimSQL = `
WITH v AS (
	SELECT n AS now,
	       n + $7::INT8 * INTERVAL '1 microsecond' AS lease_end,
	       n + GREATEST($7::INT8, $8::INT8) * INTERVAL '1 microsecond' AS expires,
	       ($9::TIMESTAMPTZ IS NOT NULL AND $9::TIMESTAMPTZ < n - $8::INT8 * INTERVAL '1 microsecond') AS too_late
	FROM (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS n) AS c
), ins AS (
	INSERT INTO idempotency_records AS r (` + columns + `)
	SELECT $2, $3, $4, CASE WHEN v.too_late THEN 3 ELSE 1 END, $5, $6,
	       CASE WHEN v.too_late THEN 0 ELSE 1 END, 1, v.now, v.lease_end, NULL,
	       CASE WHEN v.too_late THEN v.now ELSE v.expires END, NULL, $10
	FROM v
	ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET ` + claimConflictSet + `
	RETURNING ` + columns + `
)
SELECT ` + columns + `, (SELECT now FROM v) FROM ins
UNION ALL
SELECT ` + columns + `, (SELECT now FROM v) FROM idempotency_records
WHERE ` + scope + ` AND NOT EXISTS (SELECT 1 FROM ins)`

// claimConflictSet is what a claim does to an existing row: it updates it
// only for a takeover (IN_PROGRESS, live, lease expired, same fingerprint)
// or a re-claim of a row that is no longer live (released or expired), and
// then gives it token + 1.
const claimConflictSet = `
		state            = 1,
		token            = r.token + 1,
		attempt          = CASE WHEN r.state = 1 AND r.expires_at > excluded.created_at THEN r.attempt + 1 ELSE 1 END,
		method           = CASE WHEN r.state = 1 AND r.expires_at > excluded.created_at THEN r.method ELSE excluded.method END,
		fingerprint      = excluded.fingerprint,
		created_at       = CASE WHEN r.state = 1 AND r.expires_at > excluded.created_at THEN r.created_at ELSE excluded.created_at END,
		lease_expires_at = excluded.lease_expires_at,
		completed_at     = NULL,
		expires_at       = CASE WHEN r.state = 1 AND r.expires_at > excluded.created_at
		                        THEN GREATEST(r.expires_at, excluded.lease_expires_at) ELSE excluded.expires_at END,
		outcome          = NULL,
		claim_id         = excluded.claim_id
	WHERE (r.state = 1 AND r.expires_at > excluded.created_at AND r.lease_expires_at <= excluded.created_at
	       AND r.fingerprint = excluded.fingerprint)
	   OR ((r.state = 3 OR r.expires_at <= excluded.created_at) AND excluded.state = 1)`

// casSQL is a compare-and-set on the token ($5) of a live IN_PROGRESS row:
// it applies set, and otherwise returns the row as it is, with the clock and
// whether it updated, so the caller can tell a repeated call from a fenced
// one in the same round trip.
func casSQL(set string) string {
	return `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) AS now),
upd AS (
	UPDATE idempotency_records SET ` + set + `
	WHERE ` + scope + ` AND token = $5 AND state = 1 AND expires_at > (SELECT now FROM v)
	RETURNING ` + columns + `
)
SELECT ` + columns + `, (SELECT now FROM v), true FROM upd
UNION ALL
SELECT ` + columns + `, (SELECT now FROM v), false FROM idempotency_records
WHERE ` + scope + ` AND NOT EXISTS (SELECT 1 FROM upd)`
}

var (
	// completeSQL stores the outcome ($6). It touches no indexed column.
	completeSQL = casSQL(`state = 2, completed_at = (SELECT now FROM v), outcome = $6`)
	// releaseSQL turns the row into a tombstone that reads as absent.
	releaseSQL = casSQL(`state = 3`)
)

// extendSQL renews the lease of token $5 to now + $6 microseconds and keeps
// the row at least as long. expires_at changes only when the lease would
// outlive it.
const extendSQL = `
WITH v AS (SELECT COALESCE($1::TIMESTAMPTZ, now()) + $6::INT8 * INTERVAL '1 microsecond' AS lease_end)
UPDATE idempotency_records
SET lease_expires_at = (SELECT lease_end FROM v),
    expires_at = GREATEST(expires_at, (SELECT lease_end FROM v))
WHERE ` + scope + ` AND token = $5 AND state = 1 AND expires_at > COALESCE($1::TIMESTAMPTZ, now())
RETURNING ` + columns

// getManySQL reads the rows of many scopes ($2, $3, $4: arrays of
// namespaces, tenants and keys) and the clock, in one statement; the
// caller matches them to the scopes and checks that each is live.
const getManySQL = `SELECT ` + columns + `, COALESCE($1::TIMESTAMPTZ, now()) FROM idempotency_records
WHERE (namespace, tenant, idem_key) IN (SELECT * FROM unnest($2::TEXT[], $3::TEXT[], $4::TEXT[]))`

// getSQL reads the row and the clock; the caller checks that it is live.
const getSQL = `SELECT ` + columns + `, COALESCE($1::TIMESTAMPTZ, now()) FROM idempotency_records WHERE ` + scope

// sweepPostgresSQL deletes up to $2 expired rows. PostgreSQL has no DELETE
// ... LIMIT, so it picks them by ctid and skips rows that others hold.
const sweepPostgresSQL = `
DELETE FROM idempotency_records
WHERE ctid IN (
	SELECT ctid FROM idempotency_records
	WHERE expires_at <= COALESCE($1::TIMESTAMPTZ, now())
	LIMIT $2 FOR UPDATE SKIP LOCKED
) AND expires_at <= COALESCE($1::TIMESTAMPTZ, now())`

// sweepCockroachSQL deletes up to $2 expired rows. Row-level TTL does the
// same job on CockroachDB; the sweeper is a fallback and a test hook.
const sweepCockroachSQL = `
DELETE FROM idempotency_records
WHERE expires_at <= COALESCE($1::TIMESTAMPTZ, now())
LIMIT $2`

// Statements are the SQL texts of the store's common path, for tools that
// compare the store with the same SQL sent straight through pgx
// (lab/cmd/ledgerbench). Their arguments:
//   - Claim: now (NULL for the database's), namespace, tenant, key, method,
//     fingerprint, lease µs, retention µs, first_attempt_at (or NULL), nonce;
//   - Complete: now, namespace, tenant, key, token, outcome (Outcome.MarshalBinary);
//   - Release: now, namespace, tenant, key, token.
var Statements = struct{ Claim, Complete, Release string }{claimSQL, completeSQL, releaseSQL}
