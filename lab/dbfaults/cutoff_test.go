package dbfaults

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// cutoff is how long TestCutOffFromTheDatabase drops every packet between
// ledgerd and its database: 10 s in the tests; the lab run passes
// -cutoff 30s (docs/guarantees.md).
var cutoff = flag.Duration("cutoff", 10*time.Second, "how long the path between ledgerd and PostgreSQL drops every packet")

// The bounds the test holds ledgerd to.
const (
	callDeadline = time.Second // each caller's deadline
	slack        = 200 * time.Millisecond
	notReadyBy   = 8 * time.Second // after the cut: a readiness check every 5 s, each bounded by 2 s
	servingBy    = 8 * time.Second // after the path returns: the checks back off up to 5 s
)

// call is what one caller saw.
type call struct {
	start, end time.Time
	err        error
}

// TestCutOffFromTheDatabase runs ledgerd on PostgreSQL through a fault
// proxy, under a load of claims and completions, and drops every packet
// between them for -cutoff: every call fails closed and typed (a
// retryable UNAVAILABLE or UPSTREAM_TIMEOUT, never an untyped error)
// within its caller's deadline; readiness turns NOT_SERVING within
// notReadyBy of the cut, and SERVING again within servingBy of the path's
// return, when calls succeed again by themselves; and every outcome
// acknowledged, before or during the run, replays afterwards.
func TestCutOffFromTheDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("a cut of -cutoff")
	}
	_, viaProxy, p := proxied(t)
	ld := ledgerdtest.Start(t, "--database-url", viaProxy, "--migrate", "--admin-listen", "", "--http-listen", "")
	conn, err := grpc.NewClient(ld.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client, health := ledgerv1.NewLedgerServiceClient(conn), healthpb.NewHealthClient(conn)
	serving := func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		res, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: ledgerv1.LedgerService_ServiceDesc.ServiceName})
		return err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}
	for deadline := time.Now().Add(30 * time.Second); !serving(); {
		if time.Now().After(deadline) {
			t.Fatal("ledgerd never served")
		}
		time.Sleep(100 * time.Millisecond) // poll the other process until it answers
	}

	var mu sync.Mutex
	var calls []call
	acked := map[string]bool{} // keys whose completion was acknowledged
	write := func(key string) {
		ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
		defer cancel()
		c := call{start: time.Now()}
		res, err := client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.Invoices/Create"})
		if err == nil && res.GetClaim() != nil {
			_, err = client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: res.GetClaim().GetToken(),
				Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte(key)}}}})
		}
		c.end, c.err = time.Now(), err
		mu.Lock()
		calls = append(calls, c)
		if err == nil && res.GetClaim() != nil {
			acked[key] = true
		}
		mu.Unlock()
	}
	for i := range 20 {
		write(fmt.Sprintf("before-%02d", i))
	}

	// The load: four callers, a fresh key each call, until stopped.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				write(fmt.Sprintf("load-%d-%05d", w, i))
			}
		})
	}
	// Readiness, every 100 ms.
	type probe struct {
		at      time.Time
		serving bool
	}
	var probes []probe
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			s := serving()
			mu.Lock()
			probes = append(probes, probe{time.Now(), s})
			mu.Unlock()
		}
	}()

	time.Sleep(time.Second) // load before the cut
	cutAt := time.Now()
	p.SetBlackhole(true)
	time.Sleep(*cutoff)
	backAt := time.Now()
	p.SetBlackhole(false)
	var servingAgain time.Time
	for deadline := backAt.Add(60 * time.Second); time.Now().Before(deadline); {
		mu.Lock()
		for _, pr := range probes {
			if pr.at.After(backAt) && pr.serving && servingAgain.IsZero() {
				servingAgain = pr.at
			}
		}
		mu.Unlock()
		if !servingAgain.IsZero() && time.Since(servingAgain) > 2*time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond) // poll the other process until it answers
	}
	close(stop)
	wg.Wait()
	<-probed

	// Every call: done, or failed closed, typed and retryable, in time.
	byCode := map[string]int{}
	var longest time.Duration
	var done []time.Time // when each call that succeeded ended
	for _, c := range calls {
		took := c.end.Sub(c.start)
		longest = max(longest, took)
		switch {
		case c.err == nil:
			byCode["OK"]++
			done = append(done, c.end)
		case !ledgerstatus.IsTyped(c.err):
			t.Errorf("a call failed untyped after %s: %v", took, c.err)
		default:
			le := ledgerstatus.FromError(c.err)
			byCode[le.Code.String()]++
			if !le.Retryable() || (le.Code != errcode.Unavailable && le.Code != errcode.UpstreamTimeout) {
				t.Errorf("a call failed %v, want a retryable UNAVAILABLE or UPSTREAM_TIMEOUT", c.err)
			}
		}
		if took > callDeadline+slack {
			t.Errorf("a call took %s, past its deadline of %s", took, callDeadline)
		}
	}
	var notServing, servingBack time.Time
	for _, pr := range probes {
		if pr.at.After(cutAt) && !pr.serving && notServing.IsZero() {
			notServing = pr.at
		}
	}
	servingBack = servingAgain
	switch {
	case notServing.IsZero() || notServing.Sub(cutAt) > notReadyBy:
		t.Errorf("readiness did not turn NOT_SERVING within %s of the cut (at %v)", notReadyBy, notServing.Sub(cutAt))
	case servingBack.IsZero() || servingBack.Sub(backAt) > servingBy:
		t.Errorf("readiness did not turn SERVING within %s of the path's return (at %v)", servingBy, servingBack.Sub(backAt))
	}
	// The gap: the longest time in which no call succeeded, and how long
	// after the path's return the first did.
	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	var gap, firstAfter time.Duration = 0, -1
	for i := 1; i < len(done); i++ {
		gap = max(gap, done[i].Sub(done[i-1]))
		if firstAfter < 0 && done[i].After(backAt) {
			firstAfter = done[i].Sub(backAt)
		}
	}
	if firstAfter < 0 {
		t.Error("no call succeeded after the path returned")
	}

	// Every acknowledged outcome replays.
	lost := 0
	for key := range acked {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		res, err := client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.Invoices/Create"})
		cancel()
		if err != nil || string(res.GetReplay().GetOutcome().GetResponse().GetValue()) != key {
			lost++
			t.Errorf("the acknowledged %s after the cut: %v, %v", key, res, err)
		}
	}
	codes := make([]string, 0, len(byCode))
	for c, n := range byCode {
		codes = append(codes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(codes)
	t.Logf("cut %s: %d calls (%v); longest call %s; NOT_SERVING %s after the cut, SERVING %s after the path returned; "+
		"the longest time without a call done %s, the first done %s after the path returned; %d acknowledged outcomes checked, %d lost",
		*cutoff, len(calls), codes, longest.Round(time.Millisecond), notServing.Sub(cutAt).Round(100*time.Millisecond),
		servingBack.Sub(backAt).Round(100*time.Millisecond), gap.Round(100*time.Millisecond),
		firstAfter.Round(time.Millisecond), len(acked), lost)
}
