package main

// The one-shot database jobs: --migrate-only and the homes.

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/idemledger/idemledger/ledger/crdb"
)

// databaseJob applies the schema migrations (--migrate-only), then the
// homes file (--apply-homes), or prints what the homes file would run
// (--print-homes-sql), and returns: ledgerd as a Job.
func databaseJob(ctx context.Context, cfg config, stdout io.Writer, log *slog.Logger) error {
	homes := cfg.homes
	s, err := crdb.Open(ctx, cfg.databaseURL, crdb.Config{})
	if err != nil {
		return err
	}
	defer s.Close()
	if cfg.migrateOnly {
		applied, err := s.Migrate(ctx)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "schema migrated", "applied", applied, "dialect", s.Dialect().String())
	}
	if cfg.printHomesSQL {
		stmts, err := s.ApplyHomes(ctx, homes, true)
		for _, stmt := range stmts {
			fmt.Fprintln(stdout, stmt+";")
		}
		return err
	}
	if cfg.applyHomes {
		stmts, err := s.ApplyHomes(ctx, homes, false)
		for _, stmt := range stmts {
			log.InfoContext(ctx, "homes: ran", "statement", stmt)
		}
		if err != nil {
			return err
		}
		gen, _, err := s.AppliedHomes(ctx, homes)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "homes applied", "generation", gen, "statements", len(stmts), "file", cfg.homesFile)
	}
	return nil
}
