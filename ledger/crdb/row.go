package crdb

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idemledger/idemledger/ledger"
)

// row is a record as a statement returns it, with the statement's clock.
type row struct {
	rec     ledger.Record
	claimID []byte
	now     time.Time
}

// claimResult reads a row returned by claimSQL: the claim is the caller's
// when the row is IN_PROGRESS and carries the caller's nonce.
func (r row) claimResult(nonce []byte) ledger.ClaimResult {
	res := ledger.ClaimResult{Record: r.rec, Now: r.now}
	res.Claimed = r.rec.State == ledger.StateInProgress && bytes.Equal(r.claimID, nonce)
	if !res.Claimed && !r.rec.Live(r.now) {
		res.Record = ledger.Record{}
	}
	return res
}

// scanner is what QueryRow returns and what rows.Scan offers.
type scanner interface{ Scan(dest ...any) error }

// scanInto scans the record's columns (in the order of columns), then
// extra.
func scanInto(sc scanner, r *row, extra ...any) error {
	var (
		state, policy int16
		token         int64
		attempt       int32
		completedAt   *time.Time
		outcome       []byte
	)
	rec := &r.rec
	dest := append([]any{&rec.Scope.Namespace, &rec.Scope.Tenant, &rec.Scope.Key, &state, &rec.Method,
		&rec.Fingerprint, &token, &attempt, &rec.CreatedAt, &rec.LeaseExpiresAt, &completedAt,
		&rec.ExpiresAt, &outcome, &r.claimID, &policy, &rec.ForgetAt, &rec.KeySource}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return err
	}
	rec.State, rec.Token, rec.Attempt = ledger.State(state), uint64(token), uint32(attempt)
	rec.OnLeaseExpiry = ledger.LeaseExpiry(policy)
	if completedAt != nil {
		rec.CompletedAt = *completedAt
	}
	if outcome != nil {
		rec.Outcome = new(ledger.Outcome)
		if err := rec.Outcome.UnmarshalBinary(outcome); err != nil {
			return fmt.Errorf("decode stored outcome: %w", err)
		}
	}
	return nil
}

// scanOne runs a statement that returns one row of columns and the clock.
func (s *Store) scanOne(ctx context.Context, sql string, args ...any) (row, error) {
	var r row
	err := scanInto(s.pool.QueryRow(ctx, sql, args...), &r, &r.now)
	return r, err
}

// scanCAS runs a compare-and-set statement that returns one row of columns,
// the clock and whether it updated the row.
func (s *Store) scanCAS(ctx context.Context, sql string, args ...any) (row, bool, error) {
	var r row
	var updated bool
	err := scanInto(s.pool.QueryRow(ctx, sql, args...), &r, &r.now, &updated)
	return r, updated, err
}

var _ scanner = pgx.Row(nil)

// scanCASBytes is scanCAS for a statement whose last parameter is bytea
// (an outcome), sent as it is. pgx copies every argument into a buffer of
// its own before it copies it again into the message to the database, and
// drops both buffers after each statement when they are large: for a
// large outcome that is an allocation and a copy of it saved. The other
// arguments are encoded as pgx encodes them, from the statement's
// description (prepared once a connection, by its text).
func (s *Store) scanCASBytes(ctx context.Context, sql string, last []byte, args ...any) (row, bool, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return row{}, false, err
	}
	defer c.Release()
	conn := c.Conn()
	sd, err := conn.Prepare(ctx, sql, sql)
	if err != nil {
		return row{}, false, err
	}
	if len(sd.ParamOIDs) != len(args)+1 || sd.ParamOIDs[len(args)] != pgtype.ByteaOID {
		return row{}, false, fmt.Errorf("crdb: statement's parameter types %v: want %d, bytea last", sd.ParamOIDs, len(args)+1)
	}
	m := conn.TypeMap()
	values := make([][]byte, len(sd.ParamOIDs))
	formats := make([]int16, len(sd.ParamOIDs))
	buf := make([]byte, 0, 128) // not nil: Encode answers nil for NULL only
	for i, arg := range args {
		formats[i] = m.FormatCodeForOID(sd.ParamOIDs[i])
		start := len(buf)
		b, err := m.Encode(sd.ParamOIDs[i], formats[i], arg, buf)
		switch {
		case err != nil:
			return row{}, false, fmt.Errorf("crdb: encode parameter %d: %w", i+1, err)
		case b != nil:
			buf = b
			values[i] = buf[start:len(buf):len(buf)]
		}
	}
	values[len(args)], formats[len(args)] = last, pgtype.BinaryFormatCode
	results := make([]int16, len(sd.Fields))
	for i, f := range sd.Fields {
		results[i] = m.FormatCodeForOID(f.DataTypeOID)
	}
	rows := pgx.RowsFromResultReader(m, conn.PgConn().ExecPrepared(ctx, sd.Name, values, formats, results))
	defer rows.Close()
	if !rows.Next() { // which closes rows
		if err := rows.Err(); err != nil {
			return row{}, false, err
		}
		return row{}, false, pgx.ErrNoRows
	}
	var r row
	var updated bool
	if err := scanInto(rows, &r, &r.now, &updated); err != nil {
		return row{}, false, err
	}
	rows.Close()
	return r, updated, rows.Err()
}
