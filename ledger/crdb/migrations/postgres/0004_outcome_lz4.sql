-- A large outcome is stored compressed, out of line (TOAST). PostgreSQL's
-- default method, pglz, takes the database several times the CPU of lz4
-- to compress it, for about the same size. lz4 needs PostgreSQL 14 or
-- later built with it (the common packages and the managed services are);
-- on a server without it the column keeps pglz, with a warning in the
-- database's log. Only values written from now on take lz4; the table is
-- not rewritten.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE idempotency_records ALTER COLUMN outcome SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE WARNING 'idemledger: this server has no lz4 compression: outcomes keep pglz';
END
$$;
