package httpinvoice_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/examples/httpinvoice"
	"github.com/idemledger/idemledger/examples/invoicedb"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// serve starts the API on loopback against a LedgerService on the
// memory store, its invoices in a PostgreSQL database of the test's own.
func serve(t *testing.T, api *httpinvoice.API) string {
	t.Helper()
	url, _ := serveClocked(t, api)
	return url
}

// serveClocked is serve with a ledger that keeps time by a clock of the
// test's own, started at the wall clock's now: leases run out when the
// test advances it.
func serveClocked(t *testing.T, api *httpinvoice.API) (string, *ledgertest.Clock) {
	t.Helper()
	clock := ledgertest.NewClock(time.Now())
	return serveOn(t, api, ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{})), clock
}

// serveOn is serve on l, a ledger the test reads itself.
func serveOn(t *testing.T, api *httpinvoice.API, l *ledger.Ledger) string {
	t.Helper()
	store, err := invoicedb.OpenPostgres(t.Context(), pgtest.NewDatabase(t))
	if err == nil {
		err = store.Migrate(t.Context())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	api.Store, api.Tenant = store, httpguard.TenantFromHeader("X-Tenant")
	gd, err := guard.New(ledgerv1.NewLedgerServiceClient(servertest.NewServer(t, servertest.Ledger(servertest.LedgerServer("invoices", l))).Dial(t)))
	if err != nil {
		t.Fatal(err)
	}
	g, err := api.Guard(gd)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler(g))
	t.Cleanup(srv.Close)
	return srv.URL
}

type answer struct {
	status int
	header http.Header
	body   string
}

// create POSTs an invoice with plain net/http.
func create(t *testing.T, url, key, body string) (answer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/invoices", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Tenant", "acme")
	if key != "" {
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{res.StatusCode, res.Header, string(b)}, err
}

func mustCreate(t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := create(t, url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

const invoice = `{"customer":"cus_1","currency":"EUR","amount_cents":4200}`

func rows(t *testing.T, api *httpinvoice.API) int {
	t.Helper()
	rows, err := api.Store.Rows(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return len(rows)
}

// The scenarios of draft-ietf-httpapi-idempotency-key-header, driven with
// plain net/http clients.
func TestDraftScenarios(t *testing.T) {
	t.Run("MissingKey", func(t *testing.T) {
		api := &httpinvoice.API{}
		url := serve(t, api)
		a := mustCreate(t, url, "", invoice)
		if a.status != http.StatusBadRequest || a.header.Get("Content-Type") != "application/problem+json" || rows(t, api) != 0 {
			t.Fatalf("%+v", a)
		}
	})
	t.Run("SameKeySameBodyThreeTimes", func(t *testing.T) {
		api := &httpinvoice.API{}
		url := serve(t, api)
		first := mustCreate(t, url, "k-1", invoice)
		if first.status != http.StatusCreated || first.header.Get("Location") == "" || first.header.Get("Idempotency-Replayed") != "" {
			t.Fatalf("first: %+v", first)
		}
		for range 2 {
			again := mustCreate(t, url, "k-1", invoice)
			if again.status != first.status || again.body != first.body || again.header.Get("Location") != first.header.Get("Location") ||
				again.header.Get("Idempotency-Replayed") != "true" {
				t.Fatalf("again: %+v, want %+v replayed", again, first)
			}
		}
		if rows(t, api) != 1 {
			t.Fatalf("%d invoices", rows(t, api))
		}
	})
	t.Run("SameKeyOtherBody", func(t *testing.T) {
		api := &httpinvoice.API{}
		url := serve(t, api)
		mustCreate(t, url, "k-1", invoice)
		a := mustCreate(t, url, "k-1", strings.Replace(invoice, "4200", "4300", 1))
		var p httpguard.Problem
		if a.status != http.StatusUnprocessableEntity || json.Unmarshal([]byte(a.body), &p) != nil || p.Code != "KEY_REUSED" || rows(t, api) != 1 {
			t.Fatalf("%+v", a)
		}
	})
	t.Run("ParallelDuplicates", func(t *testing.T) {
		// The write holds until every duplicate waits in the ledger.
		proceed := make(chan struct{})
		api := &httpinvoice.API{BeforeWrite: func(*http.Request) int {
			<-proceed
			return 0
		}}
		l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
		url := serveOn(t, api, l)
		answers := make([]answer, 8)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() { answers[i] = mustCreate(t, url, "fan-out", invoice) })
		}
		ledgertest.Eventually(t, 10*time.Second, func() bool { return l.Waiters() == len(answers)-1 }, "every duplicate waits in the ledger")
		close(proceed)
		wg.Wait()
		for _, a := range answers {
			if a.status != http.StatusCreated || a.body != answers[0].body {
				t.Fatalf("%+v vs %+v", a, answers[0])
			}
		}
		if rows(t, api) != 1 {
			t.Fatalf("%d invoices", rows(t, api))
		}
	})
	t.Run("ServiceUnavailableThenRetry", func(t *testing.T) {
		var calls atomic.Int64
		api := &httpinvoice.API{BeforeWrite: func(*http.Request) int {
			if calls.Add(1) == 1 {
				return http.StatusServiceUnavailable
			}
			return 0
		}}
		url := serve(t, api)
		if a := mustCreate(t, url, "k-1", invoice); a.status != http.StatusServiceUnavailable {
			t.Fatalf("first: %+v", a)
		}
		if a := mustCreate(t, url, "k-1", invoice); a.status != http.StatusCreated || a.header.Get("Idempotency-Replayed") != "" {
			t.Fatalf("the retry: %+v, want a fresh run", a)
		}
		if a := mustCreate(t, url, "k-1", invoice); a.header.Get("Idempotency-Replayed") != "true" || rows(t, api) != 1 {
			t.Fatalf("then: %+v, %d invoices", a, rows(t, api))
		}
	})
	t.Run("CrashAfterTheWriteThenRetry", func(t *testing.T) {
		var crashed atomic.Bool
		api := &httpinvoice.API{Lease: 200 * time.Millisecond, AfterWrite: func(r *http.Request) {
			if c, _ := guard.ClaimFromContext(r.Context()); c.Attempt == 1 && crashed.CompareAndSwap(false, true) {
				panic(http.ErrAbortHandler) // the process dies after its commit
			}
		}}
		url, clock := serveClocked(t, api)
		if a, err := create(t, url, "k-1", invoice); err == nil {
			t.Fatalf("the crashing request answered %+v", a)
		}
		clock.Advance(300 * time.Millisecond) // its lease runs out
		a := mustCreate(t, url, "k-1", invoice)
		got, err := api.Store.Rows(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if a.status != http.StatusCreated || len(got) != 1 || !strings.Contains(a.body, got[0].Invoice.ID) || a.header.Get("Idempotency-Replayed") != "true" {
			t.Fatalf("after the crash: %+v, rows %+v; want the first write, reconciled", a, got)
		}
	})
}
