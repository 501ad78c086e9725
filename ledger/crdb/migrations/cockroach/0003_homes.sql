-- The tenants' home mappings applied by ApplyHomes, one row a generation:
-- the home column home_region_<generation> is computed from the mapping
-- whose digest and text the row keeps.
CREATE TABLE IF NOT EXISTS idemledger_homes (
    generation INT         PRIMARY KEY,
    digest     TEXT        NOT NULL,
    mapping    TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
