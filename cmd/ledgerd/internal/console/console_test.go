package console_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
)

// serve is a console over AdminService on the memory store, with an admin
// token (ops-secret) and a write service's (billing-secret), at clock.
func serve(t *testing.T, clock *ledgertest.Clock, tls bool) (*httptest.Server, *ledger.Ledger) {
	t.Helper()
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("ops-secret") + " _admin ops-alice\n" + server.HashToken("billing-secret") + " billing acme\n"))
	if err != nil {
		t.Fatal(err)
	}
	l := ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{})
	c, err := console.New(console.Config{Admin: server.NewAdmin(l, server.Config{Auth: tokens}), Auth: tokens, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, c)
	srv := httptest.NewUnstartedServer(mux)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, l
}

// browser is a client with a cookie jar that does not follow redirects.
func browser(t *testing.T, srv *httptest.Server) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client()
	c.Jar = jar
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return c
}

func post(t *testing.T, c *http.Client, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	res, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestSignInAndSessions: only an admin token signs in; the cookie is
// HttpOnly, SameSite=Strict, scoped to the console and Secure under TLS;
// a session ends at sign-out and after SessionTTL; every page has the
// console's headers.
func TestSignInAndSessions(t *testing.T) {
	for _, tls := range []bool{false, true} {
		clock := ledgertest.NewClock(time.Now())
		srv, _ := serve(t, clock, tls)
		c := browser(t, srv)
		base := srv.URL + console.Prefix

		if res, _ := get(t, c, base); res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != console.Prefix+"login" {
			t.Fatalf("signed out: %d to %q", res.StatusCode, res.Header.Get("Location"))
		}
		if res, body := post(t, c, base+"login", url.Values{"token": {"billing-secret"}}); res.StatusCode != http.StatusForbidden || !strings.Contains(body, "admins only") {
			t.Fatalf("a write token: %d", res.StatusCode)
		}
		if res, _ := post(t, c, base+"login", url.Values{"token": {"nope"}}); res.StatusCode != http.StatusUnauthorized {
			t.Fatalf("an unknown token: %d", res.StatusCode)
		}
		res, _ := post(t, c, base+"login", url.Values{"token": {"ops-secret"}})
		if res.StatusCode != http.StatusSeeOther || len(res.Cookies()) != 1 {
			t.Fatalf("the admin's sign-in: %d, cookies %v", res.StatusCode, res.Cookies())
		}
		ck := res.Cookies()[0]
		if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != console.Prefix || ck.Secure != tls || ck.MaxAge != int(console.SessionTTL.Seconds()) {
			t.Fatalf("the session cookie (TLS %v): %+v", tls, ck)
		}
		res, body := get(t, c, base)
		if res.StatusCode != http.StatusOK || !strings.Contains(body, "ops-alice") {
			t.Fatalf("the overview: %d", res.StatusCode)
		}
		for h, want := range map[string]string{"Content-Security-Policy": "frame-ancestors 'none'", "X-Frame-Options": "DENY", "Cache-Control": "no-store"} {
			if !strings.Contains(res.Header.Get(h), want) {
				t.Fatalf("%s: %q", h, res.Header.Get(h))
			}
		}
		if strings.Contains(res.Header.Get("Content-Security-Policy"), "unsafe-inline") {
			t.Fatal("the policy allows inline script")
		}

		// Past SessionTTL the session is gone.
		clock.Advance(console.SessionTTL + time.Second)
		if res, _ := get(t, c, base); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("an expired session: %d", res.StatusCode)
		}

		// Sign-out ends it at once.
		post(t, c, base+"login", url.Values{"token": {"ops-secret"}})
		_, body = get(t, c, base)
		csrf := csrfField.FindStringSubmatch(body)
		if csrf == nil {
			t.Fatal("no CSRF token on the page")
		}
		if res, _ := post(t, c, base+"logout", url.Values{"csrf": {csrf[1]}}); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("sign-out: %d", res.StatusCode)
		}
		if res, _ := get(t, c, base); res.StatusCode != http.StatusSeeOther {
			t.Fatalf("after sign-out: %d", res.StatusCode)
		}
	}
}

