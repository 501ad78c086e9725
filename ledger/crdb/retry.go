package crdb

// Retries and what the database's errors mean to a caller: the
// retry of a statement after a serialization failure, the resolution of an
// ambiguous commit, and the one table of SQLSTATEs.

import (
	"context"
	"errors"
	"fmt"
	"time"

	crdbgo "github.com/cockroachdb/cockroach-go/v2/crdb"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemledger/idemledger/internal/backoff"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// retry runs fn until it succeeds, fails with an error other than a
// serialization failure or a deadlock, or has been retried MaxRetries
// times, sleeping a jittered exponential backoff between attempts. The
// database rolls back a deadlock's victim as a whole, as it does a
// serialization failure's transaction, so running it again is as safe.
// Under load a single-row statement can be the victim: it holds the row
// lock that a third transaction queues on while it waits for a second
// one, which waits for the third (TestTwoInstancesRace, batched).
func (s *Store) retry(ctx context.Context, fn func(context.Context) error) error {
	return s.retrySerialization(ctx, func(ctx context.Context) error {
		err := fn(ctx)
		if sqlState(err) == "40P01" {
			return deadlockVictim{err}
		}
		return err
	})
}

// retrySerialization is retry for serialization failures only; a batch
// uses it, so that a deadlocked batch falls back to its calls' own
// statements at once (runOps). It is crdbgo.ExecuteCtx with backoff:
// ExecuteCtx itself retries at once.
func (s *Store) retrySerialization(ctx context.Context, fn func(context.Context) error) error {
	attempt := 0
	return crdbgo.ExecuteCtx(crdbgo.WithMaxRetries(ctx, s.cfg.MaxRetries), func(ctx context.Context, _ ...any) error {
		if attempt > 0 {
			if err := backoff.Sleep(ctx, s.backoff(attempt)); err != nil {
				return err
			}
		}
		attempt++
		return fn(ctx)
	})
}

// deadlockVictim is a deadlock (SQLSTATE 40P01) made retryable to
// crdbgo.ExecuteCtx, which retries what reports 40001 or CR000; the
// PostgreSQL error stays in the chain for sqlState and classify.
type deadlockVictim struct{ error }

func (deadlockVictim) SQLState() string { return "40001" }

func (e deadlockVictim) Unwrap() error { return e.error }

// retryAmbiguous is retry for statements that are safe to repeat: it also
// runs fn again after an ambiguous commit, once.
func (s *Store) retryAmbiguous(ctx context.Context, fn func(context.Context) error) error {
	err := s.retry(ctx, fn)
	if isAmbiguous(err) {
		err = s.retry(ctx, fn)
	}
	return err
}

func (s *Store) backoff(attempt int) time.Duration {
	return backoff.FullJitter(s.cfg.RetryBase, s.cfg.RetryCap, attempt+1) + time.Microsecond
}

// isAmbiguous reports whether the statement may or may not have committed:
// SQLSTATE 40003 (statement_completion_unknown) or cockroach-go's
// AmbiguousCommitError.
func isAmbiguous(err error) bool {
	if err == nil {
		return false // asked after every claim: nothing to allocate
	}
	var amb *crdbgo.AmbiguousCommitError
	return errors.As(err, &amb) || sqlState(err) == "40003"
}

// sqlState is err's SQLSTATE, "" when it has none. It is asked of every
// statement's return, nil included, where it allocates nothing: the
// target errors.As needs is made only for an error.
func sqlState(err error) string {
	if err == nil {
		return ""
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// sqlStates is the one table of what the database's errors mean to a
// caller, by SQLSTATE: an exact code first, then its class (its first two
// characters). A state in neither, and any other error from the
// database, is INTERNAL: a bug or a schema problem, not worth retrying.
var sqlStates = map[string]errcode.Code{
	"40001": errcode.Contention,      // serialization_failure, past the retries
	"40P01": errcode.Contention,      // deadlock_detected
	"CR000": errcode.Contention,      // CockroachDB: restart the transaction
	"55P03": errcode.Contention,      // lock_not_available: lock_timeout ran out
	"40003": errcode.Unavailable,     // statement_completion_unknown, unresolved
	"57014": errcode.UpstreamTimeout, // query_canceled: statement_timeout, pg_cancel_backend
	"25006": errcode.Unavailable,     // read_only_sql_transaction: a standby, or a read-only database
	"40":    errcode.Contention,      // transaction_rollback
	"08":    errcode.Unavailable,     // connection_exception
	"53":    errcode.Unavailable,     // insufficient_resources: disk full, out of memory, too many connections
	"57":    errcode.Unavailable,     // operator_intervention: shutdown, crash, cannot connect now
	"58":    errcode.Unavailable,     // system_error: I/O error
	"XX":    errcode.Internal,        // internal_error, data_corrupted
}

// classifyState returns what sqlStates says of state, and whether it says
// anything.
func classifyState(state string) (errcode.Code, bool) {
	if c, ok := sqlStates[state]; ok {
		return c, true
	}
	if len(state) == 5 {
		c, ok := sqlStates[state[:2]]
		return c, ok
	}
	return 0, false
}

// classify turns a driver error into the ledger's taxonomy: by SQLSTATE
// (sqlStates), CONTENTION when the retries ran out, UPSTREAM_TIMEOUT for
// context errors, UNAVAILABLE when the database could not be reached,
// INTERNAL for the rest. The hints and messages are every store's
// (ledger.Unavailable, ledger.TimedOut). The cause is kept for logs and
// never shown to callers.
func (s *Store) classify(op string, err error) error {
	var le *errcode.Error
	if errors.As(err, &le) {
		return err
	}
	err = fmt.Errorf("crdb: %s: %w", op, err)
	var maxed *crdbgo.MaxRetriesExceededError
	code, known := classifyState(sqlState(err))
	switch {
	case errors.As(err, &maxed):
		code, known = errcode.Contention, true
	case !known && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		code, known = errcode.UpstreamTimeout, true
	case !known && isUnreachable(err):
		code, known = errcode.Unavailable, true
	}
	switch {
	case !known || code == errcode.Internal:
		return errcode.Wrap(errcode.Internal, err, "internal error")
	case code == errcode.Contention:
		return &errcode.Error{Code: errcode.Contention, Message: "the ledger's store is contended; retry", RetryAfter: s.cfg.RetryCap, Err: err}
	case code == errcode.UpstreamTimeout:
		return ledger.TimedOut(err)
	}
	return ledger.Unavailable(err)
}
