package stripeapi_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v82"
	"google.golang.org/grpc"

	"github.com/idemledger/idemledger/examples/stripeapi"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

const secretKey = "sk_test_acme"

// attempt is one request stripe-go sent, as it went on the wire.
type attempt struct {
	key    string // its Idempotency-Key header
	status int    // the answer's status; 0 when the answer was dropped
	header http.Header
}

// wire is stripe-go's HTTP transport: it records every attempt, and drop,
// when set, says whether to drop the answer of attempt n (1-based) after
// the server wrote it, as a connection cut on the way back would.
type wire struct {
	mu       sync.Mutex
	attempts []attempt
	drop     func(n int) bool
	// before, when set, runs before attempt n is sent.
	before func(n int)
}

func (w *wire) RoundTrip(r *http.Request) (*http.Response, error) {
	w.mu.Lock()
	n := len(w.attempts) + 1
	w.attempts = append(w.attempts, attempt{key: r.Header.Get(httpguard.KeyHeader)})
	w.mu.Unlock()
	if w.before != nil {
		w.before(n)
	}
	res, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if w.drop != nil && w.drop(n) {
		_ = res.Body.Close()
		return nil, errors.New("connection reset by peer (dropped by the test)")
	}
	w.mu.Lock()
	w.attempts[n-1].status, w.attempts[n-1].header = res.StatusCode, res.Header
	w.mu.Unlock()
	return res, nil
}

func (w *wire) sent() []attempt {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]attempt(nil), w.attempts...)
}

// ledgerDown makes the ledger answer every call UNAVAILABLE while it is set.
type ledgerDown struct{ atomic.Bool }

func (d *ledgerDown) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if d.Load() {
		return nil, ledgerstatus.Err(errcode.Errorf(errcode.Unavailable, "the store cannot be reached"))
	}
	return next(ctx, req)
}

// world is the API behind httpguard on a LedgerService (memory store),
// and a stripe-go client of it with two network retries.
type world struct {
	api    *stripeapi.API
	wire   *wire
	down   *ledgerDown
	client *stripe.Client
}

func TestMain(m *testing.M) { pgtest.Main(m) }

func newWorld(t *testing.T, route httpguard.Route) *world {
	t.Helper()
	w, _ := newClockedWorld(t, route)
	return w
}

