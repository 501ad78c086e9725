package crdb

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"unicode"

	"github.com/jackc/pgx/v5"
)

// Homes is the platform's answer to where each tenant's records live: the
// database's regions, the home of every tenant it names, and a default
// home for the rest. The platform owns it, as a file (ParseHomes); the
// store renders it into the records table's home column (ApplyHomes), so
// that on a multi-region CockroachDB a tenant's records, outcomes
// included, are stored in its home region, and groups its batches by it.
//
// The file, one directive a line ('#' starts a comment):
//
//	region us-east1 primary      # the database's regions; one is the primary
//	region europe-west1
//	region asia-southeast1
//	default us-east1             # the home of a tenant no line names
//	survive zone                 # zone (the default) or region
//	placement default            # default, or restricted: no replica outside the home region
//	tenant acme europe-west1     # a tenant's home
//
// A home moves only when its tenant's line changes (or, for the tenants
// no line names, when the default does): adding a region moves no
// tenant.
type Homes struct {
	regions   []string // as the file lists them
	primary   string
	def       string
	survive   string // "zone" or "region"
	placement string // "default" or "restricted"
	tenants   map[string]string
}

var regionName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// LoadHomes reads the homes file at path.
func LoadHomes(path string) (*Homes, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("crdb: homes: %w", err)
	}
	defer func() { _ = f.Close() }()
	h, err := ParseHomes(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}

// ParseHomes reads a homes file. Every mistake is an error naming its
// line: an unknown directive, a region the file does not declare, a tenant
// named twice, a name that is not plain.
func ParseHomes(r io.Reader) (*Homes, error) {
	h := &Homes{tenants: map[string]string{}}
	declared := map[string]bool{}
	type use struct {
		line   int
		region string
	}
	var uses []use
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("crdb: homes line %d: %s", n, fmt.Sprintf(format, args...))
		}
		switch {
		case f[0] == "region" && (len(f) == 2 || len(f) == 3 && f[2] == "primary"):
			if !regionName.MatchString(f[1]) {
				return nil, bad("region %q is not a plain region name", f[1])
			}
			if declared[f[1]] {
				return nil, bad("region %s is declared twice", f[1])
			}
			declared[f[1]] = true
			h.regions = append(h.regions, f[1])
			if len(f) == 3 {
				if h.primary != "" {
					return nil, bad("a second primary region (%s is the first)", h.primary)
				}
				h.primary = f[1]
			}
		case f[0] == "default" && len(f) == 2:
			if h.def != "" {
				return nil, bad("a second default")
			}
			h.def = f[1]
			uses = append(uses, use{n, f[1]})
		case f[0] == "survive" && len(f) == 2 && (f[1] == "zone" || f[1] == "region"):
			h.survive = f[1]
		case f[0] == "placement" && len(f) == 2 && (f[1] == "default" || f[1] == "restricted"):
			h.placement = f[1]
		case f[0] == "tenant" && len(f) == 3:
			if err := plainTenant(f[1]); err != nil {
				return nil, bad("%v", err)
			}
			if _, dup := h.tenants[f[1]]; dup {
				return nil, bad("tenant %q is named twice", f[1])
			}
			h.tenants[f[1]] = f[2]
			uses = append(uses, use{n, f[2]})
		default:
			return nil, bad("want region NAME [primary], default REGION, survive zone|region, placement default|restricted or tenant NAME REGION; got %q", strings.Join(f, " "))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("crdb: homes: %w", err)
	}
	for _, u := range uses {
		if !declared[u.region] {
			return nil, fmt.Errorf("crdb: homes line %d: region %q is not declared by a region line", u.line, u.region)
		}
	}
	switch {
	case len(h.regions) == 0:
		return nil, fmt.Errorf("crdb: homes: no region line")
	case h.primary == "":
		return nil, fmt.Errorf("crdb: homes: no region is marked primary")
	case h.def == "":
		return nil, fmt.Errorf("crdb: homes: no default line: a tenant no line names needs a home")
	}
	if h.survive == "" {
		h.survive = "zone"
	}
	if h.placement == "" {
		h.placement = "default"
	}
	if h.placement == "restricted" && h.survive == "region" {
		return nil, fmt.Errorf("crdb: homes: placement restricted keeps a row's replicas in its home region, which cannot survive the region's failure: use survive zone")
	}
	return h, nil
}

// plainTenant refuses a tenant name the file's syntax or a SQL literal
// would bend: control characters, and quotes and backslashes (legal in a
// tenant, but no platform names tenants so; refusing them keeps the
// rendered SQL free of escapes).
func plainTenant(t string) error {
	for _, r := range t {
		if unicode.IsControl(r) || r == '\'' || r == '\\' || r == '"' || r == unicode.ReplacementChar {
			return fmt.Errorf("tenant %q has a character a homes file does not take", t)
		}
	}
	return nil
}

