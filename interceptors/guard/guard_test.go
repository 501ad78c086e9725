package guard_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/internal/relaytest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newGuard is a guard over a real LedgerService (the server package on
// the memory store) over gRPC.
func newGuard(t *testing.T) *guard.Guard {
	t.Helper()
	g, _ := clockedGuard(t)
	return g
}

// clockedGuard is newGuard whose ledger keeps time by a clock of the
// test's own, started at the wall clock's now: leases run out when the
// test advances it.
func clockedGuard(t *testing.T) (*guard.Guard, *ledgertest.Clock) {
	t.Helper()
	clock := ledgertest.NewClock(time.Now())
	conn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("tools", clock.Now))).Dial(t)
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	return g, clock
}

// jsonResult is an outcome of a transport that is not gRPC: JSON bytes.
func jsonResult(s string) guard.Outcome {
	return guard.Outcome{Response: &anypb.Any{TypeUrl: "application/json", Value: []byte(s)}}
}

func call(key string) guard.Call {
	sum := sha256.Sum256([]byte(key))
	return guard.Call{Method: "mcp:tools/create_invoice", Key: key, Tenant: "acme", Fingerprint: "j1:" + hex.EncodeToString(sum[:])}
}

// counted is a run function that counts its runs and returns out.
func counted(runs *atomic.Int64, out guard.Outcome, err error) guard.RunFunc {
	return func(ctx context.Context) (guard.Outcome, error) {
		if _, ok := guard.ClaimFromContext(ctx); !ok {
			return guard.Outcome{}, errors.New("no claim in the run's context")
		}
		runs.Add(1)
		return out, err
	}
}

