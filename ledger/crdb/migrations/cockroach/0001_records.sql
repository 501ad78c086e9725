-- The idempotency records. state: 1 IN_PROGRESS, 2 COMPLETED, 3 RELEASED (a
-- tombstone that reads as absent and keeps the token counter), 4 EXPIRED (a
-- tombstone whose outcome the sweeper dropped). on_lease_expiry is the
-- policy stored at a record's first claim: 0 TAKEOVER, 1 HOLD. expires_at
-- ends a record's retention; forget_at ends its tombstone window. key_source
-- is where the first claim's guard found the key ("argument", "meta",
-- "host:claudecode/toolUseId", "header", ...), for the operators who read
-- the record.
-- The primary key is hash-sharded so that sequential or similar keys do not
-- pile onto one range. The outcome lives in its own column family, so the
-- lease columns that Begin, Extend and Release touch stay small. Row-level
-- TTL deletes a row at the end of its tombstone window; reads treat it as
-- absent before that in any case. The sweeper drops the outcomes of
-- completed rows past their retention through the partial index.
CREATE TABLE IF NOT EXISTS idempotency_records (
    namespace        STRING      NOT NULL,
    tenant           STRING      NOT NULL,
    idem_key         STRING      NOT NULL,
    state            INT2        NOT NULL,
    method           STRING      NOT NULL,
    fingerprint      STRING      NOT NULL,
    token            INT8        NOT NULL,
    attempt          INT4        NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL,
    lease_expires_at TIMESTAMPTZ NOT NULL,
    completed_at     TIMESTAMPTZ,
    expires_at       TIMESTAMPTZ NOT NULL,
    outcome          BYTES,
    claim_id         BYTES       NOT NULL,
    on_lease_expiry  INT2        NOT NULL,
    forget_at        TIMESTAMPTZ NOT NULL,
    key_source       STRING      NOT NULL,
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (namespace, tenant, idem_key) USING HASH,
    FAMILY lease (namespace, tenant, idem_key, state, method, fingerprint, token, attempt,
                  created_at, lease_expires_at, completed_at, expires_at, claim_id,
                  on_lease_expiry, forget_at, key_source),
    FAMILY result (outcome)
) WITH (ttl_expiration_expression = 'forget_at', ttl_job_cron = '@hourly');

CREATE INDEX IF NOT EXISTS idempotency_records_completed_expires_at ON idempotency_records (expires_at) WHERE state = 2;

-- The tenants' home mappings applied by ApplyHomes, one row a generation:
-- the home column home_region_<generation> is computed from the mapping
-- whose digest and text the row keeps.
CREATE TABLE IF NOT EXISTS idemledger_homes (
    generation INT         PRIMARY KEY,
    digest     TEXT        NOT NULL,
    mapping    TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
