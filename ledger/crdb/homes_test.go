package crdb

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

const threeRegions = `# the platform's homes
region us-east1 primary
region europe-west1
region asia-southeast1   # added last
default us-east1
survive region
tenant acme europe-west1
tenant globex asia-southeast1
tenant initech europe-west1
tenant umbrella us-east1
`

func TestParseHomes(t *testing.T) {
	h := mustHomes(t, threeRegions)
	for tenant, want := range map[string]string{
		"acme": "europe-west1", "initech": "europe-west1", "globex": "asia-southeast1",
		"umbrella": "us-east1", "unmapped": "us-east1", "": "us-east1",
	} {
		if got := h.Home(tenant); got != want {
			t.Errorf("Home(%q) = %s, want %s", tenant, got, want)
		}
	}
	if got := h.Regions(); !slices.Equal(got, []string{"us-east1", "europe-west1", "asia-southeast1"}) {
		t.Errorf("Regions = %v", got)
	}
	if h.survive != "region" || h.placement != "default" {
		t.Errorf("survive %s placement %s, want region and default", h.survive, h.placement)
	}
	// The primary need not come first; it is listed first.
	h2 := mustHomes(t, "region b\nregion a primary\ndefault b\n")
	if got := h2.Regions(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Regions = %v, want the primary first", got)
	}
	for name, text := range map[string]string{
		"no region":            "default a\n",
		"no primary":           "region a\ndefault a\n",
		"two primaries":        "region a primary\nregion b primary\ndefault a\n",
		"no default":           "region a primary\n",
		"two defaults":         "region a primary\ndefault a\ndefault a\n",
		"undeclared default":   "region a primary\ndefault b\n",
		"undeclared home":      "region a primary\ndefault a\ntenant x b\n",
		"tenant twice":         "region a primary\ndefault a\ntenant x a\ntenant x a\n",
		"region twice":         "region a primary\nregion a\ndefault a\n",
		"bad region":           "region A_B primary\ndefault A_B\n",
		"quote in region":      "region a\" primary\ndefault a\"\n",
		"quote in tenant":      "region a primary\ndefault a\ntenant x'y a\n",
		"backslash in tenant":  "region a primary\ndefault a\ntenant x\\y a\n",
		"unknown directive":    "region a primary\ndefault a\nhome x a\n",
		"bad survive":          "region a primary\ndefault a\nsurvive planet\n",
		"restricted by region": "region a primary\ndefault a\nsurvive region\nplacement restricted\n",
		"tenant without home":  "region a primary\ndefault a\ntenant x\n",
	} {
		if _, err := ParseHomes(strings.NewReader(text)); err == nil {
			t.Errorf("%s: ParseHomes accepted %q", name, text)
		}
	}
}

