package dbfaults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// maxWait is the duplicates' bound under the WAIT policy in the rolling
// restart.
const maxWait = 3 * time.Second

// TestRollingRestart runs three ledgerds on one PostgreSQL database, which
// a write service reaches through the guard and one gRPC connection that
// round-robins over their three addresses (its Stream on one of them at a
// time), and restarts them one at a time with SIGTERM under a load of
// intents, a tenth of them sent twice at once: every intent is done once;
// a call fails only with a retryable UNAVAILABLE (or a duplicate's
// IN_PROGRESS past its bound) that its retry answers; no duplicate waits
// past its bound; and after each SIGTERM the calls go on on the other
// instances within a second.
func TestRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("restarts three ledgerds under load")
	}
	db := pgtest.NewDatabase(t)
	var addrs []string
	procs := make([]*ledgerdtest.Proc, 3)
	start := func(i int) {
		procs[i] = ledgerdtest.Start(t, "--listen", addrs[i], "--database-url", db, "--migrate", "--admin-listen", "", "--http-listen", "", "--drain-timeout", "10s")
	}
	for i := range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		_ = l.Close()
		start(i)
	}
	r := manual.NewBuilderWithScheme("ledgerd")
	var state resolver.State
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	conn, err := grpc.NewClient(r.Scheme()+":///ledgerd", append(ledgerclient.DialOptions(), grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lc := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	defer lc.Close()
	waits := &waitSeen{LedgerServiceClient: lc, gates: map[string]chan struct{}{}}
	g, err := guard.New(waits)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	runs := map[string]int{}     // how many times each intent's write ran
	failures := map[string]int{} // the errors the calls got, by code
	var waited []time.Duration   // each duplicate's wait
	var done []time.Time         // when each intent was answered
	var bad []string
	// intent does key's write through the guard; a write given hold
	// holds until hold is closed.
	intent := func(key string, dup bool, hold <-chan struct{}) {
		call := guard.Call{Method: "/billing.v1.Invoices/Create", Key: key, Tenant: "acme", Fingerprint: ledgertest.Fingerprint("p"),
			Policy: guard.Policy{Lease: 5 * time.Second, MaxWait: maxWait}}
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), maxWait+2*time.Second)
			began := time.Now()
			_, err := g.Do(ctx, call, func(context.Context) (guard.Outcome, error) {
				mu.Lock()
				runs[key]++
				mu.Unlock()
				if hold != nil {
					<-hold
				}
				return guard.Outcome{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte(key)}}, nil
			})
			cancel()
			took := time.Since(began)
			mu.Lock()
			if dup {
				waited = append(waited, took)
			}
			if err == nil {
				done = append(done, time.Now())
				mu.Unlock()
				return
			}
			le := errcode.As(err)
			failures[le.Code.String()]++
			if !le.Retryable() || (le.Code != errcode.Unavailable && le.Code != errcode.InProgress) || attempt == 20 {
				bad = append(bad, fmt.Sprintf("%s attempt %d: %v", key, attempt, err))
				mu.Unlock()
				return
			}
			mu.Unlock()
			time.Sleep(max(le.RetryAfter, 50*time.Millisecond)) // a caller's backoff: the error's hint
		}
	}
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
				key := fmt.Sprintf("roll-%d-%05d", w, i)
				if i%10 == 0 {
					// The first's write holds until its duplicate waits
					// for it, or is answered.
					hold := waits.gate(key)
					var pair sync.WaitGroup
					pair.Go(func() { intent(key, false, hold) })
					pair.Go(func() { intent(key, true, nil); waits.open(key) })
					pair.Wait()
					continue
				}
				intent(key, false, nil)
			}
		})
	}

	var restarts []string
	for i := range 3 {
		// Load on the three before the next restart, for longer than
		// gRPC's reconnect backoff (1 s ± 20%, real time in the client):
		// the connection is back to all three when the next one goes.
		time.Sleep(1500 * time.Millisecond)
		termAt := time.Now()
		if err := procs[i].Terminate(); err != nil {
			var exit interface{ ExitCode() int }
			if !errors.As(err, &exit) || exit.ExitCode() != 0 {
				t.Errorf("ledgerd %d after SIGTERM: %v", i, err)
			}
		}
		exitedAt := time.Now()
		start(i)
		restarts = append(restarts, fmt.Sprintf("ledgerd %d drained and exited in %s, back in %s", i,
			exitedAt.Sub(termAt).Round(10*time.Millisecond), time.Since(exitedAt).Round(10*time.Millisecond)))
	}
	time.Sleep(1500 * time.Millisecond) // load after the last restart, as long
	close(stop)
	wg.Wait()

	for _, b := range bad {
		t.Errorf("a call failed for good: %s", b)
	}
	twice := 0
	for key, n := range runs {
		if n != 1 {
			twice++
			t.Errorf("%s ran %d times", key, n)
		}
	}
	sort.Slice(waited, func(i, j int) bool { return waited[i] < waited[j] })
	longestWait := time.Duration(0)
	if len(waited) > 0 {
		longestWait = waited[len(waited)-1]
	}
	if longestWait > maxWait+slack {
		t.Errorf("a duplicate waited %s, past its bound of %s", longestWait, maxWait)
	}
	sort.Slice(done, func(i, j int) bool { return done[i].Before(done[j]) })
	var gap time.Duration
	for i := 1; i < len(done); i++ {
		gap = max(gap, done[i].Sub(done[i-1]))
	}
	if gap > time.Second {
		t.Errorf("for %s no intent was answered", gap)
	}
	var codes []string
	for c, n := range failures {
		codes = append(codes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(codes)
	t.Logf("3 ledgerds restarted in turn: %d intents answered, %d ran twice; retried calls: %s; %d duplicates, the longest wait %s; "+
		"the longest time without an answer %s; %s", len(done)-len(waited), twice, strings.Join(codes, ", "), len(waited),
		longestWait.Round(time.Millisecond), gap.Round(time.Millisecond), strings.Join(restarts, "; "))
}

// waitSeen is the guard's ledger client: it opens a key's gate when a
// duplicate of the key asks the ledger to wait for the key's outcome.
type waitSeen struct {
	ledgerv1.LedgerServiceClient
	mu    sync.Mutex
	gates map[string]chan struct{}
}

// gate is key's gate, closed by open.
func (w *waitSeen) gate(key string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	g, ok := w.gates[key]
	if !ok {
		g = make(chan struct{})
		w.gates[key] = g
	}
	return g
}

// open closes key's gate, if it has one.
func (w *waitSeen) open(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g, ok := w.gates[key]; ok {
		close(g)
		delete(w.gates, key)
	}
}

func (w *waitSeen) Lookup(ctx context.Context, req *ledgerv1.LookupRequest, opts ...grpc.CallOption) (*ledgerv1.LookupResponse, error) {
	if req.GetWait() != nil {
		w.open(req.GetKey())
	}
	return w.LedgerServiceClient.Lookup(ctx, req, opts...)
}
