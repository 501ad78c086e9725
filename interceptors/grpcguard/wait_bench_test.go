package grpcguard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	testpb "github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/server/servertest"
)

// BenchmarkDuplicateLatency: a write takes 300 ms; a duplicate of it is
// sent once the first attempt runs. Under Wait, the duplicate gets the
// first attempt's outcome when it is stored. Under Reject, it gets
// IN_PROGRESS and its client (idemclient) retries after the hint. Both
// through the ledger's Stream, side by side:
//
//	ms/first      the first attempt's latency
//	ms/duplicate  the duplicate's latency, from when it was sent
//	ms/answered   when the duplicate was answered, from the first attempt's start
func BenchmarkDuplicateLatency(b *testing.B) {
	const write = 300 * time.Millisecond
	for _, bm := range []struct {
		name   string
		policy grpcguard.Method
	}{
		{"Wait", grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Wait}}},
		{"Reject", grpcguard.Method{Policy: guard.Policy{OnInProgress: guard.Reject}}},
	} {
		b.Run(bm.name, func(b *testing.B) {
			running := make(chan struct{}, 1)
			svc := &invoices{create: func(_ context.Context, n int64, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
				running <- struct{}{}
				time.Sleep(write) // the write takes real time: the duplicate's wait for it is what the benchmark measures
				return written(n, req), nil
			}}
			ledger := ledgerclient.New(ledgerv1.NewLedgerServiceClient(servertest.NewServer(b, servertest.Ledger(servertest.MemoryLedger("billing"))).Dial(b)))
			b.Cleanup(func() { _ = ledger.Close() })
			icpt, err := grpcguard.UnaryServerInterceptor(newGuard(b, ledger), protect(bm.policy)...)
			if err != nil {
				b.Fatal(err)
			}
			conn := servertest.NewServer(b, func(gs *grpc.Server) { testpb.RegisterInvoiceServiceServer(gs, svc) }, grpc.UnaryInterceptor(icpt)).
				Dial(b, grpc.WithUnaryInterceptor(idemclient.UnaryClientInterceptor(idemclient.WithKeyField("request_id"), idemclient.WithMaxAttempts(10))))
			client := testpb.NewInvoiceServiceClient(conn)
			var first, dup, answered time.Duration
			for i := 0; b.Loop(); i++ {
				req := request(fmt.Sprintf("k-%d", i))
				start := time.Now()
				var wg sync.WaitGroup
				wg.Go(func() {
					if _, err := client.CreateInvoice(context.Background(), req); err != nil {
						b.Error(err)
					}
					first += time.Since(start)
				})
				<-running
				sent := time.Now()
				if _, err := client.CreateInvoice(context.Background(), req); err != nil {
					b.Fatal(err)
				}
				dup += time.Since(sent)
				answered += time.Since(start)
				wg.Wait()
			}
			n := float64(b.N)
			b.ReportMetric(float64(first.Milliseconds())/n, "ms/first")
			b.ReportMetric(float64(dup.Milliseconds())/n, "ms/duplicate")
			b.ReportMetric(float64(answered.Milliseconds())/n, "ms/answered")
			if svc.runs.Load() != int64(b.N) {
				b.Fatalf("the handler ran %d times for %d intents", svc.runs.Load(), b.N)
			}
		})
	}
}
