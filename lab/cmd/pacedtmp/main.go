// Temporary: paced fresh pairs against a ledgerd, open loop, latency from the due time.
package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/lab/bench"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:17270", "")
	rate := flag.Float64("rate", 300, "pairs a second")
	dur := flag.Duration("duration", 30*time.Second, "")
	prefix := flag.String("prefix", "p", "")
	flag.Parse()
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	sc := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	defer sc.Close()
	op := (&bench.Ledger{Client: sc, Tenant: "acme", Prefix: *prefix}).Fresh()
	ctx := context.Background()
	every := time.Duration(float64(time.Second) / *rate)
	start := time.Now()
	var lat []time.Duration
	errs := 0
	for n := int64(0); ; n++ {
		due := start.Add(time.Duration(n) * every)
		if due.Sub(start) > *dur {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		if err := op(ctx, 0, n); err != nil {
			errs++
		}
		lat = append(lat, time.Since(due))
	}
	slices.Sort(lat)
	q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	fmt.Printf("%d pairs at %.0f/s: p50 %.2f ms p99 %.2f ms p99.9 %.2f ms max %.2f ms errors %d\n", len(lat), *rate,
		float64(q(0.5))/1e6, float64(q(0.99))/1e6, float64(q(0.999))/1e6, float64(lat[len(lat)-1])/1e6, errs)
}