func TestReplaysTheSameBytes(t *testing.T) {
	t.Parallel()
	g := newGuard(t)
	var runs atomic.Int64
	body := `{"content":[{"type":"text","text":"invoice inv_1 created"}],"isError":false}`
	first, err := g.Do(t.Context(), call("k"), counted(&runs, jsonResult(body), nil))
	if err != nil || first.Replayed || !first.Protected {
		t.Fatalf("first = %+v, %v", first, err)
	}
	again, err := g.Do(t.Context(), call("k"), counted(&runs, jsonResult(`{"other":true}`), nil))
	if err != nil || !again.Replayed || string(again.Outcome.Response.GetValue()) != body || again.Outcome.Response.GetTypeUrl() != "application/json" {
		t.Fatalf("replay = %+v, %v", again, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs", runs.Load())
	}
}

func TestOutcomeClasses(t *testing.T) {
	t.Parallel()
	g := newGuard(t)
	var runs atomic.Int64
	// A transient outcome releases: the next call runs.
	busy := guard.Outcome{Status: status.New(codes.Unavailable, "busy"), Transient: true}
	if res, err := g.Do(t.Context(), call("t"), counted(&runs, busy, nil)); err != nil || res.Replayed || res.Outcome.Status.Code() != codes.Unavailable {
		t.Fatalf("transient = %+v, %v", res, err)
	}
	if res, err := g.Do(t.Context(), call("t"), counted(&runs, jsonResult("{}"), nil)); err != nil || res.Replayed || runs.Load() != 2 {
		t.Fatalf("after a transient outcome = %+v, %v, %d runs", res, err, runs.Load())
	}
	// A permanent error is stored and replayed with its code and message.
	declined := guard.Outcome{Status: status.New(codes.FailedPrecondition, "card declined")}
	if _, err := g.Do(t.Context(), call("p"), counted(&runs, declined, nil)); err != nil {
		t.Fatal(err)
	}
	res, err := g.Do(t.Context(), call("p"), counted(&runs, jsonResult("{}"), nil))
	if err != nil || !res.Replayed || res.Outcome.Status.Code() != codes.FailedPrecondition || res.Outcome.Status.Message() != "card declined" || runs.Load() != 3 {
		t.Fatalf("permanent error replay = %+v, %v, %d runs", res, err, runs.Load())
	}
	// A result that cannot be encoded, or an empty one, ran: every retry
	// gets INTERNAL that says so, and nothing runs again.
	for _, key := range []string{"unencodable", "empty"} {
		var runErr error
		if key == "unencodable" {
			runErr = errors.New("the result is not JSON")
		}
		before := runs.Load()
		_, err := g.Do(t.Context(), call(key), counted(&runs, guard.Outcome{}, runErr))
		ledgertest.WantCode(t, err, errcode.Internal)
		res, err := g.Do(t.Context(), call(key), counted(&runs, jsonResult("{}"), nil))
		if err != nil || !res.Replayed || res.Outcome.Status.Code() != codes.Internal || runs.Load() != before+1 {
			t.Fatalf("%s: retry = %+v, %v, %d runs", key, res, err, runs.Load()-before)
		}
	}
}

func TestKeyOptionalAndRefusals(t *testing.T) {
	t.Parallel()
	g := newGuard(t)
	var runs atomic.Int64
	run := func(context.Context) (guard.Outcome, error) { runs.Add(1); return jsonResult("{}"), nil }
	keyless := call("")
	_, err := g.Do(t.Context(), keyless, run)
	ledgertest.WantCode(t, err, errcode.KeyMissing)
	keyless.Policy.KeyOptional = true
	if res, err := g.Do(t.Context(), keyless, run); err != nil || res.Protected || runs.Load() != 1 {
		t.Fatalf("keyless, optional = %+v, %v", res, err)
	}
	noTenant := call("k")
	noTenant.Tenant = ""
	_, err = g.Do(t.Context(), noTenant, run)
	ledgertest.WantCode(t, err, errcode.ValidationFailed)
	badPolicy := call("k")
	badPolicy.Policy.Lease = -time.Second
	_, err = g.Do(t.Context(), badPolicy, run)
	ledgertest.WantCode(t, err, errcode.Internal)
	badMethod := call("k")
	badMethod.Method = "tools/\x00"
	_, err = g.Do(t.Context(), badMethod, run)
	ledgertest.WantCode(t, err, errcode.ValidationFailed)
	if runs.Load() != 1 {
		t.Fatalf("%d runs on refused calls", runs.Load()-1)
	}
}

func TestRefusesToBuild(t *testing.T) {
	t.Parallel()
	if _, err := guard.New(nil); err == nil {
		t.Fatal("built without a ledger")
	}
	conn := servertest.NewServer(t, nil).Dial(t)
	client := ledgerv1.NewLedgerServiceClient(conn)
	for name, opt := range map[string]guard.Option{
		"ZeroOutcomeLimit": guard.WithMaxOutcomeBytes(0),
		"ZeroWithin":       guard.WithCompletion(time.Second, 0),
	} {
		if _, err := guard.New(client, opt); err == nil {
			t.Errorf("%s: built", name)
		}
	}
}

func TestPolicyCheck(t *testing.T) {
	t.Parallel()
	for name, p := range map[string]guard.Policy{
		"NegativeWait":         {MaxWait: -1},
		"UnknownInProgress":    {OnInProgress: 9},
		"UnknownLeaseExpiry":   {OnLeaseExpiry: 9},
		"TombstonesOffAndKept": {NoTombstones: true, TombstoneRetention: time.Hour},
	} {
		if p.Check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := (guard.Policy{OnInProgress: guard.Reject, OnLeaseExpiry: guard.Hold, MaxWait: time.Second}).Check(); err != nil {
		t.Fatal(err)
	}
}

// TestOutcomeUnknownLeavesTheClaim: a run that cannot tell whether its
// write happened leaves the claim to run out: the caller gets
// UNAVAILABLE, a retry within the lease IN_PROGRESS, and one after it a
// takeover (TAKEOVER) or OUTCOME_UNKNOWN (HOLD).
func TestOutcomeUnknownLeavesTheClaim(t *testing.T) {
	t.Parallel()
	g, clock := clockedGuard(t)
	unknown := func(context.Context) (guard.Outcome, error) {
		return guard.Outcome{}, fmt.Errorf("the upstream hung up after the request: %w", guard.ErrOutcomeUnknown)
	}
	for _, p := range []guard.LeaseExpiry{guard.Takeover, guard.Hold} {
		c := call("unknown-" + p.String())
		c.Policy = guard.Policy{Lease: 200 * time.Millisecond, OnLeaseExpiry: p, OnInProgress: guard.Reject}
		_, err := g.Do(t.Context(), c, unknown)
		if le := ledgertest.WantCode(t, err, errcode.Unavailable); le.RetryAfter <= 0 {
			t.Fatalf("%s: UNAVAILABLE without a retry-after", p)
		}
		var runs atomic.Int64
		_, err = g.Do(t.Context(), c, counted(&runs, jsonResult("{}"), nil))
		ledgertest.WantCode(t, err, errcode.InProgress)
		clock.Advance(250 * time.Millisecond)
		res, err := g.Do(t.Context(), c, counted(&runs, jsonResult("{}"), nil))
		switch p {
		case guard.Takeover:
			if err != nil || res.Replayed || runs.Load() != 1 {
				t.Fatalf("TAKEOVER after the lease: %+v, %v, %d runs", res, err, runs.Load())
			}
		case guard.Hold:
			ledgertest.WantCode(t, err, errcode.OutcomeUnknown)
			if runs.Load() != 0 {
				t.Fatal("HOLD ran again")
			}
		}
	}
}

// TestUnknownOutcomeSaysWhy: a run that says why nobody knows whether its
// write happened (guard.UnknownOutcome) has that reason in the error its
// caller reads, and its cause kept out of it.
func TestUnknownOutcomeSaysWhy(t *testing.T) {
	t.Parallel()
	g, _ := clockedGuard(t)
	c := call("unknown-why")
	_, err := g.Do(t.Context(), c, func(context.Context) (guard.Outcome, error) {
		return guard.Outcome{}, guard.UnknownOutcome("the upstream exited before it answered", errors.New("read |0: secret detail"))
	})
	le := ledgertest.WantCode(t, err, errcode.Unavailable)
	if !strings.HasPrefix(le.Message, "the upstream exited before it answered, so nobody knows whether this call was done") ||
		strings.Contains(le.Message, "secret") {
		t.Fatalf("the caller reads %q", le.Message)
	}
	if !errors.Is(guard.UnknownOutcome("why", nil), guard.ErrOutcomeUnknown) {
		t.Fatal("UnknownOutcome does not wrap ErrOutcomeUnknown")
	}
}

// invoice is a typed result of Do.
type invoice struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

// TestTypedDo: Do runs fn once per key and replays its result decoded
// into the caller's type; a permanent error is stored and returned again
// typed; a transient one releases the key, so the next Do runs fn.
func TestTypedDo(t *testing.T) {
	t.Parallel()
	g := newGuard(t)
	var runs atomic.Int64
	create := func(id string, err error) func(context.Context) (invoice, error) {
		return func(ctx context.Context) (invoice, error) {
			if _, ok := guard.ClaimFromContext(ctx); !ok {
				return invoice{}, errors.New("no claim in fn's context")
			}
			runs.Add(1)
			return invoice{ID: id, Amount: 4200}, err
		}
	}
	for range 2 {
		got, err := guard.Do(t.Context(), g, call("typed-1"), create("inv_1", nil))
		if err != nil || got != (invoice{ID: "inv_1", Amount: 4200}) {
			t.Fatalf("Do = %+v, %v", got, err)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("fn ran %d times, want 1", runs.Load())
	}

	refused := &errcode.Error{Code: errcode.ValidationFailed, Message: "no such customer"}
	for i := range 2 {
		_, err := guard.Do(t.Context(), g, call("typed-2"), create("inv_2", refused))
		if le := errcode.As(err); le == nil || le.Code != errcode.ValidationFailed || le.Message != "no such customer" {
			t.Fatalf("try %d: Do = %v, want the stored VALIDATION_FAILED", i, err)
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("fn ran %d times, want 2 (the permanent error is stored)", runs.Load())
	}

	busy := status.Error(codes.Unavailable, "the provider is busy")
	if _, err := guard.Do(t.Context(), g, call("typed-3"), create("inv_3", busy)); status.Code(err) != codes.Unavailable {
		t.Fatalf("Do = %v, want the transient error", err)
	}
	got, err := guard.Do(t.Context(), g, call("typed-3"), create("inv_3", nil))
	if err != nil || got.ID != "inv_3" || runs.Load() != 4 {
		t.Fatalf("after a transient error: Do = %+v, %v, %d runs; want a fresh run", got, err, runs.Load())
	}
}

// TestRunOutlivesItsCaller: a caller that hangs up mid-run does not end
// the run: it finishes, its outcome is stored, and the retry gets the
// replay; the run ran once.
func TestRunOutlivesItsCaller(t *testing.T) {
	t.Parallel()
	g := newGuard(t)
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	caller, hangUp := context.WithCancel(t.Context())
	type answer struct {
		res guard.Result
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		res, err := g.Do(caller, call("outlives"), func(ctx context.Context) (guard.Outcome, error) {
			runs.Add(1)
			close(started)
			<-release
			if err := ctx.Err(); err != nil {
				return guard.Outcome{}, fmt.Errorf("the run's context ended with its caller: %w", err)
			}
			return jsonResult(`{"id":"inv_1"}`), nil
		})
		answered <- answer{res, err}
	}()
	<-started
	hangUp()
	close(release)
	if a := <-answered; a.err != nil || a.res.Replayed {
		t.Fatalf("the run whose caller hung up = %+v, %v; want its own answer", a.res, a.err)
	}
	res, err := g.Do(t.Context(), call("outlives"), counted(&runs, jsonResult(`{"id":"other"}`), nil))
	if err != nil || !res.Replayed || string(res.Outcome.Response.GetValue()) != `{"id":"inv_1"}` || runs.Load() != 1 {
		t.Fatalf("the retry = %+v, %v, %d runs; want the first run's answer, replayed", res, err, runs.Load())
	}
}

// TestRunTimeoutLeavesTheOutcomeUnknown: a run still going at its
// policy's run timeout is ended, and its outcome is unknown: the caller
// gets UNAVAILABLE, the key is not released (a duplicate meets the
// claim), and after the lease the next attempt takes over.
func TestRunTimeoutLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	g, clock := clockedGuard(t)
	c := call("hung")
	c.Policy = guard.Policy{Lease: 5 * time.Second, RunTimeout: 50 * time.Millisecond, OnInProgress: guard.Reject}
	_, err := g.Do(t.Context(), c, func(ctx context.Context) (guard.Outcome, error) {
		<-ctx.Done() // an upstream that never answers
		return guard.Outcome{}, ctx.Err()
	})
	le := ledgertest.WantCode(t, err, errcode.Unavailable)
	if !le.Retryable() || !strings.Contains(le.Message, "run timeout") {
		t.Fatalf("%+v: want a retryable UNAVAILABLE that names the run timeout", le)
	}
	var runs atomic.Int64
	_, err = g.Do(t.Context(), c, counted(&runs, jsonResult("{}"), nil))
	ledgertest.WantCode(t, err, errcode.InProgress)
	clock.Advance(6 * time.Second)
	if res, err := g.Do(t.Context(), c, counted(&runs, jsonResult("{}"), nil)); err != nil || res.Replayed || runs.Load() != 1 {
		t.Fatalf("after the lease: %+v, %v, %d runs; want a takeover that runs", res, err, runs.Load())
	}
}

// downStore is a memory store whose claims fail as a store does when its
// disk or database is gone.
type downStore struct{ *memory.Store }

func (downStore) Claim(context.Context, ledger.ClaimParams) (ledger.ClaimResult, error) {
	return ledger.ClaimResult{}, ledger.Unavailable(errors.New("disk gone"))
}

// TestBlameIsSaidPlainly: the caller is told whose fault an UNAVAILABLE
// is: a ledger that cannot be reached, or a ledger that answered while its
// store could not. Nothing runs either way.
func TestBlameIsSaidPlainly(t *testing.T) {
	t.Parallel()
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "tools", Tenants: []string{"*"}}, nil
	})
	conn := servertest.NewServer(t, servertest.Ledger(server.New(ledger.New(downStore{memory.New(memory.Config{})}, ledger.Config{}), server.Config{Auth: auth}))).Dial(t)
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(conn))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	_, err = g.Do(t.Context(), call("blame"), counted(&runs, jsonResult("{}"), nil))
	if le := ledgertest.WantCode(t, err, errcode.Unavailable); le.Message != "the idempotency ledger is up, but its store is unavailable" || !le.Retryable() {
		t.Fatalf("the store down: %q; want the ledger up and its store named", le.Message)
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	_ = lis.Close() // nothing listens there now
	dconn, err := grpc.NewClient(down, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dconn.Close() })
	g, err = guard.New(ledgerv1.NewLedgerServiceClient(dconn))
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Do(t.Context(), call("blame"), counted(&runs, jsonResult("{}"), nil))
	if le := ledgertest.WantCode(t, err, errcode.Unavailable); le.Message != "the idempotency ledger cannot be reached" {
		t.Fatalf("the ledger down: %q", le.Message)
	}
	if runs.Load() != 0 {
		t.Fatalf("ran %d times", runs.Load())
	}
}

