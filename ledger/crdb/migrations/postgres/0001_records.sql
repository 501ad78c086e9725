-- The idempotency records. state: 1 IN_PROGRESS, 2 COMPLETED, 3 RELEASED (a
-- tombstone that reads as absent and keeps the token counter), 4 EXPIRED (a
-- tombstone whose outcome the sweeper dropped). on_lease_expiry is the
-- policy stored at a record's first claim: 0 TAKEOVER, 1 HOLD (an attempt
-- whose lease ran out is OUTCOME_UNKNOWN until someone resolves it).
-- expires_at ends a record's retention; forget_at ends its tombstone
-- window: a completed row past expires_at reads as a tombstone
-- (KEY_EXPIRED) until then. key_source is where the first claim's guard
-- found the key ("argument", "meta", "host:claudecode/toolUseId",
-- "header", ...), for the operators who read the record.
-- fillfactor leaves room on each page so that Complete and Release, which
-- touch no indexed column, are HOT updates.
CREATE TABLE IF NOT EXISTS idempotency_records (
    namespace        TEXT        NOT NULL,
    tenant           TEXT        NOT NULL,
    idem_key         TEXT        NOT NULL,
    state            SMALLINT    NOT NULL,
    method           TEXT        NOT NULL,
    fingerprint      TEXT        NOT NULL,
    token            BIGINT      NOT NULL,
    attempt          INTEGER     NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL,
    lease_expires_at TIMESTAMPTZ NOT NULL,
    completed_at     TIMESTAMPTZ,
    expires_at       TIMESTAMPTZ NOT NULL,
    outcome          BYTEA,
    claim_id         BYTEA       NOT NULL,
    on_lease_expiry  SMALLINT    NOT NULL,
    forget_at        TIMESTAMPTZ NOT NULL,
    key_source       TEXT        NOT NULL,
    PRIMARY KEY (namespace, tenant, idem_key)
) WITH (fillfactor = 70);

-- The sweeper drops the outcomes of completed rows past their retention
-- through the first index, and deletes rows past their tombstone window
-- through the second, in small batches.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);
CREATE INDEX IF NOT EXISTS idempotency_records_forget_at ON idempotency_records (forget_at);

-- A large outcome is stored compressed, out of line (TOAST). PostgreSQL's
-- default method, pglz, takes the database several times the CPU of lz4
-- to compress it, for about the same size. lz4 needs PostgreSQL 14 or
-- later built with it (the common packages and the managed services are);
-- on a server without it the column keeps pglz, with a warning in the
-- database's log.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE idempotency_records ALTER COLUMN outcome SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE WARNING 'idemledger: this server has no lz4 compression: outcomes keep pglz';
END
$$;

-- The tenants' home mappings applied by ApplyHomes, one row a generation:
-- the home column home_region_<generation> is computed from the mapping
-- whose digest and text the row keeps.
CREATE TABLE IF NOT EXISTS idemledger_homes (
    generation INT         PRIMARY KEY,
    digest     TEXT        NOT NULL,
    mapping    TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
