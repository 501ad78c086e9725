package crdb

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	crdbgo "github.com/cockroachdb/cockroach-go/v2/crdb"
	crdbpgxv5 "github.com/cockroachdb/cockroach-go/v2/crdb/crdbpgxv5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations
var migrationFS embed.FS

// Migration is one versioned schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations of the dialect, oldest first.
// Their files are named NNNN_name.sql under migrations/<dialect>/.
func Migrations(d Dialect) ([]Migration, error) {
	dir := path.Join("migrations", d.String())
	entries, err := fs.ReadDir(migrationFS, dir)
	if err != nil {
		return nil, fmt.Errorf("crdb: read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		num, name, ok := strings.Cut(strings.TrimSuffix(e.Name(), ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || !strings.HasSuffix(e.Name(), ".sql") {
			return nil, fmt.Errorf("crdb: migration file %s is not named NNNN_name.sql", e.Name())
		}
		b, err := migrationFS.ReadFile(path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("crdb: read migration: %w", err)
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

// migrationLock is the PostgreSQL advisory lock that serialises Migrate
// across instances.
const migrationLock = 0x1de3_1ed9

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS idemledger_schema_migrations (
	version    INT PRIMARY KEY,
	name       TEXT NOT NULL,
	applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// Migrate applies the migrations the database has not seen, each in its own
// transaction with its version row. It is safe to run from two instances at
// once: on PostgreSQL an advisory lock serialises them; on CockroachDB every
// migration is idempotent (IF NOT EXISTS) and the version row's primary key
// lets only one transaction record it. It returns the versions it applied.
func (s *Store) Migrate(ctx context.Context) ([]int, error) {
	ms, err := Migrations(s.dialect)
	if err != nil {
		return nil, err
	}
	var db txBeginner = s.pool
	if s.dialect == Postgres {
		// A session lock, taken before any migration transaction starts, so
		// that each one's snapshot sees what the previous holder applied.
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, s.classify("migrate", err)
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
			return nil, fmt.Errorf("crdb: migration lock: %w", err)
		}
		defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrationLock) }()
		db = conn
	}
	// On PostgreSQL the table is created under the lock: two sessions racing
	// CREATE TABLE IF NOT EXISTS collide on the catalog (23505, 42P07,
	// 42710). On CockroachDB the statement is safe to race.
	if err := s.retry(ctx, func(ctx context.Context) error {
		_, err := db.Exec(ctx, createMigrationsTable)
		return err
	}); err != nil {
		return nil, fmt.Errorf("crdb: create migrations table: %w", err)
	}
	var applied []int
	for _, m := range ms {
		var did bool
		err := s.tx(ctx, db, func(tx pgx.Tx) error {
			did = false
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM idemledger_schema_migrations WHERE version = $1`, m.Version).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO idemledger_schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return err
			}
			did = true
			return nil
		})
		if err != nil {
			return applied, fmt.Errorf("crdb: migration %04d_%s: %w", m.Version, m.Name, err)
		}
		if did {
			applied = append(applied, m.Version)
		}
	}
	return applied, nil
}

// tx runs fn in a serializable transaction, retried as a whole: on
// CockroachDB through crdbpgxv5.ExecuteTx, on PostgreSQL through
// crdbgo.ExecuteCtx around pgx.BeginTxFunc, so a failed COMMIT is never taken
// for a success.
func (s *Store) tx(ctx context.Context, db txBeginner, fn func(pgx.Tx) error) error {
	opts := pgx.TxOptions{IsoLevel: pgx.Serializable}
	if s.dialect == Cockroach {
		return crdbpgxv5.ExecuteTx(crdbgo.WithMaxRetries(ctx, s.cfg.MaxRetries), db, opts, fn)
	}
	return s.retry(ctx, func(ctx context.Context) error {
		return pgx.BeginTxFunc(ctx, db, opts, fn)
	})
}

// txBeginner is a pool or a connection.
type txBeginner interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Begin(ctx context.Context) (pgx.Tx, error)
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}
