package bench

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestRetryBacksOffOnSerializationFailures: direct SQL runs a statement
// again after a serialization failure (40001), as ledgerd's store does,
// returns any other error as it is, and stops when its context ends
// during a backoff.
func TestRetryBacksOffOnSerializationFailures(t *testing.T) {
	conflict := &pgconn.PgError{Code: "40001"}
	runs := 0
	err := retry(t.Context(), func() error {
		if runs++; runs < 3 {
			return conflict
		}
		return nil
	})
	if err != nil || runs != 3 {
		t.Fatalf("two conflicts, then success: %v after %d runs; want nil after 3", err, runs)
	}
	other := &pgconn.PgError{Code: "23505"}
	runs = 0
	if err := retry(t.Context(), func() error { runs++; return other }); !errors.Is(err, other) || runs != 1 {
		t.Fatalf("a unique violation: %v after %d runs; want it after 1", err, runs)
	}
	ctx, cancel := context.WithCancel(t.Context())
	runs = 0
	err = retry(ctx, func() error {
		runs++
		cancel()
		return conflict
	})
	if !errors.Is(err, context.Canceled) || runs != 1 {
		t.Fatalf("a conflict as the context ends: %v after %d runs; want context.Canceled after 1", err, runs)
	}
}