// TestFormsNeedTheirCSRFTokenAndOrigin: a state-changing form without the
// session's CSRF token, with another's, or from another origin, is
// refused and changes nothing.
func TestFormsNeedTheirCSRFTokenAndOrigin(t *testing.T) {
	clock := ledgertest.NewClock(time.Now())
	srv, l := serve(t, clock, false)
	sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k"}
	res0, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(t.Context(), sc, res0.Claim.Token, ledgertest.Response("inv")); err != nil {
		t.Fatal(err)
	}
	c := browser(t, srv)
	base := srv.URL + console.Prefix
	post(t, c, base+"login", url.Values{"token": {"ops-secret"}})
	_, body := get(t, c, base)
	csrf := csrfField.FindStringSubmatch(body)[1]
	form := url.Values{"namespace": {"billing"}, "tenant": {"acme"}, "key": {"k"}, "confirm": {"k"}}

	for name, f := range map[string]url.Values{"none": form, "another": with(form, "csrf", csrf[:len(csrf)-1]+"x")} {
		if res, body := post(t, c, base+"record/purge", f); res.StatusCode != http.StatusForbidden || !strings.Contains(body, "CSRF") {
			t.Fatalf("%s CSRF token: %d", name, res.StatusCode)
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"record/purge", strings.NewReader(with(form, "csrf", csrf).Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "https://evil.example")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = res.Body.Close()
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("another origin: %d", res.StatusCode)
	}
	if rec, err := l.Get(t.Context(), sc); err != nil || rec.State != ledger.StateCompleted {
		t.Fatalf("the record after refused forms: %v, %v", rec.State, err)
	}
	// The wrong confirmation is refused too; the right one purges.
	if res, _ := post(t, c, base+"record/purge", with(with(form, "csrf", csrf), "confirm", "K")); res.StatusCode != http.StatusBadRequest {
		t.Fatalf("a wrong confirmation: %d", res.StatusCode)
	}
	if res, body := post(t, c, base+"record/purge", with(form, "csrf", csrf)); res.StatusCode != http.StatusOK || !strings.Contains(body, "purged") {
		t.Fatalf("the purge: %d %s", res.StatusCode, body)
	}
}

func with(v url.Values, k, val string) url.Values {
	out := url.Values{}
	for key, vs := range v {
		out[key] = append([]string(nil), vs...)
	}
	out.Set(k, val)
	return out
}

// TestSearch: a namespace's records by tenant, state, key prefix, method
// and the time of their first claim; a bad time is VALIDATION_FAILED.
func TestSearch(t *testing.T) {
	start := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	clock := ledgertest.NewClock(start)
	srv, l := serve(t, clock, false)
	begin := func(tenant, key, method string) {
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: ledger.Scope{Namespace: "billing", Tenant: tenant, Key: key},
			Fingerprint: ledgertest.Fingerprint("p"), Method: method, Lease: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	begin("acme", "inv-1", "http:POST /v1/invoices")
	clock.Advance(time.Hour)
	begin("acme", "inv-2", "http:POST /v1/invoices")
	begin("acme", "ref-1", "http:POST /v1/refunds")
	begin("globex", "inv-3", "http:POST /v1/invoices")
	c := browser(t, srv)
	base := srv.URL + console.Prefix
	post(t, c, base+"login", url.Values{"token": {"ops-secret"}})
	keys := regexp.MustCompile(`class="key" href="[^"]+">([^<]+)</a>`)
	search := func(q url.Values) []string {
		t.Helper()
		res, body := get(t, c, base+"records?"+q.Encode())
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%v: %d", q, res.StatusCode)
		}
		var out []string
		for _, m := range keys.FindAllStringSubmatch(body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	for _, tc := range []struct {
		q    url.Values
		want string
	}{
		{url.Values{"namespace": {"billing"}}, "inv-1 inv-2 ref-1 inv-3"},
		{url.Values{"namespace": {"billing"}, "tenant": {"acme"}}, "inv-1 inv-2 ref-1"},
		{url.Values{"namespace": {"billing"}, "prefix": {"inv-"}}, "inv-1 inv-2 inv-3"},
		{url.Values{"namespace": {"billing"}, "method": {"http:POST /v1/refunds"}}, "ref-1"},
		{url.Values{"namespace": {"billing"}, "from": {"2026-12-02T10:30"}}, "inv-2 ref-1 inv-3"},
		{url.Values{"namespace": {"billing"}, "to": {"2026-12-02T10:30"}}, "inv-1"},
		{url.Values{"namespace": {"billing"}, "state": {"completed"}}, ""},
		// inv-1's hour-long lease ran out with nobody completing it.
		{url.Values{"namespace": {"billing"}, "state": {"lease_expired"}}, "inv-1"},
		{url.Values{"namespace": {"billing"}, "state": {"in_progress"}}, "inv-2 ref-1 inv-3"},
		{url.Values{"namespace": {"other"}}, ""},
	} {
		if got := strings.Join(search(tc.q), " "); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.q, got, tc.want)
		}
	}
	if res, body := get(t, c, base+"records?namespace=billing&from=yesterday"); res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "VALIDATION_FAILED") {
		t.Fatalf("a bad time: %d", res.StatusCode)
	}
	if res, body := get(t, c, base+"records?namespace=billing&state=IN_PROGRESS"); res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "lease_expired") {
		t.Fatalf("a state outside the vocabulary: %d", res.StatusCode)
	}
	if _, body := get(t, c, base+"records?namespace=billing&tenant=acme"); !strings.Contains(body, `<td class="state lease_expired">lease_expired</td>`) ||
		!strings.Contains(body, `<td class="state in_progress">in_progress</td>`) {
		t.Fatalf("the rows do not name lease_expired and in_progress:\n%s", body)
	}
	if _, body := get(t, c, base+"record?namespace=billing&tenant=acme&key=inv-1"); !strings.Contains(body, `<dd id="state" class="state lease_expired">lease_expired</dd>`) {
		t.Fatalf("the record page of a lapsed lease:\n%s", body)
	}
}

