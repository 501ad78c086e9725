package dbfaults

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// The bounds a load holds ledgerd to.
const (
	callDeadline = time.Second // each caller's deadline
	slack        = 200 * time.Millisecond
)

// call is what one caller saw.
type call struct {
	start, end time.Time
	err        error
}

// probe is one readiness check.
type probe struct {
	at      time.Time
	serving bool
}

// load is claims and completions of fresh keys from a few callers, and a
// readiness check every 100 ms, against the ledgerd at addr, until
// finish: what every call got, and which outcomes were acknowledged.
type load struct {
	t      *testing.T
	client ledgerv1.LedgerServiceClient
	health healthpb.HealthClient
	mu     sync.Mutex
	calls  []call
	acked  map[string]bool
	probes []probe
	stop   chan struct{}
	wg     sync.WaitGroup
}

// dialLoad connects to ledgerd at addr and waits until it serves.
func dialLoad(t *testing.T, addr string) *load {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	l := &load{t: t, client: ledgerv1.NewLedgerServiceClient(conn), health: healthpb.NewHealthClient(conn), acked: map[string]bool{}, stop: make(chan struct{})}
	ledgertest.Eventually(t, 30*time.Second, l.serving, "ledgerd never served")
	return l
}

func (l *load) serving() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	res, err := l.health.Check(ctx, &healthpb.HealthCheckRequest{Service: ledgerv1.LedgerService_ServiceDesc.ServiceName})
	return err == nil && res.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// write claims key and completes it with its own name: two calls, each
// with a caller's deadline of its own, as a write service's guard makes
// them.
func (l *load) write(key string) {
	var claim *ledgerv1.Claim
	err := l.rpc(func(ctx context.Context) error {
		res, err := l.client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.Invoices/Create"})
		claim = res.GetClaim()
		return err
	})
	if err != nil || claim == nil {
		return
	}
	err = l.rpc(func(ctx context.Context) error {
		_, err := l.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: claim.GetToken(),
			Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte(key)}}}})
		return err
	})
	if err == nil {
		l.mu.Lock()
		l.acked[key] = true
		l.mu.Unlock()
	}
}

// rpc runs one call with a caller's deadline and notes what it got.
func (l *load) rpc(fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), callDeadline)
	defer cancel()
	c := call{start: time.Now()}
	c.err = fn(ctx)
	c.end = time.Now()
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
	return c.err
}

// start runs writers callers and the readiness checks until finish.
func (l *load) start(writers int) {
	for w := range writers {
		l.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				l.write(fmt.Sprintf("load-%d-%06d", w, i))
			}
		})
	}
	l.wg.Go(func() {
		for {
			select {
			case <-l.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			s := l.serving()
			l.mu.Lock()
			l.probes = append(l.probes, probe{time.Now(), s})
			l.mu.Unlock()
		}
	})
}

// await waits until n more outcomes are acknowledged: load of a known
// size on the store as it is now.
func (l *load) await(n int) {
	l.t.Helper()
	acked := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.acked)
	}
	want := acked() + n
	ledgertest.Eventually(l.t, time.Minute, func() bool { return acked() >= want }, "%d more outcomes acknowledged", n)
}

func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
}

// firstServing is the first readiness check at or after t that said
// SERVING, and the first after t that did not (zero times if none).
func (l *load) readiness(after time.Time) (notServing, serving time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, pr := range l.probes {
		if pr.at.Before(after) {
			continue
		}
		if !pr.serving && notServing.IsZero() {
			notServing = pr.at
		}
		if pr.serving && serving.IsZero() {
			serving = pr.at
		}
	}
	return notServing, serving
}

// doneAfter is how long after at the first call succeeded; -1 if none
// yet.
func (l *load) doneAfter(at time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	first := time.Duration(-1)
	for _, c := range l.calls {
		if c.err == nil && c.end.After(at) && (first < 0 || c.end.Sub(at) < first) {
			first = c.end.Sub(at)
		}
	}
	return first
}

// summary is what the calls got.
type summary struct {
	calls   int
	codes   string        // "OK 3664, UPSTREAM_TIMEOUT 52"
	longest time.Duration // the longest call
	gap     time.Duration // the longest time in which no call succeeded
	done    []time.Time   // when each call that succeeded ended, in order
}

// firstDoneAfter is how long after at the first call succeeded; -1 if none.
func (s summary) firstDoneAfter(at time.Time) time.Duration {
	i := sort.Search(len(s.done), func(i int) bool { return s.done[i].After(at) })
	if i == len(s.done) {
		return -1
	}
	return s.done[i].Sub(at)
}

// check fails the test for a call that failed untyped, with a code that
// is neither retryable and in retryable nor in lost (the answers that say
// a write was lost, which are not retryable: the caller's claim is gone),
// or past its deadline, and sums the calls up.
func (l *load) check(retryable []errcode.Code, lost ...errcode.Code) summary {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	byCode := map[string]int{}
	var s summary
	for _, c := range l.calls {
		took := c.end.Sub(c.start)
		s.longest = max(s.longest, took)
		switch {
		case c.err == nil:
			byCode["OK"]++
			s.done = append(s.done, c.end)
		case !ledgerstatus.IsTyped(c.err):
			l.t.Errorf("a call failed untyped after %s: %v", took, c.err)
		default:
			le := ledgerstatus.FromError(c.err)
			byCode[le.Code.String()]++
			if !slices.Contains(lost, le.Code) && (!le.Retryable() || !slices.Contains(retryable, le.Code)) {
				l.t.Errorf("a call failed %v, want one of %v, retryable, or one of %v", c.err, retryable, lost)
			}
		}
		if took > callDeadline+slack {
			l.t.Errorf("a call took %s, past its deadline of %s", took, callDeadline)
		}
	}
	s.calls = len(l.calls)
	sort.Slice(s.done, func(i, j int) bool { return s.done[i].Before(s.done[j]) })
	for i := 1; i < len(s.done); i++ {
		s.gap = max(s.gap, s.done[i].Sub(s.done[i-1]))
	}
	var codes []string
	for c, n := range byCode {
		codes = append(codes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(codes)
	s.codes = strings.Join(codes, ", ")
	return s
}

// replayAcked asks for every acknowledged key again and returns how many
// it checked and how many did not replay their outcome.
func (l *load) replayAcked() (checked, lost int, missing []string) {
	l.mu.Lock()
	keys := make([]string, 0, len(l.acked))
	for k := range l.acked {
		keys = append(keys, k)
	}
	l.mu.Unlock()
	for _, key := range keys {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := l.client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.Invoices/Create"})
		cancel()
		if err != nil || string(res.GetReplay().GetOutcome().GetResponse().GetValue()) != key {
			lost++
			missing = append(missing, key)
		}
	}
	return len(keys), lost, missing
}
