package fencepgx_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
	"github.com/idemledger/idemledger/interceptors/fence/internal/fencetest"
	"github.com/idemledger/idemledger/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestPgx(t *testing.T) {
	t.Parallel()
	fencetest.Run(t, func(t *testing.T) fencetest.DB {
		pool, err := pgxpool.New(context.Background(), pgtest.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		schema, err := fencetest.Schema()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range schema {
			if _, err := pool.Exec(context.Background(), s); err != nil {
				t.Fatal(err)
			}
		}
		return fencetest.DB{
			Fences: fencepgx.New(pool),
			Begin: func(ctx context.Context) (fencetest.Tx, error) {
				tx, err := pool.Begin(ctx)
				return pgxTx{tx}, err
			},
			Exec: func(ctx context.Context, q string, args ...any) error {
				_, err := pool.Exec(ctx, q, args...)
				return err
			},
			Int: func(ctx context.Context, q string, args ...any) (int, error) {
				var n int
				err := pool.QueryRow(ctx, q, args...).Scan(&n)
				return n, err
			},
		}
	})
}

type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) Exec(ctx context.Context, q string, args ...any) error {
	_, err := t.tx.Exec(ctx, q, args...)
	return err
}
func (t pgxTx) Fence(ctx context.Context, result any) error { return fencepgx.Write(ctx, t.tx, result) }
func (t pgxTx) Commit(ctx context.Context) error            { return t.tx.Commit(ctx) }
func (t pgxTx) Rollback(ctx context.Context) error          { return t.tx.Rollback(ctx) }
