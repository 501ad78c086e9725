-- The idempotency records. state: 1 IN_PROGRESS, 2 COMPLETED, 3 RELEASED (a
-- tombstone that reads as absent and keeps the token counter).
-- fillfactor leaves room on each page so that Complete, Release and Extend,
-- which touch no indexed column, are HOT updates.
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
    PRIMARY KEY (namespace, tenant, idem_key)
) WITH (fillfactor = 70);

-- The sweeper deletes expired rows in small batches through this index.
CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON idempotency_records (expires_at);
