package crdb

import (
	"context"

	"github.com/idemledger/idemledger/ledger"
)

// SetFollowerReader makes s read its followers through query, which runs
// the follower read's statement and scans its one row into dest: tests
// give it a replica that lags.
func SetFollowerReader(s *Store, query func(ctx context.Context, sql string, args []any, dest []any) error) {
	s.follow = func(ctx context.Context, sc ledger.Scope) (row, error) {
		var r row
		err := scanInto(scanFunc(func(dest ...any) error {
			return query(ctx, followerReadSQL(Postgres, ""), []any{sc.Namespace, sc.Tenant, sc.Key, s.now()}, dest)
		}), &r, &r.now)
		return r, err
	}
}

type scanFunc func(dest ...any) error

func (f scanFunc) Scan(dest ...any) error { return f(dest...) }
