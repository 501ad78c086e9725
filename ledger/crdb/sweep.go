package crdb

import (
	"context"

	"github.com/idemledger/idemledger/ledger"
)

// Sweep drops the outcomes of up to limit completed rows past their
// retention (they stay as tombstones) and deletes up to limit rows past
// their tombstone window, and returns how many rows it changed, at most
// limit. Reads already treat such rows as tombstones or absent; the sweep
// only frees the space.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	statements := []string{shrinkPostgresSQL, forgetPostgresSQL, forgetVersion1PostgresSQL}
	if s.dialect == Cockroach {
		statements = []string{shrinkCockroachSQL, forgetCockroachSQL}
	}
	n := 0
	for _, sql := range statements {
		if n >= limit {
			break
		}
		err := s.retry(ctx, func(ctx context.Context) error {
			tag, err := s.pool.Exec(ctx, sql, s.now(), limit-n)
			if err == nil {
				n += int(tag.RowsAffected())
			}
			return err
		})
		if err != nil {
			return n, s.classify("sweep", err)
		}
	}
	return min(n, limit), nil
}

// Run sweeps expired rows in batches of Config.SweepBatch every
// Config.SweepInterval until ctx ends; a full batch is followed at once by
// another. It returns nil when ctx ends. A failed sweep is retried at the
// next interval; onError, when not nil, hears of it.
func (s *Store) Run(ctx context.Context, onError func(error)) error {
	return ledger.Sweeps{Interval: s.cfg.SweepInterval, Batch: s.cfg.SweepBatch, Sweep: s.Sweep, OnError: onError}.Run(ctx)
}