// TestPlanHomesCockroach pins the CockroachDB statements of each step.
// They cannot run here: what CockroachDB does with them is named as
// unverified in docs/multi-region.md.
func TestPlanHomesCockroach(t *testing.T) {
	h := mustHomes(t, threeRegions)
	expr := `CASE WHEN tenant IN ('globex') THEN 'asia-southeast1'::crdb_internal_region ` +
		`WHEN tenant IN ('acme', 'initech') THEN 'europe-west1'::crdb_internal_region ` +
		`WHEN tenant IN ('umbrella') THEN 'us-east1'::crdb_internal_region ELSE 'us-east1'::crdb_internal_region END`
	goals := []string{
		`ALTER DATABASE "idemledger" SURVIVE REGION FAILURE`,
		`SET enable_multiregion_placement_policy = on`,
		`ALTER DATABASE "idemledger" PLACEMENT DEFAULT`,
	}
	column := func(gen string) []string {
		return []string{
			`ALTER TABLE idempotency_records ADD COLUMN home_region_` + gen + ` crdb_internal_region NOT VISIBLE NOT NULL AS (` + expr + `) STORED`,
			`ALTER TABLE idempotency_records SET LOCALITY REGIONAL BY ROW AS home_region_` + gen,
			`INSERT INTO idemledger_homes (generation, digest, mapping) VALUES (` + gen + `, '` + h.digest() + `', '` + h.mappingText() + `')`,
		}
	}
	cases := []struct {
		name string
		st   homesState
		want []string
	}{{
		name: "a new database",
		st:   homesState{database: "idemledger"},
		want: slices.Concat([]string{
			`ALTER DATABASE "idemledger" SET PRIMARY REGION "us-east1"`,
			`ALTER DATABASE "idemledger" ADD REGION "europe-west1"`,
			`ALTER DATABASE "idemledger" ADD REGION "asia-southeast1"`,
		}, goals, column("1")),
	}, {
		name: "the same mapping again",
		st: homesState{database: "idemledger", regions: []string{"asia-southeast1", "europe-west1", "us-east1"}, primary: "us-east1",
			columns: []string{"home_region_1"}, generation: 1, digest: h.digest()},
		want: goals,
	}, {
		name: "a region added: no tenant moves",
		st: homesState{database: "idemledger", regions: []string{"europe-west1", "us-east1"}, primary: "us-east1",
			columns: []string{"home_region_1"}, generation: 1, digest: h.digest()},
		want: slices.Concat([]string{`ALTER DATABASE "idemledger" ADD REGION "asia-southeast1"`}, goals),
	}, {
		name: "a tenant moved",
		st: homesState{database: "idemledger", regions: []string{"asia-southeast1", "europe-west1", "us-east1"}, primary: "us-east1",
			columns: []string{"home_region_1"}, generation: 1, digest: "older"},
		want: slices.Concat(goals, column("2"), []string{`ALTER TABLE idempotency_records DROP COLUMN home_region_1`}),
	}, {
		name: "from the hash homing of earlier versions",
		st: homesState{database: "idemledger", regions: []string{"asia-southeast1", "europe-west1", "us-east1"}, primary: "us-east1",
			columns: []string{"crdb_region"}},
		want: slices.Concat(goals, column("1"), []string{`ALTER TABLE idempotency_records DROP COLUMN crdb_region`}),
	}, {
		name: "a run cut short after its column",
		st: homesState{database: "idemledger", regions: []string{"asia-southeast1", "europe-west1", "us-east1"}, primary: "us-east1",
			columns: []string{"home_region_1", "home_region_2"}, generation: 1, digest: "older"},
		want: slices.Concat(goals, column("3"), []string{
			`ALTER TABLE idempotency_records DROP COLUMN home_region_1`, `ALTER TABLE idempotency_records DROP COLUMN home_region_2`}),
	}, {
		name: "a new primary",
		st: homesState{database: "idemledger", regions: []string{"asia-southeast1", "europe-west1", "us-east1"}, primary: "europe-west1",
			columns: []string{"home_region_1"}, generation: 1, digest: h.digest()},
		want: slices.Concat([]string{`ALTER DATABASE "idemledger" SET PRIMARY REGION "us-east1"`}, goals),
	}}
	for _, c := range cases {
		got, err := planHomes(Cockroach, h, c.st)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, strings.Join(got, ";\n     "), strings.Join(c.want, ";\n     "))
		}
	}
	if _, err := planHomes(Cockroach, h, homesState{database: "idemledger", regions: []string{"us-east1", "us-west1"}, primary: "us-east1"}); err == nil {
		t.Error("a database region the file does not declare was planned over")
	}
}

