-- The key's source: where the first claim's guard found the key
-- ("argument", "meta", "host:claudecode/toolUseId", "header", ...), for
-- the operators who read the record. A column with a constant default
-- rewrites nothing.
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS key_source TEXT NOT NULL DEFAULT '';
