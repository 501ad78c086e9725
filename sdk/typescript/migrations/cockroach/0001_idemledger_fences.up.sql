-- The fences of idemledger's guard (module interceptors/fence): one row a
-- key of a fenced method, written in the transaction of the key's write.
-- The primary key is hash-sharded so that similar keys do not pile onto one
-- range; the outcome lives in its own column family, so that a takeover's
-- reservation touches a small row. Row-level TTL deletes a row once its
-- expires_at has passed, beside the service's own sweep (fence.Sweep).
CREATE TABLE IF NOT EXISTS idemledger_fences (
    namespace         STRING      NOT NULL,
    tenant            STRING      NOT NULL,
    idem_key          STRING      NOT NULL,
    -- The ledger record the fence belongs to: its creation, in microseconds
    -- since the Unix epoch. A key claimed again after its record ended
    -- starts a new record with a later one.
    record_created_us INT8        NOT NULL,
    -- The attempt that holds the fence (a takeover reserves it) or that
    -- committed it: the ledger's fencing token.
    token             INT8        NOT NULL,
    method            STRING      NOT NULL,
    -- The committed outcome (an idemledger.v1.Outcome's encoding); NULL
    -- while the fence is only reserved.
    outcome           BYTES,
    -- When the record's outcome is no longer kept: the row goes after it.
    expires_at        TIMESTAMPTZ NOT NULL,
    CONSTRAINT idemledger_fences_pkey PRIMARY KEY (namespace, tenant, idem_key) USING HASH,
    INDEX idemledger_fences_expires_at (expires_at) USING HASH,
    FAMILY fence (namespace, tenant, idem_key, record_created_us, token, method, expires_at),
    FAMILY result (outcome)
) WITH (ttl_expiration_expression = 'expires_at', ttl_job_cron = '@hourly');