// TestApplyHomes runs the mapping's statements on PostgreSQL: the home
// column is computed for every row (the mapped tenants', the default's),
// a repeat changes nothing, adding a region moves no tenant, and moving a
// tenant moves its rows and only its rows, while its records keep
// replaying the same outcome and new keys keep being claimed.
func TestApplyHomes(t *testing.T) {
	ctx := t.Context()
	url := pgtest.NewDatabase(t)
	s, err := Open(ctx, url, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	pair := func(tenant, key string) {
		t.Helper()
		sc := ledger.Scope{Namespace: "billing", Tenant: tenant, Key: key}
		res, err := l.Begin(ctx, ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
		if err != nil {
			t.Fatal(err)
		}
		if res.Claim == nil {
			if res.Replay == nil || !res.Replay.Outcome.Equal(ledgertest.Response(tenant+"/"+key)) {
				t.Fatalf("%s/%s: Begin = %+v, want the stored outcome", tenant, key, res)
			}
			return
		}
		if _, err := l.Complete(ctx, sc, res.Claim.Token, ledgertest.Response(tenant+"/"+key)); err != nil {
			t.Fatal(err)
		}
	}
	tenants := []string{"acme", "globex", "initech", "umbrella", "hooli"}
	for _, tn := range tenants {
		pair(tn, "before")
	}
	homes := func(column string) map[string]string {
		t.Helper()
		rows, err := s.pool.Query(ctx, `SELECT DISTINCT tenant, `+column+` FROM idempotency_records`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for rows.Next() {
			var tn, r string
			if err := rows.Scan(&tn, &r); err != nil {
				t.Fatal(err)
			}
			if got[tn] != "" {
				t.Fatalf("tenant %s has rows in %s and %s", tn, got[tn], r)
			}
			got[tn] = r
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	apply := func(text string) []string {
		t.Helper()
		stmts, err := s.ApplyHomes(ctx, mustHomes(t, text), false)
		if err != nil {
			t.Fatal(err)
		}
		return stmts
	}

	first := strings.Replace(threeRegions, "region asia-southeast1   # added last\n", "", 1)
	first = strings.Replace(first, "tenant globex asia-southeast1\n", "", 1)
	if stmts := apply(first); len(stmts) != 2 {
		t.Fatalf("the first mapping ran %q, want the column and its record", stmts)
	}
	want := map[string]string{"acme": "europe-west1", "globex": "us-east1", "initech": "europe-west1", "umbrella": "us-east1", "hooli": "us-east1"}
	if got := homes("home_region_1"); !mapsEqual(got, want) {
		t.Fatalf("homes = %v, want %v", got, want)
	}
	if stmts := apply(first); len(stmts) != 0 {
		t.Fatalf("the same mapping again ran %q, want nothing", stmts)
	}
	// A region added, no tenant in it yet: nothing moves.
	added := strings.Replace(first, "region europe-west1\n", "region europe-west1\nregion asia-southeast1\n", 1)
	if stmts := apply(added); len(stmts) != 0 {
		t.Fatalf("adding a region ran %q, want nothing on PostgreSQL (CockroachDB: ADD REGION)", stmts)
	}
	if gen, same, err := s.AppliedHomes(ctx, mustHomes(t, added)); err != nil || gen != 1 || !same {
		t.Fatalf("AppliedHomes = %d, %v, %v; want generation 1, the same", gen, same, err)
	}

	// Move globex to the new region, and write while the move is planned.
	pair("globex", "during")
	stmts := apply(threeRegions)
	if len(stmts) != 3 || !strings.Contains(stmts[2], "DROP COLUMN home_region_1") {
		t.Fatalf("the move ran %q, want a new column, its record and the old column's drop", stmts)
	}
	want["globex"] = "asia-southeast1"
	if got := homes("home_region_2"); !mapsEqual(got, want) {
		t.Fatalf("homes after the move = %v, want %v", got, want)
	}
	if _, same, _ := s.AppliedHomes(ctx, mustHomes(t, first)); same {
		t.Error("AppliedHomes says the old mapping is in place")
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'idempotency_records' AND column_name LIKE 'home_region%'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d home columns (%v), want one", n, err)
	}
	// Every record replays as before; new keys claim and complete.
	for _, tn := range tenants {
		pair(tn, "before")
		pair(tn, "after")
	}
	pair("globex", "during")

	if _, err := s.ApplyHomes(ctx, &Homes{}, false); err == nil {
		t.Error("ApplyHomes took a Homes that no file made")
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
