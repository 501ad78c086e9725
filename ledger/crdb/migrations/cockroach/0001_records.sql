-- The idempotency records. state: 1 IN_PROGRESS, 2 COMPLETED, 3 RELEASED (a
-- tombstone that reads as absent and keeps the token counter).
-- The primary key is hash-sharded so that sequential or similar keys do not
-- pile onto one range. The outcome lives in its own column family, so the
-- lease columns that Begin, Extend and Release touch stay small. Row-level
-- TTL deletes rows once expires_at has passed; reads treat them as absent
-- before that in any case.
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
    CONSTRAINT idempotency_records_pkey PRIMARY KEY (namespace, tenant, idem_key) USING HASH,
    FAMILY lease (namespace, tenant, idem_key, state, method, fingerprint, token, attempt,
                  created_at, lease_expires_at, completed_at, expires_at, claim_id),
    FAMILY result (outcome)
) WITH (ttl_expiration_expression = 'expires_at', ttl_job_cron = '@hourly');