// Home returns the region a tenant's records live in.
func (h *Homes) Home(tenant string) string {
	if r, ok := h.tenants[tenant]; ok {
		return r
	}
	return h.def
}

// Regions returns the database's regions, the primary first.
func (h *Homes) Regions() []string {
	out := []string{h.primary}
	for _, r := range h.regions {
		if r != h.primary {
			out = append(out, r)
		}
	}
	return out
}

// homeOf returns a tenant homed in region, for a point read that reaches
// the region's rows: a tenant the mapping names there, or, for the
// default region, the empty tenant (no record has it, and none is named).
func (h *Homes) homeOf(region string) string {
	if region == h.def {
		return ""
	}
	for _, t := range slices.Sorted(maps.Keys(h.tenants)) {
		if h.tenants[t] == region {
			return t
		}
	}
	return ""
}

// expression is the home column's expression over the tenant column:
// one IN list per region with named tenants (sorted, so the same mapping
// renders the same text), the default last. regionType is the type of the
// column's values: crdb_internal_region on CockroachDB, TEXT on
// PostgreSQL.
func (h *Homes) expression(regionType string) string {
	byRegion := map[string][]string{}
	for t, r := range h.tenants {
		byRegion[r] = append(byRegion[r], t)
	}
	var b strings.Builder
	b.WriteString("CASE")
	for _, r := range slices.Sorted(maps.Keys(byRegion)) {
		ts := byRegion[r]
		slices.Sort(ts)
		b.WriteString(" WHEN tenant IN (")
		for i, t := range ts {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("'" + t + "'")
		}
		fmt.Fprintf(&b, ") THEN '%s'::%s", r, regionType)
	}
	fmt.Fprintf(&b, " ELSE '%s'::%s END", h.def, regionType)
	return b.String()
}

// digest names the mapping (the tenants' homes and the default, not the
// regions): two files that home every tenant alike have the same one.
func (h *Homes) digest() string {
	sum := sha256.Sum256([]byte(h.expression("region")))
	return hex.EncodeToString(sum[:8])
}

// homesState is what ApplyHomes reads of the database before it plans.
type homesState struct {
	database   string   // current_database(), CockroachDB only
	regions    []string // the database's regions, CockroachDB only
	primary    string
	columns    []string // the home columns the table has: home_region_N, or crdb_region of the hash homing
	generation int      // the last mapping applied (0: none), and its digest
	digest     string
}

// homeColumn names the home column of a generation.
func homeColumn(generation int) string { return fmt.Sprintf("home_region_%d", generation) }

// mappingText is the mapping as ApplyHomes records it beside its digest:
// the default and the tenants' lines, sorted.
func (h *Homes) mappingText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "default %s\n", h.def)
	for _, t := range slices.Sorted(maps.Keys(h.tenants)) {
		fmt.Fprintf(&b, "tenant %s %s\n", t, h.tenants[t])
	}
	return b.String()
}

// planHomes returns the statements that bring a database in state st to
// h: on CockroachDB its regions, survival goal and placement, then, when
// the mapping is new, a home column of a new generation computed from the
// tenant, the table's locality moved to it (REGIONAL BY ROW AS it), the
// generation recorded, and the columns of older generations dropped. On
// PostgreSQL only the column, its record and the drops: the same
// expression, as TEXT, which homes nothing but is tested here. Each
// statement runs on its own (CockroachDB runs schema changes outside
// explicit transactions); a run cut short is finished by the next one,
// which starts a new generation.
func planHomes(d Dialect, h *Homes, st homesState) ([]string, error) {
	var stmts []string
	if d == Cockroach {
		db := quoteIdent(st.database)
		have := map[string]bool{}
		for _, r := range st.regions {
			have[r] = true
		}
		for _, r := range st.regions {
			if !slices.Contains(h.regions, r) {
				return nil, fmt.Errorf("crdb: the database has region %s, which the homes file does not declare: declare it, or drop it by hand (deploy/README.md)", r)
			}
		}
		if st.primary == "" {
			stmts = append(stmts, fmt.Sprintf(`ALTER DATABASE %s SET PRIMARY REGION %s`, db, quoteIdent(h.primary)))
			have[h.primary] = true
		}
		for _, r := range h.Regions() {
			if !have[r] {
				stmts = append(stmts, fmt.Sprintf(`ALTER DATABASE %s ADD REGION %s`, db, quoteIdent(r)))
			}
		}
		if st.primary != "" && st.primary != h.primary {
			stmts = append(stmts, fmt.Sprintf(`ALTER DATABASE %s SET PRIMARY REGION %s`, db, quoteIdent(h.primary)))
		}
		stmts = append(stmts,
			fmt.Sprintf(`ALTER DATABASE %s SURVIVE %s FAILURE`, db, strings.ToUpper(h.survive)),
			`SET enable_multiregion_placement_policy = on`,
			fmt.Sprintf(`ALTER DATABASE %s PLACEMENT %s`, db, strings.ToUpper(h.placement)))
	}
	current := st.generation > 0 && st.digest == h.digest() && slices.Equal(st.columns, []string{homeColumn(st.generation)})
	if current {
		return stmts, nil
	}
	gen := st.generation + 1
	for _, c := range st.columns {
		var n int
		if _, err := fmt.Sscanf(c, "home_region_%d", &n); err == nil && n >= gen {
			gen = n + 1
		}
	}
	col := homeColumn(gen)
	if d == Cockroach {
		stmts = append(stmts,
			fmt.Sprintf(`ALTER TABLE idempotency_records ADD COLUMN %s crdb_internal_region NOT VISIBLE NOT NULL AS (%s) STORED`,
				col, h.expression("crdb_internal_region")),
			fmt.Sprintf(`ALTER TABLE idempotency_records SET LOCALITY REGIONAL BY ROW AS %s`, col))
	} else {
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE idempotency_records ADD COLUMN %s TEXT GENERATED ALWAYS AS (%s) STORED`,
			col, h.expression("TEXT")))
	}
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO idemledger_homes (generation, digest, mapping) VALUES (%d, '%s', '%s')`,
		gen, h.digest(), h.mappingText()))
	for _, c := range st.columns {
		stmts = append(stmts, fmt.Sprintf(`ALTER TABLE idempotency_records DROP COLUMN %s`, c))
	}
	return stmts, nil
}

