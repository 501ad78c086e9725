package httpguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"), goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// api is a write service: POST /v1/things answers what status says
// (201 by default) with a body that counts its runs.
type api struct {
	runs   atomic.Int64
	status func(n int64) int
	// proceed, when set, holds each run until it receives from it: a
	// duplicate arrives, and waits or is refused, while the run holds.
	proceed chan struct{}
	// started, when set, hears of each run as it starts: its attempt holds
	// the claim.
	started chan struct{}
}

func (a *api) handler(t *testing.T, g *httpguard.Guard) http.Handler {
	mux := http.NewServeMux()
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := a.runs.Add(1)
		if a.started != nil {
			a.started <- struct{}{}
		}
		if a.proceed != nil {
			<-a.proceed
		}
		body, _ := io.ReadAll(r.Body)
		c, _ := guard.ClaimFromContext(r.Context())
		status := http.StatusCreated
		if a.status != nil {
			status = a.status(n)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/v1/things/%d", n))
		w.Header().Set("X-Run", fmt.Sprint(n))
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"run":%d,"token":%d,"got":%q}`, n, c.Token, body)
	})
	mux.Handle("POST /v1/things", g.Middleware(write))
	mux.Handle("PUT /v1/things/{id}", g.Middleware(write))
	mux.Handle("POST /v1/held", g.Middleware(write))
	mux.Handle("POST /v1/short", g.Middleware(write))
	return mux
}

func ledgerClient(t *testing.T) ledgerv1.LedgerServiceClient {
	t.Helper()
	return ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("api"))).Dial(t))
}

// waitedLedgerClient is ledgerClient with its ledger, whose waiting
// duplicates a test counts (Waiters).
func waitedLedgerClient(t *testing.T) (ledgerv1.LedgerServiceClient, *ledger.Ledger) {
	t.Helper()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	return ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.LedgerServer("api", l))).Dial(t)), l
}

// clockedLedgerClient is ledgerClient on a clock of the test's own,
// started at the wall clock's now: leases and retention run out when the
// test advances it.
func clockedLedgerClient(t *testing.T) (ledgerv1.LedgerServiceClient, *ledgertest.Clock) {
	t.Helper()
	clock := ledgertest.NewClock(time.Now())
	conn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedgerAt("api", clock.Now))).Dial(t)
	return ledgerv1.NewLedgerServiceClient(conn), clock
}

// coreGuard is the guard the adapter runs on, over client.
func coreGuard(t testing.TB, client ledgerv1.LedgerServiceClient, opts ...guard.Option) *guard.Guard {
	t.Helper()
	g, err := guard.New(client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func newGuard(t *testing.T, client ledgerv1.LedgerServiceClient, routes ...httpguard.Option) *httpguard.Guard {
	t.Helper()
	g, err := httpguard.New(coreGuard(t, client), append([]httpguard.Option{
		httpguard.WithTenant(httpguard.Tenant("acme")),
		httpguard.WithRoute("POST /v1/things", httpguard.Route{}),
		httpguard.WithRoute("PUT /v1/things/{id}", httpguard.Route{Policy: guard.Policy{OnInProgress: guard.Reject}}),
		httpguard.WithRoute("POST /v1/held", httpguard.Route{Policy: guard.Policy{Lease: 200 * time.Millisecond, OnLeaseExpiry: guard.Hold}}),
		httpguard.WithRoute("POST /v1/short", httpguard.Route{Policy: guard.Policy{Lease: 100 * time.Millisecond, Retention: 300 * time.Millisecond}}),
		httpguard.WithMaxBodyBytes(1 << 10),
	}, routes...)...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func serve(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

type answer struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, method, url, key, contentType, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(httpguard.KeyHeader, key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{res.StatusCode, res.Header, string(b)}
}

func post(t *testing.T, url, key, body string) answer {
	t.Helper()
	return send(t, http.MethodPost, url+"/v1/things", key, "application/json", body)
}

// wantProblem checks an RFC 9457 problem with the ledger's fields.
func wantProblem(t *testing.T, a answer, status int, code errcode.Code) httpguard.Problem {
	t.Helper()
	var p httpguard.Problem
	if a.status != status || a.header.Get("Content-Type") != "application/problem+json" || json.Unmarshal([]byte(a.body), &p) != nil {
		t.Fatalf("got %d %s %s; want a %d problem %s", a.status, a.header.Get("Content-Type"), a.body, status, code)
	}
	if p.Code != code.String() || p.Type != httpguard.ProblemType(code) || p.Title == "" || p.Detail == "" || p.Status != status || p.Retryable != code.Retryable() {
		t.Fatalf("problem %+v; want %s", p, code)
	}
	if code.Retryable() && (p.RetryAfterMS <= 0 || a.header.Get("Retry-After") == "") {
		t.Fatalf("a retryable problem without a retry-after: %+v, Retry-After %q", p, a.header.Get("Retry-After"))
	}
	return p
}

// TestStoredAndReplayed: docs/contract.md's "stored and replayed" row: the status,
// the body and the allow-listed headers come back byte for byte with
// Idempotency-Replayed: true; other headers do not.
func TestStoredAndReplayed(t *testing.T) {
	t.Parallel()
	a := &api{}
	url := serve(t, a.handler(t, newGuard(t, ledgerClient(t))))
	first := post(t, url, `"k-1"`, `{"amount":1}`)
	if first.status != http.StatusCreated || first.header.Get(httpguard.ReplayedHeader) != "" || first.header.Get("X-Run") != "1" {
		t.Fatalf("first: %+v", first)
	}
	for range 2 {
		again := post(t, url, `"k-1"`, `{ "amount" : 1.0 }`) // equal under JCS
		if again.status != first.status || again.body != first.body || again.header.Get(httpguard.ReplayedHeader) != "true" {
			t.Fatalf("replay: %+v, want %+v", again, first)
		}
		for _, h := range httpguard.DefaultStoredHeaders {
			if first.header.Get(h) != "" && again.header.Get(h) != first.header.Get(h) {
				t.Fatalf("replayed %s = %q, want %q", h, again.header.Get(h), first.header.Get(h))
			}
		}
		if again.header.Get("X-Run") != "" {
			t.Fatal("a header off the allow-list was replayed")
		}
	}
	if a.runs.Load() != 1 {
		t.Fatalf("%d runs", a.runs.Load())
	}
	// A bare token is a key too; GET is not covered.
	if r := post(t, url, "k-token", `{}`); r.status != http.StatusCreated || a.runs.Load() != 2 {
		t.Fatalf("bare token: %+v", r)
	}
	// A route that names more headers keeps them.
	b := &api{}
	url = serve(t, b.handler(t, newGuard(t, ledgerClient(t), httpguard.WithRoute("POST /v1/things", httpguard.Route{StoreHeaders: []string{"X-Run"}}))))
	post(t, url, `"k"`, `{}`)
	if again := post(t, url, `"k"`, `{}`); again.header.Get("X-Run") != "1" {
		t.Fatalf("a named header was not replayed: %v", again.header)
	}
}

// TestBareKeys: a key sent unquoted, as stock clients send a UUID or
// stripe-go its own keys, is the same key as its sf-string.
func TestBareKeys(t *testing.T) {
	t.Parallel()
	a := &api{}
	url := serve(t, a.handler(t, newGuard(t, ledgerClient(t))))
	for _, key := range []string{"0e03978e-40d5-43e8-bc93-6894a57f9324", "1796182444475302461_B8TIFA"} {
		first := post(t, url, key, `{}`)
		if first.status != http.StatusCreated || first.header.Get(httpguard.ReplayedHeader) != "" {
			t.Fatalf("%s: %+v", key, first)
		}
		again := post(t, url, `"`+key+`"`, `{}`)
		if again.status != http.StatusCreated || again.header.Get(httpguard.ReplayedHeader) != "true" || again.body != first.body {
			t.Fatalf("%s quoted: %+v, want the replay of %+v", key, again, first)
		}
	}
	if a.runs.Load() != 2 {
		t.Fatalf("%d runs, want 2", a.runs.Load())
	}
}

// TestKeyAndFingerprintFromTheBody: a route that names its key by a JSON
// Pointer into the body, and the parts that make the fingerprint. The
// header wins over the body's key; a retry that differs only outside the
// named parts is the replay, one that differs in them KEY_REUSED.
func TestKeyAndFingerprintFromTheBody(t *testing.T) {
	t.Parallel()
	a := &api{}
	client := ledgerClient(t)
	url := serve(t, a.handler(t, newGuard(t, client, httpguard.WithRoute("POST /v1/things", httpguard.Route{
		KeyPointer: "/request/id", FingerprintPointers: []string{"/amount", "/currency"},
	}))))
	body := func(id, note string, amount int) string {
		return fmt.Sprintf(`{"request":{"id":%q},"amount":%d,"currency":"EUR","note":%q}`, id, amount, note)
	}
	first := post(t, url, "", body("r-1", "first", 1))
	if first.status != http.StatusCreated || a.runs.Load() != 1 {
		t.Fatalf("a key in the body: %+v", first)
	}
	if again := post(t, url, "", body("r-1", "second", 1)); again.header.Get(httpguard.ReplayedHeader) != "true" || again.body != first.body {
		t.Fatalf("a change outside the fingerprint's parts: %+v, want the replay", again)
	}
	wantProblem(t, post(t, url, "", body("r-1", "first", 2)), http.StatusUnprocessableEntity, errcode.KeyReused)
	// The header wins: its key is the first one's.
	if again := post(t, url, `"r-1"`, body("r-other", "x", 1)); again.header.Get(httpguard.ReplayedHeader) != "true" {
		t.Fatalf("the header's key over the body's: %+v", again)
	}
	wantProblem(t, post(t, url, "", `{"request":{"id":7},"amount":1}`), http.StatusBadRequest, errcode.KeyInvalid)
	wantProblem(t, post(t, url, "", `{"amount":1}`), http.StatusBadRequest, errcode.KeyMissing)
	if a.runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", a.runs.Load())
	}
	post(t, url, `"h-1"`, body("r-2", "x", 1))
	for key, want := range map[string]string{"r-1": "pointer:/request/id", "h-1": "header"} {
		got, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: key})
		if err != nil || got.GetRecord().GetKeySource() != want {
			t.Errorf("%s: the record says the key came from %q (%v); want %q", key, got.GetRecord().GetKeySource(), err, want)
		}
	}
	if _, err := httpguard.New(coreGuard(t, ledgerClient(t)), httpguard.WithTenant(httpguard.Tenant("acme")),
		httpguard.WithRoute("POST /v1/things", httpguard.Route{KeyPointer: "request/id"})); err == nil {
		t.Fatal("a key pointer that is not RFC 6901 was taken")
	}
}

// TestKeyRows: docs/contract.md's key rows: missing where required, malformed, reused
// with another request.
func TestKeyRows(t *testing.T) {
	t.Parallel()
	a := &api{}
	url := serve(t, a.handler(t, newGuard(t, ledgerClient(t))))
	wantProblem(t, post(t, url, "", `{}`), http.StatusBadRequest, errcode.KeyMissing)
	for _, bad := range []string{`"unterminated`, `k, j`, `"k", "j"`, `""`, `"bad key"`} {
		wantProblem(t, post(t, url, bad, `{}`), http.StatusBadRequest, errcode.KeyInvalid)
	}
	post(t, url, `"k"`, `{"amount":1}`)
	wantProblem(t, post(t, url, `"k"`, `{"amount":2}`), http.StatusUnprocessableEntity, errcode.KeyReused)
	// The same body under another content type is another request (b1).
	wantProblem(t, send(t, http.MethodPost, url+"/v1/things", `"k"`, "text/plain", `{"amount":1}`), http.StatusUnprocessableEntity, errcode.KeyReused)
	wantProblem(t, post(t, url, `"k-json"`, `{"amount":`), http.StatusBadRequest, errcode.ValidationFailed)
	if a.runs.Load() != 1 {
		t.Fatalf("%d runs on refused requests", a.runs.Load())
	}
	// A body over the limit is 413, and does not run.
	big := post(t, url, `"k-big"`, `{"x":"`+strings.Repeat("y", 2<<10)+`"}`)
	if big.status != http.StatusRequestEntityTooLarge || a.runs.Load() != 1 {
		t.Fatalf("big body: %d %s", big.status, big.body)
	}
}

