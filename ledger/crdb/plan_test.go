package crdb

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/internal/pgtest"
)

// TestPlansUseIndexes: on PostgreSQL the store's connections plan each
// statement once (generic plans), at its first run, and keep the plan
// until the table's statistics change. A plan made while the table is
// empty, as it is when a ledger is new, must still find rows by key: the
// table grows under it. Every read of the table in every statement, planned
// on an empty table, is an index lookup on the primary key (the sweep's on
// expires_at, then by row id). Without the store's planner settings the
// batched complete scanned the table, and a new ledger slowed from 3,300 to
// 600 pairs/s within ten seconds.
func TestPlansUseIndexes(t *testing.T) {
	ctx := t.Context()
	s, err := Open(ctx, pgtest.NewDatabase(t), Config{Batching: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Dialect() != Postgres {
		t.Skip("CockroachDB plans statements itself")
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	params := regexp.MustCompile(`\$(\d+)`)
	pkey := "Index Scan using idempotency_records_pkey"
	for _, tc := range []struct {
		name, sql string
		allowed   []string // the reads of the table it may make
	}{
		{"claim", claimSQL, []string{pkey}},
		{"complete", completeSQL, []string{pkey}},
		{"release", releaseSQL, []string{pkey}},
		{"extend", extendSQL, []string{pkey}},
		{"get", getSQL, []string{pkey}},
		{"get many", getManySQL, []string{pkey}},
		{"claim batch", claimBatchSQL, []string{pkey}},
		{"complete batch", completeBatchSQL, []string{pkey}},
		{"resolve", resolveSQL, []string{pkey}},
		{"shrink", shrinkPostgresSQL, []string{"Index Scan using idempotency_records_expires_at", "Tid Scan"}},
		{"forget", forgetPostgresSQL, []string{"Index Scan using idempotency_records_forget_at", "Tid Scan"}},
		{"list a tenant", listTenantSQL, []string{pkey}},
		{"list a namespace", listNamespaceSQL, []string{pkey}},
		{"bound a tenant page", boundTenantSQL, []string{"Index Only Scan using idempotency_records_pkey"}},
		{"bound a namespace page", boundNamespaceSQL, []string{"Index Only Scan using idempotency_records_pkey"}},
		{"list a tenant state", listTenantStateSQL, []string{pkey}},
		{"list a namespace state", listNamespaceStateSQL, []string{pkey}},
		{"list a tenant state up to", listTenantStateUpToSQL, []string{pkey}},
		{"list a namespace state up to", listNamespaceStateUpToSQL, []string{pkey}},
		{"purge a key", purgeKeySQL, []string{pkey}},
		{"held key", heldKeySQL, []string{pkey}},
		{"purge a tenant", purgeTenantPostgresSQL, []string{pkey, "Tid Scan"}},
		{"held in a tenant", heldTenantSQL, []string{pkey}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			for _, m := range params.FindAllStringSubmatch(tc.sql, -1) {
				i, _ := strconv.Atoi(m[1]) // \d+
				n = max(n, i)
			}
			name := "plan_" + strings.ReplaceAll(tc.name, " ", "_")
			if _, err := conn.Exec(ctx, "PREPARE "+name+" AS "+tc.sql); err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE "+name) }()
			nulls := strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ")
			var out string
			if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE "+name+"("+nulls+")").Scan(&out); err != nil {
				t.Fatal(err)
			}
			var plans []struct{ Plan planNode }
			if err := json.Unmarshal([]byte(out), &plans); err != nil || len(plans) != 1 {
				t.Fatalf("EXPLAIN = %s, %v", out, err)
			}
			reads := plans[0].Plan.reads("idempotency_records")
			if len(reads) == 0 {
				t.Fatalf("the plan reads no idempotency_records:\n%s", out)
			}
			for _, r := range reads {
				ok := false
				for _, a := range tc.allowed {
					ok = ok || strings.HasPrefix(r, a+" ") && strings.Contains(r, "Cond: ")
				}
				if !ok {
					t.Errorf("the plan made on an empty table reads the table by %s; want a lookup: %s", r, strings.Join(tc.allowed, " or "))
				}
			}
		})
	}
}

// planNode is a node of EXPLAIN (FORMAT JSON).
type planNode struct {
	NodeType  string     `json:"Node Type"`
	Relation  string     `json:"Relation Name"`
	Index     string     `json:"Index Name"`
	IndexCond string     `json:"Index Cond"`
	TIDCond   string     `json:"TID Cond"`
	Plans     []planNode `json:"Plans"`
}

// reads describes each scan of relation under n: "Index Scan using
// <index> (Cond: ...)", "Seq Scan ()", ...
func (n planNode) reads(relation string) []string {
	var out []string
	if n.Relation == relation && n.NodeType != "ModifyTable" {
		desc := n.NodeType
		if n.Index != "" {
			desc += " using " + n.Index
		}
		var conds []string
		for _, c := range []string{n.IndexCond, n.TIDCond} {
			if c != "" {
				conds = append(conds, "Cond: "+c)
			}
		}
		out = append(out, desc+" ("+strings.Join(conds, ", ")+")")
	}
	for _, c := range n.Plans {
		out = append(out, c.reads(relation)...)
	}
	return out
}
