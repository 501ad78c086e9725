package crdb

import (
	"context"

	"github.com/idemledger/idemledger/ledger"
)

// Sweep deletes up to limit rows past their tombstone window, then drops
// the outcomes of completed rows past their retention (they stay as
// tombstones), and returns how many rows it changed, at most limit. The
// deletes go first, so that a row past both ends is deleted, not shrunk
// first. Reads already treat such rows as tombstones or absent; the sweep
// only frees the space.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	statements := []string{forgetPostgresSQL, shrinkPostgresSQL}
	if s.dialect == Cockroach {
		statements = []string{forgetCockroachSQL, shrinkCockroachSQL}
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