// TestConcurrentRows: a duplicate while the first runs waits and gets the
// first response (WAIT, the default), or 409 with Retry-After (REJECT).
func TestConcurrentRows(t *testing.T) {
	t.Parallel()
	a := &api{proceed: make(chan struct{}), started: make(chan struct{}, 8)}
	client, l := waitedLedgerClient(t)
	url := serve(t, a.handler(t, newGuard(t, client)))
	answers := make([]answer, 6)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() { answers[i] = post(t, url, `"fan"`, `{}`) })
	}
	ledgertest.Eventually(t, 10*time.Second, func() bool { return l.Waiters() == len(answers)-1 }, "every duplicate waits in the ledger")
	a.proceed <- struct{}{}
	wg.Wait()
	for _, ans := range answers {
		if ans.status != http.StatusCreated || ans.body != answers[0].body {
			t.Fatalf("parallel duplicates: %+v vs %+v", ans, answers[0])
		}
	}
	if a.runs.Load() != 1 {
		t.Fatalf("%d runs", a.runs.Load())
	}
	<-a.started // the parallel duplicates' one run
	done := make(chan answer, 1)
	go func() { done <- send(t, http.MethodPut, url+"/v1/things/7", `"put"`, "application/json", `{}`) }()
	<-a.started
	wantProblem(t, send(t, http.MethodPut, url+"/v1/things/7", `"put"`, "application/json", `{}`), http.StatusConflict, errcode.InProgress)
	a.proceed <- struct{}{}
	if first := <-done; first.status != http.StatusCreated {
		t.Fatalf("the first PUT: %+v", first)
	}
}

