// Package fencepgx is package fence for pgx: the fence table of a
// *pgxpool.Pool (or any DB), and Write for a pgx.Tx. What the fence
// promises, and how a handler writes it, is package fence's.
package fencepgx

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemledger/idemledger/interceptors/fence/internal/fencesql"
	"github.com/idemledger/idemledger/internal/fencing"
)

// DB runs the statements of the fence's own transactions: a
// *pgxpool.Pool, or a *pgx.Conn that nothing else uses at the same time.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Table is the fence table of a pgx database, for guard.Policy.Fence.
// It is safe for concurrent use when its DB is.
type Table struct {
	d fencesql.Driver
}

// New returns the fence table of db, which must hold the table
// (fence.Migrations).
func New(db DB) *Table {
	return &Table{d: fencesql.Driver{
		QueryRow: func(ctx context.Context, q string, args ...any) fencesql.Row { return db.QueryRow(ctx, q, args...) },
		Exec: func(ctx context.Context, q string, args ...any) (int64, error) {
			tag, err := db.Exec(ctx, q, args...)
			return tag.RowsAffected(), err
		},
		NoRows: pgx.ErrNoRows,
	}}
}

var _ fencing.Table = (*Table)(nil)

// Reserve is the guard's (guard.Policy.Fence): a statement of its own
// transaction.
func (t *Table) Reserve(ctx context.Context, s fencing.Scope, token uint64) (fencing.Row, error) {
	return t.d.ReserveFence(ctx, s, token)
}

// Write is fence.Write for a pgx transaction: it writes the fence of the
// guarded run ctx belongs to in tx, with result, what the handler
// returns. Call it once in each try of the transaction, after the write
// and before the commit. Outside a fenced run it does nothing. Its errors
// are fence.Write's: LEASE_LOST (tx rolled back), UNAVAILABLE (the
// database aborted tx), INTERNAL (tx rolled back).
func Write(ctx context.Context, tx pgx.Tx, result any) error {
	p, err := fencesql.Prepare(ctx, result)
	switch {
	case err != nil:
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	case p == nil:
		return nil
	}
	tag, err := tx.Exec(ctx, fencesql.Write, p.Args...)
	if err != nil {
		return fencesql.WriteFailed(err)
	}
	if err := p.Written(tag.RowsAffected()); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// Sweep deletes up to batch fences that expired before now, the oldest
// first, and returns how many it deleted: call it until it deletes fewer
// than batch, then again later.
func (t *Table) Sweep(ctx context.Context, now time.Time, batch int) (int, error) {
	return t.d.SweepFences(ctx, now, batch)
}
