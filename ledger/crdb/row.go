package crdb

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
		state, policy         int16
		token                 int64
		attempt               int32
		completedAt, forgetAt *time.Time
		outcome               []byte
	)
	rec := &r.rec
	dest := append([]any{&rec.Scope.Namespace, &rec.Scope.Tenant, &rec.Scope.Key, &state, &rec.Method,
		&rec.Fingerprint, &token, &attempt, &rec.CreatedAt, &rec.LeaseExpiresAt, &completedAt,
		&rec.ExpiresAt, &outcome, &r.claimID, &policy, &forgetAt}, extra...)
	if err := sc.Scan(dest...); err != nil {
		return err
	}
	rec.State, rec.Token, rec.Attempt = ledger.State(state), uint64(token), uint32(attempt)
	rec.OnLeaseExpiry = ledger.LeaseExpiry(policy)
	rec.ForgetAt = rec.ExpiresAt // a row of version 1: no tombstone
	if forgetAt != nil {
		rec.ForgetAt = *forgetAt
	}
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