// TestShutdownEndsAWaitingDuplicate: a duplicate waiting (WAIT) for the
// first attempt on a ledger that starts to shut down is answered at once,
// UNAVAILABLE with a retry hint, to retry on another instance; it does
// not wait out its bound.
func TestShutdownEndsAWaitingDuplicate(t *testing.T) {
	t.Parallel()
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "tools", Tenants: []string{"*"}}, nil
	})
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	srv := server.New(l, server.Config{Auth: auth})
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(srv)).Dial(t)))
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := g.Do(t.Context(), call("draining"), func(context.Context) (guard.Outcome, error) {
			close(started)
			<-release
			return jsonResult("{}"), nil
		})
		first <- err
	}()
	<-started
	dup := make(chan error, 1)
	var runs atomic.Int64
	go func() {
		c := call("draining")
		c.Policy = guard.Policy{MaxWait: time.Minute}
		_, err := g.Do(t.Context(), c, counted(&runs, jsonResult("{}"), nil))
		dup <- err
	}()
	ledgertest.Eventually(t, 10*time.Second, func() bool { return l.Waiters() > 0 }, "the duplicate waits at the ledger")
	srv.Drain()
	le := ledgertest.WantCode(t, <-dup, errcode.Unavailable)
	if !le.Retryable() || le.RetryAfter <= 0 || !strings.Contains(le.Message, "shutting down") {
		t.Fatalf("the waiting duplicate at shutdown: %+v; want UNAVAILABLE, retryable, naming the shutdown", le)
	}
	close(release)
	if err := <-first; err != nil || runs.Load() != 0 {
		t.Fatalf("the first attempt: %v; the duplicate ran %d times", err, runs.Load())
	}
}

