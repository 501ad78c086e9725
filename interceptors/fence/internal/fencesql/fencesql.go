// Package fencesql is what the fence's drivers share: its statements,
// the same on PostgreSQL and CockroachDB, their arguments, and what their
// answers mean.
package fencesql

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/internal/fencing"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Reserve records a token as the one attempt of a record that may commit
// the key's fence ($1-$3 the scope, $4 the record's creation in µs, $5
// the token, $6 the method, $7 the expiry): over a fence of an earlier
// record, or one of this record that no transaction committed and a lower
// token holds. It returns the fence when it changed it, and no row when
// it did not (Read then says why).
const Reserve = `INSERT INTO idemledger_fences AS f (namespace, tenant, idem_key, record_created_us, token, method, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET
	record_created_us = excluded.record_created_us, token = excluded.token, method = excluded.method,
	outcome = NULL, expires_at = GREATEST(f.expires_at, excluded.expires_at)
WHERE f.record_created_us < excluded.record_created_us
   OR (f.record_created_us = excluded.record_created_us AND f.outcome IS NULL AND f.token < excluded.token)
RETURNING record_created_us, token, outcome`

// Read reads the key's fence ($1-$3 the scope).
const Read = `SELECT record_created_us, token, outcome FROM idemledger_fences
WHERE namespace = $1 AND tenant = $2 AND idem_key = $3`

// Write commits the fence with the write's transaction ($1-$6 as
// Reserve's, $7 the outcome, $8 the expiry). It changes one row when the
// transaction may commit the fence: none was there, or one of an earlier
// record, or this record's reserved for this very token and not yet
// committed. It changes none when another attempt holds the fence or
// committed it, or a later record has it: the transaction must not
// commit.
const Write = `INSERT INTO idemledger_fences AS f (namespace, tenant, idem_key, record_created_us, token, method, outcome, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET
	record_created_us = excluded.record_created_us, token = excluded.token, method = excluded.method,
	outcome = excluded.outcome, expires_at = GREATEST(f.expires_at, excluded.expires_at)
WHERE f.record_created_us < excluded.record_created_us
   OR (f.record_created_us = excluded.record_created_us AND f.token = excluded.token AND f.outcome IS NULL)`

// Sweep deletes up to $2 fences whose expiry is before $1, the oldest
// first.
const Sweep = `DELETE FROM idemledger_fences WHERE (namespace, tenant, idem_key) IN (
	SELECT namespace, tenant, idem_key FROM idemledger_fences WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)`

// Scope is the arguments $1-$3: the record's scope.
func Scope(s fencing.Scope) []any { return []any{s.Namespace, s.Tenant, s.Key} }

// ReserveArgs are Reserve's arguments for token of s's record.
func ReserveArgs(s fencing.Scope, token uint64) ([]any, error) {
	t, err := signed(token)
	if err != nil {
		return nil, err
	}
	return append(Scope(s), s.CreatedAt.UnixMicro(), t, s.Method, s.ExpiresAt), nil
}

// Pending is a fence about to be written in a run's transaction.
type Pending struct {
	Args    []any // Write's
	run     *fencing.Run
	outcome []byte
}

// Prepare is the fence of the fenced run of ctx, with result encoded as
// its outcome; nil outside a fenced run, where there is nothing to write.
func Prepare(ctx context.Context, result any) (*Pending, error) {
	r, ok := fencing.FromContext(ctx)
	if !ok {
		return nil, nil
	}
	outcome, err := r.Encode(result)
	if err != nil {
		return nil, err
	}
	t, err := signed(r.Token)
	if err != nil {
		return nil, errcode.Wrap(errcode.Internal, err, "the fence cannot be written, so the write does not commit")
	}
	return &Pending{Args: append(Scope(r.Scope), r.Scope.CreatedAt.UnixMicro(), t, r.Scope.Method, outcome, r.ExpiresAt()), run: r, outcome: outcome}, nil
}

// Written records what Write did, from the rows it changed: one, the
// fence is written; none, it refused the transaction, and Written returns
// the typed error of a write that must not commit (the driver rolls the
// transaction back).
func (p *Pending) Written(rows int64) error {
	if rows != 1 {
		p.run.Fenced()
		return &errcode.Error{Code: errcode.LeaseLost, Metadata: map[string]string{"token": fmt.Sprint(p.run.Token)},
			Message: "another attempt of this call holds its fence or committed it: this attempt's transaction was rolled back, its write not applied"}
	}
	p.run.Wrote(p.outcome)
	return nil
}

// Row is a row of a query, as *sql.Row and pgx.Row are.
type Row interface{ Scan(dest ...any) error }

// Driver is what the statements of the fence's own transactions need of
// a database: a query of one row, a statement's rows changed, and the
// driver's error for no row.
type Driver struct {
	QueryRow func(ctx context.Context, sql string, args ...any) Row
	Exec     func(ctx context.Context, sql string, args ...any) (rows int64, err error)
	NoRows   error
}

// ReserveFence runs Reserve (and Read, when it changed nothing) for
// token of s's record, retried, and returns the fence as it stands.
func (d Driver) ReserveFence(ctx context.Context, s fencing.Scope, token uint64) (fencing.Row, error) {
	args, err := ReserveArgs(s, token)
	if err != nil {
		return fencing.Row{}, err
	}
	var row fencing.Row
	err = Retry(ctx, func() error {
		var created, tok int64
		var outcome []byte
		err := d.QueryRow(ctx, Reserve, args...).Scan(&created, &tok, &outcome)
		if errors.Is(err, d.NoRows) {
			err = d.QueryRow(ctx, Read, Scope(s)...).Scan(&created, &tok, &outcome)
		}
		row = fencing.Row{RecordCreatedAt: time.UnixMicro(created), Token: uint64(max(tok, 0)), Outcome: outcome}
		return err
	})
	return row, err
}

// SweepFences runs Sweep, retried, and returns the fences it deleted.
func (d Driver) SweepFences(ctx context.Context, now time.Time, batch int) (int, error) {
	var n int64
	err := Retry(ctx, func() error {
		var err error
		n, err = d.Exec(ctx, Sweep, now, batch)
		return err
	})
	return int(n), err
}

// WriteFailed is Write's error when its statement failed: the database
// has aborted the transaction. The cause stays wrapped, so that a
// transaction retry loop sees a serialization failure as one.
func WriteFailed(err error) error {
	return errcode.Wrap(errcode.Unavailable, err, "the fence could not be written, so the write does not commit: retry with the same key")
}

// Retryable reports whether a statement's error asks for the statement
// (or its transaction) again: a serialization failure or a deadlock.
func Retryable(err error) bool {
	var st interface{ SQLState() string }
	if !errors.As(err, &st) {
		return false
	}
	switch st.SQLState() {
	case "40001", "40P01":
		return true
	}
	return false
}

// Tries bounds the tries of a statement that Retryable errors fail.
const Tries = 10

// Retry runs a statement of its own transaction until it ends in
// something other than a retryable error, Tries times at most.
func Retry(ctx context.Context, statement func() error) error {
	for try := 1; ; try++ {
		err := statement()
		if err == nil || !Retryable(err) || try >= Tries {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff.FullJitter(5*time.Millisecond, 200*time.Millisecond, try)):
		}
	}
}

func signed(token uint64) (int64, error) {
	if token > math.MaxInt64 {
		return 0, fmt.Errorf("fence: token %d does not fit a BIGINT", token)
	}
	return int64(token), nil
}
