ALTER DATABASE idemledger SET PRIMARY REGION "us-east1";
ALTER DATABASE idemledger ADD REGION IF NOT EXISTS "europe-west1";
ALTER DATABASE idemledger ADD REGION IF NOT EXISTS "asia-southeast1";
ALTER DATABASE idemledger SURVIVE REGION FAILURE;
ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS crdb_region crdb_internal_region NOT VISIBLE NOT NULL AS (CASE mod(fnv32(tenant), 3) WHEN 0 THEN 'us-east1'::crdb_internal_region WHEN 1 THEN 'europe-west1'::crdb_internal_region WHEN 2 THEN 'asia-southeast1'::crdb_internal_region END) STORED;
ALTER TABLE idempotency_records SET LOCALITY REGIONAL BY ROW AS crdb_region;
