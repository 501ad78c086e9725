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

// Fill completes n records in namespace "size" and tenant "acme", each
// keyed by a 36-byte key, bound to a v1 fingerprint, with a response of
// outcomeBytes, over 16 goroutines: the records whose stored size the
// stores' tombstone benchmarks measure before and after they shrink.
func Fill(tb testing.TB, l *ledger.Ledger, n, outcomeBytes int) {
	tb.Helper()
	out := Response(string(make([]byte, max(outcomeBytes-3, 0))))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				sc := fillScope(int(i))
				res, err := l.Begin(context.Background(), ledger.BeginRequest{Scope: sc, Fingerprint: Fingerprint(sc.Key), Method: Method})
				if err == nil {
					_, err = l.Complete(context.Background(), sc, res.Claim.Token, out)
				}
				if err != nil {
					tb.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// WantTombstones fails unless every record Fill wrote is a tombstone: a
// record with no outcome that reads as expired.
func WantTombstones(tb testing.TB, s ledger.Store, n int) {
	tb.Helper()
	for i := 1; i <= n; i++ {
		sc := fillScope(i)
		rec, err := s.Get(context.Background(), sc)
		if err != nil || rec.State != ledger.StateExpired || rec.Outcome != nil {
			tb.Fatalf("%s: %+v, %v; want a tombstone", sc.Key, rec, err)
		}
	}
}

func fillScope(i int) ledger.Scope {
	return ledger.Scope{Namespace: "size", Tenant: "acme", Key: fmt.Sprintf("0192f6c4-7d3e-7abc-8def-%012d", i)}
}