// TestReleasedStatuses: 408, 425, 429, 502, 503 and 504 are released (the
// retry runs afresh); every other status is stored.
func TestReleasedStatuses(t *testing.T) {
	t.Parallel()
	for _, status := range []int{408, 425, 429, 502, 503, 504, 400, 404, 409, 500} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			a := &api{status: func(n int64) int {
				if n == 1 {
					return status
				}
				return http.StatusCreated
			}}
			url := serve(t, a.handler(t, newGuard(t, ledgerClient(t))))
			if first := post(t, url, `"k"`, `{}`); first.status != status {
				t.Fatalf("first: %d", first.status)
			}
			again := post(t, url, `"k"`, `{}`)
			if httpguard.DefaultRelease(status) {
				if again.status != http.StatusCreated || again.header.Get(httpguard.ReplayedHeader) != "" || a.runs.Load() != 2 {
					t.Fatalf("after a released %d: %d, %d runs", status, again.status, a.runs.Load())
				}
				return
			}
			if again.status != status || again.header.Get(httpguard.ReplayedHeader) != "true" || a.runs.Load() != 1 {
				t.Fatalf("after a stored %d: %d, %d runs", status, again.status, a.runs.Load())
			}
		})
	}
	// The rule is the route's.
	a := &api{status: func(n int64) int { return map[bool]int{true: 500, false: 201}[n == 1] }}
	url := serve(t, a.handler(t, newGuard(t, ledgerClient(t), httpguard.WithRoute("POST /v1/things", httpguard.Route{
		Release: func(s int) bool { return s >= 500 },
	}))))
	post(t, url, `"k"`, `{}`)
	if again := post(t, url, `"k"`, `{}`); again.status != http.StatusCreated || a.runs.Load() != 2 {
		t.Fatalf("a route that releases 500: %d, %d runs", again.status, a.runs.Load())
	}
}