// newClockedWorld is newWorld, its charges on a PostgreSQL database of the
// test's own (each with its key's fence), its ledger's clock the test's.
func newClockedWorld(t *testing.T, route httpguard.Route) (*world, *ledgertest.Clock) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w := &world{api: &stripeapi.API{Accounts: map[string]string{secretKey: "acct_acme"}, DB: pool}, wire: &wire{}, down: &ledgerDown{}}
	if err := w.api.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	clock := ledgertest.NewClock(time.Now())
	srv := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("payments", clock.Now)), grpc.UnaryInterceptor(w.down.intercept))
	g, err := guard.New(ledgerv1.NewLedgerServiceClient(srv.Dial(t)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := w.api.Handler(g, route)
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(h)
	t.Cleanup(api.Close)
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(api.URL),
		HTTPClient:        &http.Client{Transport: w.wire},
		MaxNetworkRetries: stripe.Int64(2),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	w.client = stripe.NewClient(secretKey, stripe.WithBackends(backends))
	return w, clock
}

// charges are the charges the API made.
func (w *world) charges(t *testing.T) []stripeapi.Charge {
	t.Helper()
	cs, err := w.api.Charges(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestStripeGoAfterACrash: the API commits the charge with its fence and
// dies before the ledger hears of it; stripe-go retries with the same key
// once the lease has run out, and gets that charge, replayed, not a
// second one.
func TestStripeGoAfterACrash(t *testing.T) {
	w, clock := newClockedWorld(t, httpguard.Route{Policy: guard.Policy{Lease: time.Second}})
	var crashed atomic.Bool
	w.api.AfterWrite = func(*http.Request) {
		if crashed.CompareAndSwap(false, true) {
			panic(http.ErrAbortHandler) // the process dies after its commit
		}
	}
	w.wire.before = func(n int) {
		if n == 2 {
			clock.Advance(2 * time.Second) // the crashed attempt's lease runs out
		}
	}
	c, err := w.charge(t, 100, "order-crash")
	if err != nil {
		t.Fatal(err)
	}
	sent, charges := w.wire.sent(), w.charges(t)
	if len(sent) != 2 || sent[1].header.Get("Idempotent-Replayed") != "true" || len(charges) != 1 || charges[0].ID != c.ID {
		t.Fatalf("attempts %+v, charges %+v, stripe-go got %s; want the committed charge replayed", sent, charges, c.ID)
	}
}

func (w *world) charge(t *testing.T, amount int64, key string) (*stripe.Charge, error) {
	t.Helper()
	p := &stripe.ChargeCreateParams{Amount: stripe.Int64(amount), Currency: stripe.String("eur")}
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return w.client.V1Charges.Create(t.Context(), p)
}

// TestStripeGoOwnKeys: stripe-go mints a key of its own for every POST
// ("1796182444475302461_B8TIFA", which starts with a digit); the guard
// takes it, and a retry of an explicit key gets the first charge back,
// marked as Stripe marks a replay, with the first request's Request-Id.
func TestStripeGoOwnKeys(t *testing.T) {
	w := newWorld(t, httpguard.Route{})
	first, err := w.charge(t, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	sent := w.wire.sent()
	if len(sent) != 1 || !regexp.MustCompile(`^[0-9]+_[A-Za-z0-9_-]{6}$`).MatchString(sent[0].key) {
		t.Fatalf("stripe-go's own key: %+v", sent)
	}
	if first.ID != "ch_1" || first.Amount != 100 {
		t.Fatalf("the charge: %+v", first)
	}

	second, err := w.charge(t, 100, "order-7")
	if err != nil {
		t.Fatal(err)
	}
	again, err := w.charge(t, 100, "order-7")
	if err != nil {
		t.Fatal(err)
	}
	h := again.LastResponse.Header
	if again.ID != second.ID || h.Get("Idempotent-Replayed") != "true" || h.Get(httpguard.ReplayedHeader) != "true" ||
		h.Get("Stripe-Should-Retry") != "false" || again.LastResponse.RequestID != second.LastResponse.RequestID || again.LastResponse.RequestID == "" {
		t.Fatalf("the replay: %s %v, first %s %s", again.ID, h, second.ID, second.LastResponse.RequestID)
	}
	if n := len(w.charges(t)); n != 2 {
		t.Fatalf("%d charges, want 2", n)
	}
}

// TestStripeGoDroppedAnswer: the connection drops after the charge was
// made; stripe-go retries with the same key and gets the charge made, not
// a second one.
func TestStripeGoDroppedAnswer(t *testing.T) {
	w := newWorld(t, httpguard.Route{})
	w.wire.drop = func(n int) bool { return n == 1 }
	c, err := w.charge(t, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	sent := w.wire.sent()
	if len(sent) != 2 || sent[0].key != sent[1].key || sent[1].header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("attempts: %+v", sent)
	}
	if charges := w.charges(t); len(charges) != 1 || c.ID != charges[0].ID {
		t.Fatalf("charges %+v, stripe-go got %s", charges, c.ID)
	}
}

// TestStripeGoWhileTheFirstRuns: on a route that rejects a duplicate
// while the first attempt runs, stripe-go's duplicate gets 409 with
// Stripe-Should-Retry: true, retries after its own backoff, and gets the
// first attempt's charge.
func TestStripeGoWhileTheFirstRuns(t *testing.T) {
	w := newWorld(t, httpguard.Route{Policy: guard.Policy{OnInProgress: guard.Reject}})
	running, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	w.api.Run = func(*http.Request) { once.Do(func() { close(running); <-release }) }
	first := make(chan *stripe.Charge, 1)
	go func() {
		c, err := w.charge(t, 100, "order-8")
		if err != nil {
			t.Error(err)
		}
		first <- c
	}()
	<-running
	// The duplicate's first attempt is refused while the first runs; before
	// its second goes out, the first is let finish and has its answer (which
	// httpguard sends once the outcome is stored).
	var c *stripe.Charge
	w.wire.before = func(n int) {
		if n == 3 {
			close(release)
			c = <-first
		}
	}
	dup, err := w.charge(t, 100, "order-8")
	if err != nil {
		t.Fatal(err)
	}
	sent := w.wire.sent()
	if len(sent) != 3 || sent[1].status != http.StatusConflict || sent[1].header.Get("Stripe-Should-Retry") != "true" || sent[2].status != http.StatusOK {
		t.Fatalf("attempts: %+v", sent)
	}
	if c == nil || c.ID != dup.ID || len(w.charges(t)) != 1 {
		t.Fatalf("the first %+v, the duplicate %+v, charges %+v", c, dup, w.charges(t))
	}
}

// TestStripeGoReusedKey: a key reused with other parameters is 400
// idempotency_error, which stripe-go returns at once as a
// *stripe.IdempotencyError, without retrying.
func TestStripeGoReusedKey(t *testing.T) {
	w := newWorld(t, httpguard.Route{})
	if _, err := w.charge(t, 100, "order-9"); err != nil {
		t.Fatal(err)
	}
	_, err := w.charge(t, 200, "order-9")
	var se *stripe.Error
	if !errors.As(err, &se) || se.Type != stripe.ErrorTypeIdempotency || se.HTTPStatusCode != http.StatusBadRequest || se.Code != "key_reused" {
		t.Fatalf("a reused key: %#v", err)
	}
	var ie *stripe.IdempotencyError
	if !errors.As(err, &ie) {
		t.Fatalf("a reused key is not a *stripe.IdempotencyError: %#v", err)
	}
	if sent := w.wire.sent(); len(sent) != 2 || sent[1].header.Get("Stripe-Should-Retry") != "false" {
		t.Fatalf("attempts: %+v", sent)
	}
	if n := len(w.charges(t)); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}

// TestStripeGoLedgerUnavailable: while the ledger cannot serve, the API
// answers 503 with Stripe-Should-Retry: true, and stripe-go retries; when
// it can again, the retry charges once. A ledger that stays down makes
// stripe-go give up after its retries, with the typed problem.
func TestStripeGoLedgerUnavailable(t *testing.T) {
	w := newWorld(t, httpguard.Route{})
	w.down.Store(true)
	w.wire.before = func(n int) {
		if n == 2 {
			w.down.Store(false)
		}
	}
	c, err := w.charge(t, 100, "")
	if err != nil {
		t.Fatal(err)
	}
	sent := w.wire.sent()
	if len(sent) != 2 || sent[0].status != http.StatusServiceUnavailable || sent[0].header.Get("Stripe-Should-Retry") != "true" ||
		sent[1].key != sent[0].key || sent[1].status != http.StatusOK {
		t.Fatalf("attempts: %+v", sent)
	}
	if charges := w.charges(t); len(charges) != 1 || charges[0].ID != c.ID {
		t.Fatalf("charges %+v, stripe-go got %+v", charges, c)
	}

	w.wire.before = nil
	w.down.Store(true)
	_, err = w.charge(t, 100, "")
	if err == nil || !strings.Contains(err.Error(), "UNAVAILABLE") {
		t.Fatalf("a ledger that stays down: %v", err)
	}
	if sent := w.wire.sent(); len(sent) != 2+3 {
		t.Fatalf("%d attempts, want 1 + 2 retries", len(sent)-2)
	}
	if n := len(w.charges(t)); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
}
