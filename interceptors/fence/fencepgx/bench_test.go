package fencepgx_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
	"github.com/idemledger/idemledger/interceptors/fence/internal/fencetest"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/server/servertest"
)

// BenchmarkGuardedWrite is a guarded write, an INSERT committed in its
// own transaction on a PostgreSQL with its durability settings on, with
// and without its fence, by 1 and 8 clients side by side: what the fence
// adds is one INSERT in the write's transaction. The ledger is the memory
// store over loopback gRPC. Besides ns/op (the clients' throughput), it
// reports each op's p50 in ms.
//
//	go test -run '^$' -bench GuardedWrite -benchtime 3s ./interceptors/fence/fencepgx/
func BenchmarkGuardedWrite(b *testing.B) {
	pg, err := pgtest.StartDurableCluster()
	if err != nil {
		b.Skip(err)
	}
	defer pg.Stop()
	pool, err := pgxpool.New(b.Context(), pg.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	schema, err := fencetest.Schema()
	if err != nil {
		b.Fatal(err)
	}
	for _, s := range schema {
		if _, err := pool.Exec(b.Context(), s); err != nil {
			b.Fatal(err)
		}
	}
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(servertest.NewServer(b, servertest.Ledger(servertest.MemoryLedger("payments"))).Dial(b)))
	if err != nil {
		b.Fatal(err)
	}
	fences := fencepgx.New(pool)
	var keys atomic.Int64
	for _, clients := range []int{1, 8} {
		for _, fenced := range []bool{false, true} {
			name := fmt.Sprintf("clients=%d/fence=%t", clients, fenced)
			b.Run(name, func(b *testing.B) {
				policy := guard.Policy{Lease: 30 * time.Second}
				if fenced {
					policy.Fence = fences
				}
				write := func(ctx context.Context) (guard.Outcome, error) {
					c, _ := guard.ClaimFromContext(ctx)
					out := fencetest.Outcome(1)
					err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
						if _, err := tx.Exec(ctx, "INSERT INTO invoices (idem_key, token, amount) VALUES ($1, $2, 1)", c.Key, int64(c.Token)); err != nil { //nolint:gosec // tokens fit a BIGINT
							return err
						}
						return fencepgx.Write(ctx, tx, out)
					})
					return out, err
				}
				var mu sync.Mutex
				var lat []time.Duration
				one := func() {
					call := fencetest.Call(fmt.Sprint("bench-", keys.Add(1)), policy)
					start := time.Now()
					if _, err := g.Do(b.Context(), call, write); err != nil {
						b.Error(err)
					}
					d := time.Since(start)
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				}
				b.ResetTimer()
				if clients == 1 {
					for b.Loop() {
						one()
					}
				} else {
					b.SetParallelism(max(1, clients/runtime.GOMAXPROCS(0)))
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							one()
						}
					})
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			})
		}
	}
}