// TestKeyExpiredIsConflict: past the route's retention the response is
// gone, and the key answers 409 KEY_EXPIRED, not a second run.
func TestKeyExpiredIsConflict(t *testing.T) {
	t.Parallel()
	a := &api{}
	ledger, clock := clockedLedgerClient(t)
	url := serve(t, a.handler(t, newGuard(t, ledger)))
	if r := send(t, http.MethodPost, url+"/v1/short", `"old"`, "application/json", `{}`); r.status != http.StatusCreated {
		t.Fatal(r)
	}
	clock.Advance(400 * time.Millisecond)
	wantProblem(t, send(t, http.MethodPost, url+"/v1/short", `"old"`, "application/json", `{}`), http.StatusConflict, errcode.KeyExpired)
	if a.runs.Load() != 1 {
		t.Fatalf("%d runs", a.runs.Load())
	}
}

// TestOutcomeUnknownIsConflict: a HOLD route whose handler died under its
// claim answers 409 OUTCOME_UNKNOWN after the lease, and runs nothing.
func TestOutcomeUnknownIsConflict(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	ledger, clock := clockedLedgerClient(t)
	g := newGuard(t, ledger)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/held", g.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		runs.Add(1)
		panic(http.ErrAbortHandler) // the handler dies after its write
	})))
	url := serve(t, mux)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/held", strings.NewReader(`{}`))
	req.Header.Set(httpguard.KeyHeader, `"held"`)
	if res, err := http.DefaultClient.Do(req); err == nil {
		_ = res.Body.Close()
		t.Fatalf("the dying handler answered %d", res.StatusCode)
	}
	clock.Advance(300 * time.Millisecond)
	wantProblem(t, send(t, http.MethodPost, url+"/v1/held", `"held"`, "", `{}`), http.StatusConflict, errcode.OutcomeUnknown)
	if runs.Load() != 1 {
		t.Fatalf("%d runs under HOLD", runs.Load())
	}
}

