package server_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// readCounter counts the reads of a memory store.
type readCounter struct {
	*memory.Store
	reads atomic.Int64
}

func (s *readCounter) Get(ctx context.Context, sc ledger.Scope) (ledger.Record, error) {
	s.reads.Add(1)
	return s.Store.Get(ctx, sc)
}

func (s *readCounter) GetMany(ctx context.Context, scopes []ledger.Scope) ([]ledger.Record, error) {
	s.reads.Add(1)
	return s.Store.GetMany(ctx, scopes)
}

// BenchmarkLookupWaiters holds n Lookups with a wait on held keys, sent
// as raw calls on Streams of one connection (1,000 a stream, as a client
// with many agents waiting would), and reports what they cost: memory
// (heap and stacks, client and server in this one process) per waiter and
// in all, and the store's reads a second while they wait. The target is
// under 100 MB for 10,000, and a read rate that does not grow with the
// waiters.
func BenchmarkLookupWaiters(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				st := &readCounter{Store: memory.New(memory.Config{})}
				l := ledger.New(st, ledger.Config{MaxWaiters: 2 * n})
				srv := servertest.NewServer(b, servertest.Ledger(server.New(l, server.Config{Auth: testAuth})))
				conn := srv.Dial(b)
				client := streamClient(b, conn, "billing-token")
				for i := range n {
					if _, err := client.Begin(b.Context(), beginReq(fmt.Sprint("held-", i))); err != nil {
						b.Fatal(err)
					}
				}
				var stacks uint64
				inUse := func() uint64 {
					runtime.GC()
					var m runtime.MemStats
					runtime.ReadMemStats(&m)
					stacks = m.StackInuse - stacks
					return m.HeapInuse + m.StackInuse
				}
				before := inUse()
				ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(b.Context(), "authorization", "Bearer billing-token"))
				for first := 0; first < n; first += 1000 {
					st, err := ledgerv1.NewLedgerServiceClient(conn).Stream(ctx)
					if err != nil {
						b.Fatal(err)
					}
					for i := first; i < min(first+1000, n); i++ {
						if err := st.Send(&ledgerv1.StreamRequest{Id: uint64(i + 1), Call: &ledgerv1.StreamRequest_Lookup{Lookup: &ledgerv1.LookupRequest{
							Tenant: "acme", Key: fmt.Sprint("held-", i), Wait: durationpb.New(time.Minute)}}}); err != nil {
							b.Fatal(err)
						}
					}
				}
				ledgertest.Eventually(b, time.Minute, func() bool { return l.Waiters() >= n }, "%d waiting", n)
				reads := st.reads.Load()
				time.Sleep(time.Second) // count the store's reads over a second of real time: what the benchmark reports
				b.ReportMetric(float64(st.reads.Load()-reads), "store-reads/s")
				used := inUse() - before
				b.ReportMetric(float64(used)/float64(n), "bytes/waiter")
				b.ReportMetric(float64(used)/(1<<20), "MB")
				b.ReportMetric(float64(stacks)/(1<<20), "MB-stacks")
				cancel()
			}
		})
	}
}
