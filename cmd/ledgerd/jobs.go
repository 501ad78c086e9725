package main

// The one-shot database jobs: ledgerd migrate and ledgerd homes.

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/idemledger/idemledger/ledger/crdb"
)

// databaseJob applies the schema migrations (ledgerd migrate, or --migrate
// before the homes), then the homes file (ledgerd homes apply), or prints
// what the homes file would run (ledgerd homes print), and returns:
// ledgerd as a Job.
func databaseJob(ctx context.Context, cfg config, stdout io.Writer, log *slog.Logger) error {
	homes := cfg.homes
	s, err := crdb.Open(ctx, cfg.databaseURL, crdb.Config{})
	if err != nil {
		return err
	}
	defer s.Close()
	if cfg.job == "migrate" || cfg.migrate {
		applied, err := s.Migrate(ctx)
		if err != nil {
			return err
		}
		log.InfoContext(ctx, "schema migrated", "applied", applied, "dialect", s.Dialect().String())
	}
	if cfg.job == "homes print" {
		stmts, err := s.ApplyHomes(ctx, homes, true)
		for _, stmt := range stmts {
			fmt.Fprintln(stdout, stmt+";")
		}
		return err
	}
	if cfg.job == "homes apply" {
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
