-- Tombstones and HOLD. on_lease_expiry is the policy stored at a
-- record's first claim: 0 TAKEOVER, 1 HOLD. forget_at is the end of a
-- record's tombstone window (NULL for rows written before this
-- migration: they end at expires_at). state 4 is EXPIRED: a tombstone
-- whose outcome the sweeper dropped. Row-level TTL now deletes a row at
-- the end of its tombstone window, not at the end of its retention; the
-- sweeper drops the outcomes of completed rows past their retention
-- through the partial index.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS on_lease_expiry INT2 NOT NULL DEFAULT 0 FAMILY lease;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS forget_at TIMESTAMPTZ FAMILY lease;
CREATE INDEX IF NOT EXISTS idempotency_records_completed_expires_at ON idempotency_records (expires_at) WHERE state = 2;
ALTER TABLE idempotency_records SET (ttl_expiration_expression = 'COALESCE(forget_at, expires_at)');