// TestCompleteOutlastsASilentConnection: the ledger's connection goes
// silent without closing while the run goes on (a ledgerd's node lost):
// the Complete's tries (for 20 s, 5 s each) outlast the 15 s in which the
// ledger client finds the connection lost, so the outcome is stored on a
// new connection and the retry gets the replay; the run ran once. With
// three tries the key stayed in progress until its lease ran out.
func TestCompleteOutlastsASilentConnection(t *testing.T) {
	t.Parallel()
	outlasts(t, func(relay *relaytest.Relay) { relay.Silence() }, 0)
}

// TestCompleteOutlastsALedgerRestart: the ledger goes down under the run
// (its connections closed, new ones refused) and is back 3 s later. Each
// try of the Complete fails at once meanwhile, and the guard goes on
// trying for its 20 s, so the outcome is stored when the ledger is back
// and the retry replays it: on the client's Stream, and as a unary call
// (an outcome over ledgerclient.MaxStreamedBytes). With four tries
// whatever their pace, the tries were spent in under a second and the key
// stayed in progress.
func TestCompleteOutlastsALedgerRestart(t *testing.T) {
	t.Parallel()
	restart := func(relay *relaytest.Relay) {
		relay.Admit(relaytest.Close)
		relay.Cut()
		time.AfterFunc(3*time.Second, func() { relay.Admit(relaytest.Forward) })
	}
	t.Run("Stream", func(t *testing.T) {
		t.Parallel()
		outlasts(t, restart, 0)
	})
	t.Run("Unary", func(t *testing.T) {
		t.Parallel()
		outlasts(t, restart, ledgerclient.MaxStreamedBytes)
	})
}

