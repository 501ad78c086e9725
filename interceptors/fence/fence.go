// Package fence makes the effect of a guarded write exact when the write
// lands in the write service's own PostgreSQL or CockroachDB: the run
// writes a fence, a row of its key that holds the claim's token and the
// outcome, in the same transaction as its write, and the guard completes
// the key with that outcome.
//
//	fences := fence.New(db) // *sql.DB; package fencepgx for pgx
//	policy := guard.Policy{Fence: fences}
//
//	// in the handler, under the guard:
//	tx, err := db.BeginTx(ctx, nil)
//	... the write ...
//	if err := fence.Write(ctx, tx, resp); err != nil { // resp: what the handler returns
//		return nil, err // the transaction is rolled back
//	}
//	return resp, tx.Commit()
//
// Then no crash leaves a second effect or an unknown outcome: an attempt
// whose lease was taken over fails at Write (its transaction rolled back,
// a typed LEASE_LOST); a takeover reads the fence before it runs and,
// when an earlier attempt committed and died before Complete, completes
// the key with that attempt's outcome and replays it, its run not called;
// a run that fails after Write (its commit failed, or nobody knows
// whether it did) is settled from the fence.
//
// The table comes as a migration (Migrations: migrations/postgres and
// migrations/cockroach) that the service applies with the tool it already
// uses. Fences are kept as long as their record's outcome; the service
// deletes the expired ones with Sweep (CockroachDB's row-level TTL does it
// too).
//
// What the fence cannot make exact is an effect outside the transaction:
// an email sent, an external API called. Such a method still needs HOLD
// or a reconcile function.
package fence

import (
	"context"
	"database/sql"
	"embed"
	"time"

	"github.com/idemledger/idemledger/interceptors/fence/internal/fencesql"
	"github.com/idemledger/idemledger/internal/fencing"
)

// Migrations holds the fence table's migration for each database, in the
// file names golang-migrate reads: migrations/postgres and
// migrations/cockroach, 0001_idemledger_fences.up.sql and .down.sql.
//
//go:embed migrations
var Migrations embed.FS

// Table is the fence table of a database/sql database, for
// guard.Policy.Fence. It is safe for concurrent use.
type Table struct {
	d fencesql.Driver
}

// New returns the fence table of db, which must hold the table
// (Migrations).
func New(db *sql.DB) *Table {
	return &Table{d: fencesql.Driver{
		QueryRow: func(ctx context.Context, q string, args ...any) fencesql.Row {
			return db.QueryRowContext(ctx, q, args...)
		},
		Exec: func(ctx context.Context, q string, args ...any) (int64, error) {
			res, err := db.ExecContext(ctx, q, args...)
			if err != nil {
				return 0, err
			}
			return res.RowsAffected()
		},
		NoRows: sql.ErrNoRows,
	}}
}

var _ fencing.Table = (*Table)(nil)

// Reserve is the guard's (guard.Policy.Fence): a statement of its own
// transaction.
func (t *Table) Reserve(ctx context.Context, s fencing.Scope, token uint64) (fencing.Row, error) {
	return t.d.ReserveFence(ctx, s, token)
}

// Write writes the fence of the guarded run ctx belongs to in tx, the
// transaction of the run's write, with result: what the handler returns
// (the adapter's response type; an Outcome under guard.Do). Call it once
// in each try of the transaction, after the write and before the commit.
// Outside a fenced run (no fence in the method's policy, or a call with
// no key) it does nothing.
//
// It fails with a typed error, and the write must not commit: LEASE_LOST
// when another attempt holds the fence or committed it (Write has rolled
// tx back), UNAVAILABLE (retryable) when the statement failed (the
// database has aborted tx; a serialization failure stays wrapped for a
// retry loop to see), INTERNAL when result cannot be encoded (Write has
// rolled tx back).
func Write(ctx context.Context, tx *sql.Tx, result any) error {
	p, err := fencesql.Prepare(ctx, result)
	switch {
	case err != nil:
		_ = tx.Rollback()
		return err
	case p == nil:
		return nil
	}
	res, err := tx.ExecContext(ctx, fencesql.Write, p.Args...)
	if err != nil {
		return fencesql.WriteFailed(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fencesql.WriteFailed(err)
	}
	if err := p.Written(n); err != nil {
		_ = tx.Rollback()
		return err
	}
	return nil
}

// Sweep deletes up to batch fences that expired before now, the oldest
// first, and returns how many it deleted: call it until it deletes fewer
// than batch, then again later (a ticker of a minute or so).
func (t *Table) Sweep(ctx context.Context, now time.Time, batch int) (int, error) {
	return t.d.SweepFences(ctx, now, batch)
}
