package crdb_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// counter is a pgx tracer that counts statements.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestReplayIsOneStatement: a replay (and a KEY_REUSED answer) is one
// statement, one round trip and one primary-key lookup: the claim statement
// returns the existing row when it changes nothing.
func TestReplayIsOneStatement(t *testing.T) {
	url := pgtest.NewDatabase(t)
	openURL(t, url, crdb.Config{}, true) // migrate
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var statements counter
	pc.ConnConfig.Tracer = &statements
	pc.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := crdb.New(t.Context(), pool, crdb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(s, ledger.Config{})
	sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k"}
	req := ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
	res, err := l.Begin(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), sc, res.Claim.Token, ledgertest.Response("inv_1")); err != nil {
		t.Fatal(err)
	}

	before := statements.n.Load()
	replay, err := l.Begin(t.Context(), req)
	if err != nil || replay.Replay == nil {
		t.Fatalf("replay = %+v, %v", replay, err)
	}
	if n := statements.n.Load() - before; n != 1 {
		t.Fatalf("a replay took %d statements, want 1", n)
	}
	other := req
	other.Fingerprint = ledgertest.Fingerprint("other")
	before = statements.n.Load()
	_, err = l.Begin(t.Context(), other)
	ledgertest.WantCode(t, err, errcode.KeyReused)
	if n := statements.n.Load() - before; n != 1 {
		t.Fatalf("KEY_REUSED took %d statements, want 1", n)
	}
}
