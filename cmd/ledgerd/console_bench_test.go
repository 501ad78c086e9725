package main_test

import (
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble"
	"github.com/idemledger/idemledger/server"
)

// BenchmarkConsoleAt1M fills a store with CONSOLE_BENCH_RECORDS records
// (1,000,000 when unset) of one tenant, 100 of them with an unknown
// outcome, and reports the p95 of the console's pages, each requested 50
// times: the overview (it reads the latest census, not the store), a
// search page of the tenant, the first search page of its unknown keys,
// and a record. It also walks the unknown keys' next pages until it has
// found all 100, which sort after the tenant's other keys, and reports
// the pages that took and their p95. It also reports the census
// itself, the whole-store read that ledgerd runs every --census-interval
// in the background. On the embedded store (Pebble) and on PostgreSQL.
func BenchmarkConsoleAt1M(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("CONSOLE_BENCH_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	stores := map[string]func(b *testing.B, now func() time.Time) ledger.Store{
		"pebble": func(b *testing.B, now func() time.Time) ledger.Store {
			s, err := pebble.Open(b.TempDir(), pebble.Config{Now: now})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return s
		},
		"postgres": func(b *testing.B, now func() time.Time) ledger.Store {
			s, err := crdb.Open(b.Context(), pgtest.NewDatabase(b), crdb.Config{Now: now})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(s.Close)
			if _, err := s.Migrate(b.Context()); err != nil {
				b.Fatal(err)
			}
			return s
		},
	}
	for _, name := range []string{"pebble", "postgres"} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				clock := ledgertest.NewClock(time.Now())
				consoleAt(b, stores[name](b, clock.Now), clock, n)
			}
		})
	}
}

var nextPage = regexp.MustCompile(`id="next" href="/console/([^"]+)"`)

func consoleAt(b *testing.B, st ledger.Store, clock *ledgertest.Clock, n int) {
	l := ledger.New(st, ledger.Config{})
	ledgertest.Fill(b, l, n, 500)
	for i := range 100 {
		sc := ledger.Scope{Namespace: "size", Tenant: "acme", Key: fmt.Sprintf("unknown-%03d", i)}
		if _, err := l.Begin(b.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method,
			Lease: time.Second, OnLeaseExpiry: ledger.Hold}); err != nil {
			b.Fatal(err)
		}
	}
	clock.Advance(2 * time.Second) // the unknown keys' leases run out
	start := time.Now()
	census, err := st.CountByState(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(time.Since(start).Milliseconds()), "census-ms")
	if got := census.ByState()[ledger.StateUnknown]; got != 100 {
		b.Fatalf("the census counts %d unknown", got)
	}
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("ops-secret") + " _admin ops\n"))
	if err != nil {
		b.Fatal(err)
	}
	c, err := console.New(console.Config{Admin: server.NewAdmin(l, server.Config{Auth: tokens}), Auth: tokens,
		Census: func() (ledger.Census, time.Time) { return census, start }})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(c)
	defer srv.Close()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar}
	if _, err := client.PostForm(srv.URL+console.Prefix+"login", url.Values{"token": {"ops-secret"}}); err != nil {
		b.Fatal(err)
	}
	p95 := func(path, want string) float64 {
		var ds []time.Duration
		for range 50 {
			t0 := time.Now()
			res, err := client.Get(srv.URL + console.Prefix + path)
			if err != nil {
				b.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			_ = res.Body.Close()
			ds = append(ds, time.Since(t0))
			if res.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
				b.Fatalf("%s: %d\n%s", path, res.StatusCode, body)
			}
		}
		slices.Sort(ds)
		return float64(ds[len(ds)*95/100].Microseconds()) / 1000
	}
	b.ReportMetric(p95("", "census"), "overview-p95-ms")
	b.ReportMetric(p95("records?namespace=size&tenant=acme", `class="key"`), "search-p95-ms")
	b.ReportMetric(p95("records?namespace=size&tenant=acme&state=outcome_unknown", "results"), "search-unknown-p95-ms")
	// Every unknown key, through the search's next pages: the unknown
	// keys sort after the others, so the walk reads the whole tenant.
	var walk []time.Duration
	found := 0
	for path := "records?namespace=size&tenant=acme&state=outcome_unknown"; path != ""; {
		t0 := time.Now()
		res, err := client.Get(srv.URL + console.Prefix + path)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		walk = append(walk, time.Since(t0))
		if res.StatusCode != http.StatusOK {
			b.Fatalf("%s: %d\n%s", path, res.StatusCode, body)
		}
		found += strings.Count(string(body), `<a class="key"`)
		path = ""
		if m := nextPage.FindSubmatch(body); m != nil {
			path = html.UnescapeString(string(m[1]))
		}
	}
	if found != 100 {
		b.Fatalf("the walk found %d unknown keys, want 100", found)
	}
	slices.Sort(walk)
	b.ReportMetric(float64(len(walk)), "unknown-walk-pages")
	b.ReportMetric(float64(walk[len(walk)*95/100].Microseconds())/1000, "unknown-walk-page-p95-ms")
	b.ReportMetric(p95(fmt.Sprintf("record?namespace=size&tenant=acme&key=0192f6c4-7d3e-7abc-8def-%012d", n/2), "timeline"), "record-p95-ms")
}
