package crdb

import (
	"context"

	"github.com/idemledger/idemledger/ledger"
)

// Sweep deletes up to limit rows past their retention and returns how many
// it deleted. Reads already treat such rows as absent; the sweep only frees
// the space.
func (s *Store) Sweep(ctx context.Context, limit int) (int, error) {
	sql := sweepPostgresSQL
	if s.dialect == Cockroach {
		sql = sweepCockroachSQL
	}
	var n int64
	err := s.retry(ctx, func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, sql, s.now(), limit)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, s.classify("sweep", err)
	}
	return int(n), nil
}

// Run sweeps expired rows in batches of Config.SweepBatch every
// Config.SweepInterval until ctx ends; a full batch is followed at once by
// another. It returns nil when ctx ends. A failed sweep is retried at the
// next interval; onError, when not nil, hears of it.
func (s *Store) Run(ctx context.Context, onError func(error)) error {
	return ledger.RunSweeps(ctx, s.cfg.SweepInterval, s.cfg.SweepBatch, s.Sweep, onError)
}
