package crdb

import (
	"fmt"
	"regexp"
	"strings"
)

var regionName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// MultiRegionSQL returns the statements that make the records table
// REGIONAL BY ROW on a multi-region CockroachDB database whose regions are
// regions (the first is the primary region). The row's region is computed
// from the tenant, a column of the primary key, so a claim needs no
// cross-region uniqueness check and a tenant's records live in one region.
// The mapping is a stable hash of the tenant over the regions in the order
// given: keep that order when adding regions, and append new ones, or rows
// move. Run it once, after Migrate, as an operator (see deploy/README.md).
func MultiRegionSQL(database string, regions []string, survive string) ([]string, error) {
	if len(regions) == 0 {
		return nil, fmt.Errorf("crdb: multi-region needs at least one region")
	}
	if !regionName.MatchString(database) {
		return nil, fmt.Errorf("crdb: database name %q is not a plain identifier", database)
	}
	for _, r := range regions {
		if !regionName.MatchString(r) {
			return nil, fmt.Errorf("crdb: region %q is not a plain region name", r)
		}
	}
	switch survive {
	case "", "zone":
		survive = "ZONE"
	case "region":
		survive = "REGION"
	default:
		return nil, fmt.Errorf("crdb: survival goal %q is neither zone nor region", survive)
	}
	stmts := []string{fmt.Sprintf(`ALTER DATABASE %s SET PRIMARY REGION "%s"`, database, regions[0])}
	for _, r := range regions[1:] {
		stmts = append(stmts, fmt.Sprintf(`ALTER DATABASE %s ADD REGION IF NOT EXISTS "%s"`, database, r))
	}
	stmts = append(stmts, fmt.Sprintf(`ALTER DATABASE %s SURVIVE %s FAILURE`, database, survive))
	var when strings.Builder
	for i, r := range regions {
		fmt.Fprintf(&when, " WHEN %d THEN '%s'::crdb_internal_region", i, r)
	}
	stmts = append(stmts,
		fmt.Sprintf(`ALTER TABLE idempotency_records ADD COLUMN IF NOT EXISTS crdb_region crdb_internal_region NOT VISIBLE NOT NULL `+
			`AS (CASE mod(fnv32(tenant), %d)%s END) STORED`, len(regions), when.String()),
		`ALTER TABLE idempotency_records SET LOCALITY REGIONAL BY ROW AS crdb_region`,
	)
	return stmts, nil
}
