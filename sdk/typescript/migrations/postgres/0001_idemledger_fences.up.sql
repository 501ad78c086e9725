-- The fences of idemledger's guard (module interceptors/fence): one row a
-- key of a fenced method, written in the transaction of the key's write.
CREATE TABLE IF NOT EXISTS idemledger_fences (
    namespace         TEXT        NOT NULL,
    tenant            TEXT        NOT NULL,
    idem_key          TEXT        NOT NULL,
    -- The ledger record the fence belongs to: its creation, in microseconds
    -- since the Unix epoch. A key claimed again after its record ended
    -- starts a new record with a later one.
    record_created_us BIGINT      NOT NULL,
    -- The attempt that holds the fence (a takeover reserves it) or that
    -- committed it: the ledger's fencing token.
    token             BIGINT      NOT NULL,
    method            TEXT        NOT NULL,
    -- The committed outcome (an idemledger.v1.Outcome's encoding); NULL
    -- while the fence is only reserved.
    outcome           BYTEA,
    -- When the record's outcome is no longer kept: a sweep deletes the row
    -- after it.
    expires_at        TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, tenant, idem_key)
);

CREATE INDEX IF NOT EXISTS idemledger_fences_expires_at ON idemledger_fences (expires_at);
