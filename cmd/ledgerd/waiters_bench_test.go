package main_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// BenchmarkLookupWaitersRSS holds 10,000 Lookups with a wait on held keys
// of one ledgerd on its embedded store, sent from this process, and
// reports what they add to ledgerd's resident memory (VmRSS): as unary
// calls, 250 a connection (ledgerd's MaxConcurrentStreams is 256), and
// through ledgerclient, as a write service's guard sends them: messages on
// one Stream.
func BenchmarkLookupWaitersRSS(b *testing.B) {
	const n = 10000
	for _, api := range []string{"unary", "ledgerclient"} {
		b.Run(api, func(b *testing.B) {
			for b.Loop() {
				p := start(b, "--data-dir", b.TempDir())
				conn := p.dial(b)
				p.waitServing(b, conn)
				hold(b, ledgerv1.NewLedgerServiceClient(conn), n)
				idle := rss(b, p)
				ctx, cancel := context.WithCancel(b.Context())
				var calls sync.WaitGroup
				if api == "unary" {
					for first := 0; first < n; first += 250 {
						c, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
						if err != nil {
							b.Fatal(err)
						}
						defer c.Close()
						client := ledgerv1.NewLedgerServiceClient(c)
						for i := first; i < min(first+250, n); i++ {
							calls.Go(func() { _, _ = client.Lookup(ctx, waitFor(i)) })
						}
					}
				} else {
					client := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
					defer client.Close()
					for i := range n {
						calls.Go(func() { _, _ = client.Lookup(ctx, waitFor(i)) })
					}
				}
				for deadline := time.Now().Add(time.Minute); metricValue(b, p.metrics(b), "idemledger_lookup_waiters") < n; time.Sleep(50 * time.Millisecond) { // poll ledgerd's gauge until every waiter is registered
					if time.Now().After(deadline) {
						b.Fatal("the waiters did not all register within a minute")
					}
				}
				used := rss(b, p) - idle
				b.ReportMetric(float64(used)/(1<<20), "MB-above-idle")
				b.ReportMetric(float64(used)/n, "bytes/waiter")
				cancel()
				calls.Wait()
			}
		})
	}
}

// hold claims n keys, held-0 … held-(n-1), and leaves them in progress.
func hold(b *testing.B, client ledgerv1.LedgerServiceClient, n int) {
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				if _, err := client.Begin(b.Context(), begin(fmt.Sprint("held-", i))); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

func waitFor(i int) *ledgerv1.LookupRequest {
	return &ledgerv1.LookupRequest{Tenant: "acme", Key: fmt.Sprint("held-", i), Wait: durationpb.New(time.Minute)}
}

// rss is ledgerd's resident memory in bytes.
func rss(b *testing.B, p *proc) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
