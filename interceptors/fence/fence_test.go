package fence_test

import (
	"bytes"
	"context"
	"database/sql"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the database/sql driver of the tests

	"github.com/idemledger/idemledger/interceptors/fence"
	"github.com/idemledger/idemledger/interceptors/fence/internal/fencetest"
	"github.com/idemledger/idemledger/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestTheNpmPackageShipsTheseMigrations: @idemledger/guard ships the
// fence table's migrations (sdk/typescript/migrations) as this module
// does, byte for byte: one table, whichever guard writes it.
func TestTheNpmPackageShipsTheseMigrations(t *testing.T) {
	t.Parallel()
	n := 0
	err := fs.WalkDir(fence.Migrations, "migrations", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		ours, err := fs.ReadFile(fence.Migrations, path)
		if err != nil {
			return err
		}
		theirs, err := os.ReadFile(filepath.Join("../../sdk/typescript", path))
		if err != nil {
			return err
		}
		if !bytes.Equal(ours, theirs) {
			t.Errorf("sdk/typescript/%s differs from this module's: copy it (cp -r interceptors/fence/migrations sdk/typescript/)", path)
		}
		return nil
	})
	if err != nil || n != 4 {
		t.Fatalf("%d migration files (%v), want 4", n, err)
	}
}

func TestDatabaseSQL(t *testing.T) {
	t.Parallel()
	fencetest.Run(t, func(t *testing.T) fencetest.DB {
		db, err := sql.Open("pgx", pgtest.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		schema, err := fencetest.Schema()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range schema {
			if _, err := db.Exec(s); err != nil {
				t.Fatal(err)
			}
		}
		return fencetest.DB{
			Fences: fence.New(db),
			Begin: func(ctx context.Context) (fencetest.Tx, error) {
				tx, err := db.BeginTx(ctx, nil)
				return sqlTx{tx}, err
			},
			Exec: func(ctx context.Context, q string, args ...any) error {
				_, err := db.ExecContext(ctx, q, args...)
				return err
			},
			Int: func(ctx context.Context, q string, args ...any) (int, error) {
				var n int
				err := db.QueryRowContext(ctx, q, args...).Scan(&n)
				return n, err
			},
		}
	})
}

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, q, args...)
	return err
}
func (t sqlTx) Fence(ctx context.Context, result any) error { return fence.Write(ctx, t.tx, result) }
func (t sqlTx) Commit(context.Context) error                { return t.tx.Commit() }
func (t sqlTx) Rollback(context.Context) error              { return t.tx.Rollback() }
