package invoice

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/proto"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoicedb"
	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
	"github.com/idemledger/idemledger/interceptors/guard"
)

// schema is the service's tables. A service applies them, and the fence
// table's migration (fence.Migrations), with the migration tool it uses;
// the example applies them as it opens the database. invoice_rows has no
// unique constraint on the key: a write the guard failed to deduplicate
// would show as a second row for one key.
const schema = `
CREATE TABLE IF NOT EXISTS invoice_rows (
	tenant   TEXT   NOT NULL,
	number   BIGINT NOT NULL,
	idem_key TEXT   NOT NULL,
	token    BIGINT NOT NULL,
	invoice  BYTEA  NOT NULL,
	PRIMARY KEY (tenant, number)
);
CREATE INDEX IF NOT EXISTS invoice_rows_by_key ON invoice_rows (tenant, idem_key);
CREATE TABLE IF NOT EXISTS invoice_row_numbers (
	tenant TEXT   PRIMARY KEY,
	last   BIGINT NOT NULL
);`

// Postgres is the service's database in PostgreSQL (or CockroachDB): each
// invoice is written in one transaction with its key's fence, the
// response CreateInvoice answers. It is safe for concurrent use.
type Postgres struct {
	pool   *pgxpool.Pool
	fences *fencepgx.Table
	// Unfenced writes invoices without their fence: the lab's chaos run
	// uses it to show what the fence is for.
	Unfenced bool
}

var _ DB = (*Postgres)(nil)

// OpenPostgres connects to the database at url, which holds the tables
// (Migrate).
func OpenPostgres(ctx context.Context, url string) (*Postgres, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	return &Postgres{pool: pool, fences: fencepgx.New(pool)}, nil
}

// Migrate applies the service's tables and the fence table's migration,
// as a service's migration tool would before it starts: DDL takes locks
// that a replica starting beside others writing must not wait on.
func (p *Postgres) Migrate(ctx context.Context) error {
	return invoicedb.ApplySchema(ctx, p.pool, schema)
}

// Close closes the pool.
func (p *Postgres) Close() { p.pool.Close() }

// Fence is the fence table for CreateInvoice's guard.Policy.Fence.
func (p *Postgres) Fence() *fencepgx.Table { return p.fences }

// Write implements DB: the invoice, its number and its key's fence in one
// transaction.
func (p *Postgres) Write(ctx context.Context, c guard.Claim, build func(number int64) *invoicev1.Invoice) (*invoicev1.Invoice, error) {
	var inv *invoicev1.Invoice
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var n int64
		if err := tx.QueryRow(ctx, `INSERT INTO invoice_row_numbers (tenant, last) VALUES ($1, 1)
			ON CONFLICT (tenant) DO UPDATE SET last = invoice_row_numbers.last + 1 RETURNING last`, c.Tenant).Scan(&n); err != nil {
			return err
		}
		inv = build(n)
		b, err := proto.Marshal(inv)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO invoice_rows (tenant, number, idem_key, token, invoice) VALUES ($1, $2, $3, $4, $5)`,
			c.Tenant, n, c.Key, int64(c.Token), b); err != nil { //nolint:gosec // tokens fit a BIGINT
			return err
		}
		if p.Unfenced {
			return nil
		}
		return fencepgx.Write(ctx, tx, &invoicev1.CreateInvoiceResponse{Invoice: inv})
	})
	return inv, err
}

// Find implements DB.
func (p *Postgres) Find(ctx context.Context, tenant, key string) (*invoicev1.Invoice, bool, error) {
	var b []byte
	err := p.pool.QueryRow(ctx, `SELECT invoice FROM invoice_rows WHERE tenant = $1 AND idem_key = $2 ORDER BY number LIMIT 1`, tenant, key).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	inv := &invoicev1.Invoice{}
	return inv, true, proto.Unmarshal(b, inv)
}

// Rows implements DB.
func (p *Postgres) Rows(ctx context.Context) ([]Row, error) {
	rows, err := p.pool.Query(ctx, `SELECT idem_key, token, invoice FROM invoice_rows ORDER BY tenant, number`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		var token int64
		var b []byte
		if err := r.Scan(&row.Key, &token, &b); err != nil {
			return row, err
		}
		row.Token, row.Invoice = uint64(max(token, 0)), &invoicev1.Invoice{}
		return row, proto.Unmarshal(b, row.Invoice)
	})
}
