-- Tombstones and HOLD. on_lease_expiry is the policy stored at a
-- record's first claim: 0 TAKEOVER, 1 HOLD (an attempt whose lease ran out
-- is OUTCOME_UNKNOWN until someone resolves it). forget_at is the end of a
-- record's tombstone window: a completed row past expires_at reads as a
-- tombstone (KEY_EXPIRED) until then; rows written before this migration
-- have none (NULL) and end at expires_at. state 4 is EXPIRED: a tombstone
-- whose outcome the sweeper dropped. Adding a column with a constant
-- default rewrites nothing, and neither column is touched by Complete, so
-- it stays a HOT update.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS on_lease_expiry SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS forget_at TIMESTAMPTZ;

-- The sweeper deletes rows past their tombstone window through this index.
CREATE INDEX IF NOT EXISTS idempotency_records_forget_at ON idempotency_records (forget_at);
