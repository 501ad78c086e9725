package ledgertest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
)

// Pairs runs op b.N times over clients goroutines, each call on a fresh key,
// and reports the calls per second as pairs/s (a pair being the Begin and
// Complete op usually does).
func Pairs(b *testing.B, clients int, op func(ctx context.Context, key string) error) {
	b.ReportAllocs()
	prefix := fmt.Sprintf("%d-%d-", time.Now().UnixNano(), b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(context.Background(), prefix+fmt.Sprint(i)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pairs/s")
}

// BeginComplete returns an op for Pairs that claims key in namespace
// "bench" and tenant, then completes it with a small response.
func BeginComplete(l *ledger.Ledger, tenant string) func(ctx context.Context, key string) error {
	fp := Fingerprint("payload")
	out := Response("inv_0001")
	return func(ctx context.Context, key string) error {
		sc := ledger.Scope{Namespace: "bench", Tenant: tenant, Key: key}
		res, err := l.Begin(ctx, ledger.BeginRequest{Scope: sc, Fingerprint: fp, Method: Method})
		if err != nil {
			return err
		}
		_, err = l.Complete(ctx, sc, res.Claim.Token, out)
		return err
	}
}