// outlasts runs a guarded call whose run calls fault with the relay its
// ledger is reached through, and answers with an outcome padded by pad
// bytes: the run's answer is stored all the same, and the retry replays
// it without running.
func outlasts(t *testing.T, fault func(*relaytest.Relay), pad int) {
	t.Helper()
	relay, g := relayedGuard(t)
	answer := `{"id":"inv_1","pad":"` + strings.Repeat(".", pad) + `"}`
	var runs atomic.Int64
	res, err := g.Do(t.Context(), call("k"), func(context.Context) (guard.Outcome, error) {
		runs.Add(1)
		fault(relay)
		return jsonResult(answer), nil
	})
	if err != nil || res.Replayed {
		t.Fatalf("the run = %v, %v; want its own answer", res.Replayed, err)
	}
	res, err = g.Do(t.Context(), call("k"), counted(&runs, jsonResult(`{"id":"other"}`), nil))
	if err != nil || !res.Replayed || string(res.Outcome.Response.GetValue()) != answer || runs.Load() != 1 {
		t.Fatalf("the retry = replayed %v, %d bytes, %v, %d runs; want the first run's answer, replayed", res.Replayed, len(res.Outcome.Response.GetValue()), err, runs.Load())
	}
}

// relayedGuard is a Guard whose ledger client (over ledgerclient's
// DialOptions) reaches a ledger server through the relay returned.
func relayedGuard(t *testing.T) (*relaytest.Relay, *guard.Guard) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(server.TransportOptions()...)
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: "tools", Tenants: []string{"*"}}, nil
	})
	ledgerv1.RegisterLedgerServiceServer(gs, server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: auth}))
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	relay := relaytest.New(t, lis.Addr().String())
	conn, err := grpc.NewClient(relay.Addr(), append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	lc := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	t.Cleanup(func() {
		_ = lc.Close()
		_ = conn.Close()
	})
	g, err := guard.New(lc)
	if err != nil {
		t.Fatal(err)
	}
	return relay, g
}