// TestLedgerUnreachable: 503 with Retry-After, and the handler does not
// run.
func TestLedgerUnreachable(t *testing.T) {
	t.Parallel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	a := &api{}
	url := serve(t, a.handler(t, newGuard(t, ledgerv1.NewLedgerServiceClient(conn))))
	p := wantProblem(t, post(t, url, `"k"`, `{}`), http.StatusServiceUnavailable, errcode.Unavailable)
	if p.RetryAfterMS < 1000 || a.runs.Load() != 0 {
		t.Fatalf("%+v, %d runs", p, a.runs.Load())
	}
}

// TestClaimInContext: the handler's context carries the claim's token.
func TestClaimInContext(t *testing.T) {
	t.Parallel()
	a := &api{}
	url := serve(t, a.handler(t, newGuard(t, ledgerClient(t))))
	if r := post(t, url, `"k"`, `{"x":1}`); !strings.Contains(r.body, `"token":1`) || !strings.Contains(r.body, `{\"x\":1}`) {
		t.Fatalf("the handler saw %s; want token 1 and the body restored", r.body)
	}
}

func TestRefusesToBuild(t *testing.T) {
	t.Parallel()
	client := ledgerClient(t)
	for name, opts := range map[string][]httpguard.Option{
		"NoTenant":    {httpguard.WithRoute("POST /x", httpguard.Route{})},
		"HostPattern": {httpguard.WithTenant(httpguard.Tenant("a")), httpguard.WithRoute("example.com/x", httpguard.Route{})},
		"BadPolicy":   {httpguard.WithTenant(httpguard.Tenant("a")), httpguard.WithRoute("POST /x", httpguard.Route{Policy: guard.Policy{MaxWait: -1}})},
		"ZeroBody":    {httpguard.WithTenant(httpguard.Tenant("a")), httpguard.WithMaxBodyBytes(0)},
	} {
		if _, err := httpguard.New(coreGuard(t, client), opts...); err == nil {
			t.Errorf("%s: built", name)
		}
	}
	if _, err := httpguard.New(nil, httpguard.WithTenant(httpguard.Tenant("a"))); err == nil {
		t.Error("without a guard: built")
	}
}

// TestOutcomeUnknown: a handler that cannot tell whether its write
// happened marks it; the client gets 503 with Retry-After, and the claim
// is left to run out (a retry within the lease is 409).
func TestOutcomeUnknown(t *testing.T) {
	t.Parallel()
	g := newGuard(t, ledgerClient(t), httpguard.WithRoute("POST /v1/things", httpguard.Route{Policy: guard.Policy{Lease: 2 * time.Second, OnInProgress: guard.Reject}}))
	mux := http.NewServeMux()
	mux.Handle("POST /v1/things", g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpguard.MarkOutcomeUnknown(r)
		w.WriteHeader(http.StatusBadGateway)
	})))
	url := serve(t, mux)
	p := wantProblem(t, post(t, url, `"k"`, `{}`), http.StatusServiceUnavailable, errcode.Unavailable)
	if p.RetryAfterMS < 1000 {
		t.Fatalf("retry after %d ms; want the lease's time left", p.RetryAfterMS)
	}
	wantProblem(t, post(t, url, `"k"`, `{}`), http.StatusConflict, errcode.InProgress)
}

