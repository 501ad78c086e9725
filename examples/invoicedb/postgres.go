package invoicedb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemledger/idemledger/interceptors/fence"
	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
)

// schema is the invoice tables. A service applies them, and the fence
// table's migration (fence.Migrations), with the migration tool it uses;
// the example applies them as it opens the database.
const schema = `
CREATE TABLE IF NOT EXISTS invoices (
	tenant       TEXT        NOT NULL,
	id           TEXT        NOT NULL,
	number       BIGINT      NOT NULL,
	idem_key     TEXT        NOT NULL,
	token        BIGINT      NOT NULL,
	customer     TEXT        NOT NULL,
	currency     TEXT        NOT NULL,
	amount_cents BIGINT      NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS invoices_by_key ON invoices (tenant, idem_key);
CREATE TABLE IF NOT EXISTS invoice_numbers (
	tenant TEXT   PRIMARY KEY,
	last   BIGINT NOT NULL
);`

// Postgres is an invoice database in PostgreSQL (or CockroachDB), whose
// every invoice is written with its key's fence. It is safe for
// concurrent use.
type Postgres struct {
	pool   *pgxpool.Pool
	fences *fencepgx.Table
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

// Migrate applies the invoice tables and the fence table's migration, as
// a service's migration tool would before it starts: DDL takes locks that
// a replica starting beside others writing must not wait on.
func (p *Postgres) Migrate(ctx context.Context) error { return ApplySchema(ctx, p.pool, schema) }

// ApplySchema applies the fence table's migration for PostgreSQL and then
// schema, an example's own tables.
func ApplySchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	fences, err := fs.ReadFile(fence.Migrations, "migrations/postgres/0001_idemledger_fences.up.sql")
	if err == nil {
		_, err = pool.Exec(ctx, string(fences)+";"+schema)
	}
	if err != nil {
		return fmt.Errorf("apply the schema: %w", err)
	}
	return nil
}

// Close closes the pool.
func (p *Postgres) Close() error { p.pool.Close(); return nil }

// Fence implements DB.
func (p *Postgres) Fence() *fencepgx.Table { return p.fences }

// Insert implements DB: the invoice, its number and its key's fence in
// one transaction.
func (p *Postgres) Insert(ctx context.Context, tenant, key string, token uint64, build func(number int64) Invoice, answer func(Invoice) any) (Invoice, error) {
	var inv Invoice
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var n int64
		if err := tx.QueryRow(ctx, `INSERT INTO invoice_numbers (tenant, last) VALUES ($1, 1)
			ON CONFLICT (tenant) DO UPDATE SET last = invoice_numbers.last + 1 RETURNING last`, tenant).Scan(&n); err != nil {
			return err
		}
		inv = build(n)
		if _, err := tx.Exec(ctx, `INSERT INTO invoices (tenant, id, number, idem_key, token, customer, currency, amount_cents, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			tenant, inv.ID, inv.Number, key, int64(token), inv.Customer, inv.Currency, inv.AmountCents, inv.CreatedAt); err != nil { //nolint:gosec // tokens fit a BIGINT
			return err
		}
		return fencepgx.Write(ctx, tx, answer(inv))
	})
	return inv, err
}

const invoiceColumns = `id, number, customer, currency, amount_cents, created_at`

func scanInvoice(row pgx.Row) (Invoice, error) {
	var inv Invoice
	err := row.Scan(&inv.ID, &inv.Number, &inv.Customer, &inv.Currency, &inv.AmountCents, &inv.CreatedAt)
	inv.CreatedAt = inv.CreatedAt.UTC()
	return inv, err
}

// one reads the invoice a query finds, if any.
func (p *Postgres) one(ctx context.Context, sql string, args ...any) (Invoice, bool, error) {
	inv, err := scanInvoice(p.pool.QueryRow(ctx, sql, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return Invoice{}, false, nil
	}
	return inv, err == nil, err
}

// FindByKey implements DB.
func (p *Postgres) FindByKey(ctx context.Context, tenant, key string) (Invoice, bool, error) {
	return p.one(ctx, `SELECT `+invoiceColumns+` FROM invoices WHERE tenant = $1 AND idem_key = $2 ORDER BY number LIMIT 1`, tenant, key)
}

// Get implements DB.
func (p *Postgres) Get(ctx context.Context, tenant, id string) (Invoice, bool, error) {
	return p.one(ctx, `SELECT `+invoiceColumns+` FROM invoices WHERE tenant = $1 AND id = $2`, tenant, id)
}

// List implements DB.
func (p *Postgres) List(ctx context.Context, tenant string) ([]Invoice, error) {
	rows, err := p.pool.Query(ctx, `SELECT `+invoiceColumns+` FROM invoices WHERE tenant = $1 ORDER BY number`, tenant)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Invoice, error) { return scanInvoice(r) })
}

// Rows implements DB.
func (p *Postgres) Rows(ctx context.Context) ([]Row, error) {
	rows, err := p.pool.Query(ctx, `SELECT tenant, idem_key, token, `+invoiceColumns+` FROM invoices ORDER BY tenant, number`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var row Row
		var token int64
		err := r.Scan(&row.Tenant, &row.Key, &token, &row.Invoice.ID, &row.Invoice.Number, &row.Invoice.Customer,
			&row.Invoice.Currency, &row.Invoice.AmountCents, &row.Invoice.CreatedAt)
		row.Token, row.Invoice.CreatedAt = uint64(max(token, 0)), row.Invoice.CreatedAt.UTC()
		return row, err
	})
}