// quoteIdent quotes a SQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// ApplyHomes brings the database to the mapping h and returns the
// statements it ran (planHomes), or, with dryRun, would run. Run it after
// Migrate, as a user allowed to alter the database (CockroachDB's
// multi-region statements), once per change of the file; it is safe to
// repeat, and a run that finds the mapping in place only restates the
// database's regions and goals. Moving a tenant rewrites the home column
// of every row (a new column is computed, then the old one dropped): on
// CockroachDB an online schema change that relocates the moved tenants'
// rows, on PostgreSQL a rewrite of the table under its lock.
func (s *Store) ApplyHomes(ctx context.Context, h *Homes, dryRun bool) ([]string, error) {
	if h == nil || h.def == "" {
		return nil, fmt.Errorf("crdb: apply homes: the mapping is empty (use ParseHomes or LoadHomes)")
	}
	st, err := s.homesState(ctx)
	if err != nil {
		return nil, err
	}
	stmts, err := planHomes(s.dialect, h, st)
	if err != nil || dryRun {
		return stmts, err
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, s.classify("apply homes", err)
	}
	// The session setting of placement must hold for the statements after
	// it: one connection for all, destroyed after (it carries the setting).
	defer func() { _ = conn.Conn().Close(context.WithoutCancel(ctx)); conn.Release() }()
	for i, stmt := range stmts {
		if err := s.retry(ctx, func(ctx context.Context) error {
			_, err := conn.Exec(ctx, stmt)
			return err
		}); err != nil {
			return stmts[:i], fmt.Errorf("crdb: apply homes: %s: %w", stmt, err)
		}
	}
	return stmts, nil
}

// AppliedHomes returns the generation and the digest of the mapping last
// applied to the database (0 and "" when none was), and whether h is it.
func (s *Store) AppliedHomes(ctx context.Context, h *Homes) (generation int, same bool, err error) {
	st, err := s.homesState(ctx)
	if err != nil {
		return 0, false, err
	}
	return st.generation, st.generation > 0 && st.digest == h.digest(), nil
}

// homesState reads what planHomes needs.
func (s *Store) homesState(ctx context.Context) (homesState, error) {
	var st homesState
	err := s.retry(ctx, func(ctx context.Context) error {
		st = homesState{}
		rows, err := s.pool.Query(ctx, `SELECT column_name FROM information_schema.columns
			WHERE table_schema = current_schema() AND table_name = 'idempotency_records'
			  AND (column_name LIKE 'home\_region\_%' OR column_name = 'crdb_region')
			ORDER BY column_name`)
		if err != nil {
			return err
		}
		if st.columns, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return err
		}
		err = s.pool.QueryRow(ctx, `SELECT generation, digest FROM idemledger_homes ORDER BY generation DESC LIMIT 1`).Scan(&st.generation, &st.digest)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if s.dialect != Cockroach {
			return nil
		}
		if err := s.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&st.database); err != nil {
			return err
		}
		rows, err = s.pool.Query(ctx, `SELECT region, "primary" FROM [SHOW REGIONS FROM DATABASE] ORDER BY region`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r string
			var primary bool
			if err := rows.Scan(&r, &primary); err != nil {
				return err
			}
			st.regions = append(st.regions, r)
			if primary {
				st.primary = r
			}
		}
		return rows.Err()
	})
	if err != nil {
		return homesState{}, fmt.Errorf("crdb: read the database's homes (run Migrate first): %w", err)
	}
	return st, nil
}