// TestWaitBoundAndTooLate: a duplicate that waits past the route's
// MaxWait gets 409 IN_PROGRESS with Retry-After; a first attempt older
// than the ledger's windows gets 409 RETRY_TOO_LATE, and a malformed one
// 400.
func TestWaitBoundAndTooLate(t *testing.T) {
	t.Parallel()
	a := &api{proceed: make(chan struct{}), started: make(chan struct{}, 1)}
	url := serve(t, a.handler(t, newGuard(t, ledgerClient(t), httpguard.WithRoute("POST /v1/things", httpguard.Route{Policy: guard.Policy{MaxWait: 100 * time.Millisecond}}))))
	done := make(chan answer, 1)
	go func() { done <- post(t, url, `"slow"`, `{}`) }()
	<-a.started
	wantProblem(t, post(t, url, `"slow"`, `{}`), http.StatusConflict, errcode.InProgress)
	a.proceed <- struct{}{}
	if first := <-done; first.status != http.StatusCreated {
		t.Fatalf("first: %+v", first)
	}
	old := func(v string) answer {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/things", strings.NewReader(`{}`))
		req.Header.Set(httpguard.KeyHeader, `"old-intent"`)
		req.Header.Set(httpguard.FirstAttemptHeader, v)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return answer{res.StatusCode, res.Header, string(b)}
	}
	wantProblem(t, old(time.Now().Add(-9*24*time.Hour).Format(time.RFC3339)), http.StatusConflict, errcode.RetryTooLate)
	wantProblem(t, old("yesterday"), http.StatusBadRequest, errcode.ValidationFailed)
	if a.runs.Load() != 1 {
		t.Fatalf("%d runs", a.runs.Load())
	}
}

// TestRunOutlivesItsCaller: a client that hangs up mid-handler does not
// end the handler: it finishes under its claim, its response is stored,
// and the client's retry gets the replay; the write ran once.
func TestRunOutlivesItsCaller(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	finished := make(chan error, 1)
	g := newGuard(t, ledgerClient(t))
	mux := http.NewServeMux()
	mux.Handle("POST /v1/things", g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		close(started)
		<-release
		finished <- r.Context().Err()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"run":%d}`, n)
	})))
	url := serve(t, mux)
	ctx, hangUp := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/things", strings.NewReader(`{}`))
	req.Header.Set(httpguard.KeyHeader, `"k"`)
	req.Header.Set("Content-Type", "application/json")
	go func() { <-started; hangUp() }()
	if res, err := http.DefaultClient.Do(req); err == nil {
		_ = res.Body.Close()
		t.Fatalf("the request whose client hung up was answered %d", res.StatusCode)
	}
	close(release)
	if err := <-finished; err != nil {
		t.Fatalf("the handler's context ended with its client: %v", err)
	}
	again := post(t, url, `"k"`, `{}`)
	if again.status != http.StatusCreated || again.body != `{"run":1}` || again.header.Get(httpguard.ReplayedHeader) != "true" || runs.Load() != 1 {
		t.Fatalf("the retry = %+v, %d runs; want the first run's response, replayed", again, runs.Load())
	}
}

// TestResponseOverTheLimit: a protected response larger than the
// middleware buffers is dropped, not held in memory: the request, which
// ran, and every retry answer 409 OUTCOME_TOO_LARGE, and it runs once.
func TestResponseOverTheLimit(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	g, err := httpguard.New(coreGuard(t, ledgerClient(t)), httpguard.WithTenant(httpguard.Tenant("acme")),
		httpguard.WithRoute("POST /v1/things", httpguard.Route{}), httpguard.WithMaxResponseBytes(1<<10))
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/things", g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		for range 64 { // 64 KiB, in writes of 1 KiB
			_, _ = w.Write(bytes.Repeat([]byte("x"), 1<<10))
		}
	})))
	url := serve(t, mux)
	for range 2 {
		wantProblem(t, post(t, url, `"big"`, `{}`), http.StatusConflict, errcode.OutcomeTooLarge)
	}
	if runs.Load() != 1 {
		t.Fatalf("%d runs, want 1", runs.Load())
	}
}
