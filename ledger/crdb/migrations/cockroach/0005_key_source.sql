-- The key's source: where the first claim's guard found the key
-- ("argument", "meta", "host:claudecode/toolUseId", "header", ...), for
-- the operators who read the record. It is written with the claim, so it
-- lives in the lease family.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS key_source STRING NOT NULL DEFAULT '' FAMILY lease;