// TestOverview: the census by namespace, the counts to act on linked to
// their search, the decisions chart and readiness.
func TestOverview(t *testing.T) {
	tokens, err := server.ParseTokens(strings.NewReader(server.HashToken("ops-secret") + " _admin ops-alice\n"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	perMinute := make([]int, 60)
	perMinute[59] = 42
	c, err := console.New(console.Config{Admin: server.NewAdmin(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: tokens}), Auth: tokens,
		Census: func() (ledger.Census, time.Time) {
			return ledger.Census{"billing": {ledger.StateUnknown: 3, ledger.StateCompleted: 7}, "refunds": {ledger.StateInProgress: 2}}, at
		},
		Decisions: func() []int { return perMinute }, Store: "embedded:/data"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	cl := browser(t, srv)
	post(t, cl, srv.URL+console.Prefix+"login", url.Values{"token": {"ops-secret"}})
	_, body := get(t, cl, srv.URL+console.Prefix)
	for _, want := range []string{
		`<b>3</b> outcome_unknown`, `<b>2</b> in_progress`, `<b>7</b> completed`,
		`href="/console/records?namespace=billing&amp;state=outcome_unknown">3</a>`,
		`href="/console/records?namespace=refunds&amp;state=in_progress">2</a>`,
		`42 decisions in the hour`, `embedded:/data`, `Counted at 2026-12-02 10:00:00 UTC`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview has no %s", want)
		}
	}
}

// TestRecordSaysWhereItsKeyCameFrom: a record's page says where its first
// claim's guard found the key, in words; a host's call id says it is stable
// only across that host's re-sends.
func TestRecordSaysWhereItsKeyCameFrom(t *testing.T) {
	srv, l := serve(t, ledgertest.NewClock(time.Now()), false)
	for key, source := range map[string]string{"k-host": "host:claudecode/toolUseId", "k-none": ""} {
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: ledger.Scope{Namespace: "billing", Tenant: "acme", Key: key},
			Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, KeySource: source}); err != nil {
			t.Fatal(err)
		}
	}
	c := browser(t, srv)
	base := srv.URL + console.Prefix
	post(t, c, base+"login", url.Values{"token": {"ops-secret"}})
	from := regexp.MustCompile(`id="key-source">([^<]*)<`)
	for key, want := range map[string]string{
		"k-host": "the host&#39;s call id claudecode/toolUseId (stable only across that host&#39;s own re-sends)",
		"k-none": "not said",
	} {
		res, body := get(t, c, base+"record?"+url.Values{"namespace": {"billing"}, "tenant": {"acme"}, "key": {key}}.Encode())
		m := from.FindStringSubmatch(body)
		if res.StatusCode != http.StatusOK || m == nil || m[1] != want {
			t.Errorf("%s: %d, key from %q; want %q", key, res.StatusCode, m, want)
		}
	}
}

