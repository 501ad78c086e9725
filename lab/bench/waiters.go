package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// WaitersWorkload is the workload of Waiters' results.
const WaitersWorkload = "lookup-wait"

// WaitersTarget names the result of Waiters over api.
func WaitersTarget(api string) string { return "ledgerd/embedded waiters (" + api + ")" }

// Waiters starts the ledgerd binary bin on its embedded store in a
// temporary directory, holds n keys in progress, and sends n Lookups that
// wait for them from this process: through ledgerclient, messages on one
// Stream, as a write service's guard sends them (api "stream"), or as
// unary calls, 250 a connection, under ledgerd's MaxConcurrentStreams of
// 256 (api "unary"). Once ledgerd counts every waiter, it reads what they
// added to its resident memory (VmRSS): the result's RSSAboveIdleMB, with
// WaitersTarget(api), WaitersWorkload, n clients, and the time the
// waiters took to register as its Seconds.
func Waiters(ctx context.Context, bin string, n int, api string) (Result, error) {
	if api != "stream" && api != "unary" {
		return Result{}, fmt.Errorf("bench: waiters over %q: stream or unary", api)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "ledgerbench-waiters-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	l, err := StartLedgerd(ctx, bin, dir)
	if err != nil {
		return Result{}, err
	}
	defer l.Stop()
	p, conn := l.p, l.Conn
	if err := holdKeys(ctx, ledgerv1.NewLedgerServiceClient(conn), n); err != nil {
		return Result{}, err
	}
	idle, err := p.rss()
	if err != nil {
		return Result{}, err
	}

	wait, stopWaiting := context.WithCancel(ctx)
	var calls sync.WaitGroup
	defer func() { stopWaiting(); calls.Wait() }()
	failed := make(chan error, 1) // the first Lookup that ended before the waits were ended
	lookup := func(client ledgerv1.LedgerServiceClient, i int) {
		calls.Go(func() {
			_, err := client.Lookup(wait, &ledgerv1.LookupRequest{Tenant: "acme", Key: heldKey(i), Wait: durationpb.New(time.Minute)})
			if wait.Err() == nil {
				err = cmp.Or(err, errors.New("it answered without waiting"))
				select {
				case failed <- fmt.Errorf("bench: a Lookup of %s ended while its key was held: %w", heldKey(i), err):
				default:
				}
			}
		})
	}
	start := time.Now()
	if api == "stream" {
		client := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
		defer client.Close()
		for i := range n {
			lookup(client, i)
		}
	} else {
		var conns []*grpc.ClientConn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for first := 0; first < n; first += 250 {
			c, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return Result{}, err
			}
			conns = append(conns, c)
			client := ledgerv1.NewLedgerServiceClient(c)
			for i := first; i < min(first+250, n); i++ {
				lookup(client, i)
			}
		}
	}
	// ledgerd's gauge says when every waiter is registered.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(time.Minute); ; {
		m, err := p.metric(ctx, "idemledger_lookup_waiters")
		if err != nil {
			return Result{}, err
		}
		v := m.GetGauge().GetValue()
		if v >= float64(n) {
			break
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("bench: %v of %d waiters registered within a minute", v, n)
		}
		select {
		case <-tick.C:
		case err := <-failed:
			return Result{}, err
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	took := time.Since(start).Seconds()
	used, err := p.rss()
	if err != nil {
		return Result{}, err
	}
	return Result{Target: WaitersTarget(api), Workload: WaitersWorkload, Clients: n, Ops: int64(n), Seconds: took,
		PerSecond: float64(n) / took, RSSAboveIdleMB: float64(used-idle) / (1 << 20)}, nil
}

// heldKey is the i-th key holdKeys holds.
func heldKey(i int) string { return "held-" + strconv.Itoa(i) }

// holdKeys claims n keys, heldKey(0) … heldKey(n-1), and leaves them in
// progress.
func holdKeys(ctx context.Context, client ledgerv1.LedgerServiceClient, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				if _, err := client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: heldKey(i), Fingerprint: fingerprint, Method: method}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