// TestResolveApplied: "Resolve: applied" asks for the outcome the record's
// method answers, and stores only what decodes as it: an HTTP response for
// an http: method, a tool result for an mcp: method, and for a gRPC method
// protojson of a type ledgerd knows or the message's bytes with its type
// URL. What does not decode is refused, typed, and the key stays
// outcome_unknown; what does is replayed as entered, with its type.
func TestResolveApplied(t *testing.T) {
	clock := ledgertest.NewClock(time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC))
	srv, l := serve(t, clock, false)
	hold := func(key, method string) ledger.Scope {
		sc := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: key}
		if _, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: method,
			Lease: time.Minute, OnLeaseExpiry: ledger.Hold}); err != nil {
			t.Fatal(err)
		}
		return sc
	}
	keys := map[string]string{"h": "http:POST /v1/invoices", "m": "mcp:tools/create_invoice", "g": "/billing.v1.Invoices/Create", "g2": "/billing.v1.Invoices/Create"}
	for k, m := range keys {
		hold(k, m)
	}
	clock.Advance(2 * time.Minute) // every lease runs out: outcome_unknown
	c := browser(t, srv)
	base := srv.URL + console.Prefix
	post(t, c, base+"login", url.Values{"token": {"ops-secret"}})

	for key, field := range map[string]string{"h": `name="status"`, "m": `name="result"`, "g": `name="value_base64"`} {
		_, body := get(t, c, base+"record?namespace=billing&tenant=acme&key="+key)
		if !strings.Contains(body, field) || strings.Contains(body, "mcp.CallToolResult") && key != "m" {
			t.Errorf("the record page of %s (%s) does not ask for %s:\n%s", key, keys[key], field, body)
		}
	}
	_, body := get(t, c, base)
	csrf := csrfField.FindStringSubmatch(body)[1]
	resolve := func(key string, fields url.Values) (*http.Response, string) {
		f := url.Values{"csrf": {csrf}, "namespace": {"billing"}, "tenant": {"acme"}, "key": {key}, "confirm": {key}, "applied": {"yes"}}
		for k, v := range fields {
			f[k] = v
		}
		return post(t, c, base+"record/resolve", f)
	}
	for _, bad := range []struct {
		key    string
		fields url.Values
	}{
		{"h", url.Values{"status": {"two hundred"}}},
		{"h", url.Values{"status": {"99"}}},
		{"m", url.Values{"result": {"inv_7"}}},
		{"m", url.Values{"result": {`{"text":"inv_7"}`}}},
		{"m", url.Values{"result": {`{"content":[{"text":"inv_7"}]}`}}},
		{"g", url.Values{"response_json": {`{"@type":"type.googleapis.com/billing.v1.Invoice","id":"inv_7"}`}}},
		{"g", url.Values{"type_url": {"billing.v1.Invoice"}, "value_base64": {"CgVpbnZfNw=="}}},
		{"g", url.Values{"type_url": {"type.googleapis.com/billing.v1.Invoice"}, "value_base64": {"not base64!"}}},
	} {
		res, body := resolve(bad.key, bad.fields)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "VALIDATION_FAILED") {
			t.Errorf("%s %v: %d, want 400 VALIDATION_FAILED", bad.key, bad.fields, res.StatusCode)
		}
		if rec, err := l.Get(t.Context(), ledger.Scope{Namespace: "billing", Tenant: "acme", Key: bad.key}); err != nil || rec.State != ledger.StateUnknown {
			t.Fatalf("%s after a refused resolution: %v, %v", bad.key, rec.State, err)
		}
	}
	for _, good := range []struct {
		key, typeURL, value string
		fields              url.Values
	}{
		{"h", "type.idemledger.io/http.Response", `{"status":201,"header":{"Content-Type":["application/json"]},"body":"eyJpZCI6Imludl83In0="}`,
			url.Values{"status": {"201"}, "content_type": {"application/json"}, "body": {`{"id":"inv_7"}`}}},
		{"m", "type.idemledger.io/mcp.CallToolResult", `{"content":[{"type":"text","text":"inv_7"}]}`,
			url.Values{"result": {`{"content":[{"type":"text","text":"inv_7"}]}`}}},
		{"g", "type.googleapis.com/billing.v1.Invoice", "\n\x05inv_7",
			url.Values{"type_url": {"type.googleapis.com/billing.v1.Invoice"}, "value_base64": {"CgVpbnZfNw=="}}},
		{"g2", "type.googleapis.com/google.protobuf.StringValue", "\n\x05inv_7",
			url.Values{"response_json": {`{"@type":"type.googleapis.com/google.protobuf.StringValue","value":"inv_7"}`}}},
	} {
		if res, body := resolve(good.key, good.fields); res.StatusCode != http.StatusOK || !strings.Contains(body, "resolved as applied") {
			t.Fatalf("%s: %d %s", good.key, res.StatusCode, body)
		}
		got, err := l.Begin(t.Context(), ledger.BeginRequest{Scope: ledger.Scope{Namespace: "billing", Tenant: "acme", Key: good.key},
			Fingerprint: ledgertest.Fingerprint("p"), Method: keys[good.key]})
		if err != nil || got.Replay == nil {
			t.Fatalf("%s: the retry after the resolution: %+v, %v", good.key, got, err)
		}
		if a := got.Replay.Outcome.Response; a.GetTypeUrl() != good.typeURL || string(a.GetValue()) != good.value {
			t.Errorf("%s replays %s %q, want %s %q", good.key, a.GetTypeUrl(), a.GetValue(), good.typeURL, good.value)
		}
	}
}
