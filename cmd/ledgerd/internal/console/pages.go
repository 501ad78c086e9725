package console

import (
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/recordstate"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

var funcs = template.FuncMap{
	"when": func(ts *timestamppb.Timestamp) string {
		if ts == nil {
			return ""
		}
		return ts.AsTime().UTC().Format("2006-01-02 15:04:05.000 UTC")
	},
	"state":     func(*ledgerv1.Record) string { return "" }, // each console's own, by its clock (New)
	"keySource": keySource,
	"scanRows":  func() string { return strconv.Itoa(ledger.ListScanRows) },
	"query": func(kv ...string) template.URL {
		q := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				q.Set(kv[i], kv[i+1])
			}
		}
		return template.URL(q.Encode()) //nolint:gosec // url.Values.Encode escapes every value
	},
}

// keySource says where the first claim's guard found a record's key, as
// an operator reads it.
func keySource(s string) string {
	what, detail, _ := strings.Cut(s, ":")
	switch what {
	case "":
		return "not said"
	case "argument":
		return "the tool's key argument"
	case "parameter":
		return "the call's idempotencyKey parameter (SEP-3182)"
	case "meta":
		return "the call's _meta"
	case "host":
		return "the host's call id " + detail + " (stable only across that host's own re-sends)"
	case "header":
		return "the Idempotency-Key header"
	case "pointer":
		return "the request at " + detail
	case "field":
		return "the request's field " + detail
	case "metadata":
		return "the call's metadata"
	}
	return s
}

// overviewData is the overview page's.
type overviewData struct {
	Namespaces []namespaceCount
	States     []string
	Totals     map[string]int
	CensusAt   time.Time
	Ready      string
	Store      string
	Chart      chart
}

type namespaceCount struct {
	Namespace string
	Counts    map[string]int
}

// censusOrder is the census's states as the overview lists them: the two
// an operator acts on first. The census counts stored states: its
// in_progress holds the leases that ran out (lease_expired) too.
var censusOrder = []string{recordstate.OutcomeUnknown, recordstate.InProgress, recordstate.Completed, recordstate.Expired}

// CensusLabel names a state of the census as the overview and ledgerd's
// idemledger_records gauge do (recordstate's names).
var CensusLabel = map[ledger.State]string{ledger.StateUnknown: recordstate.OutcomeUnknown, ledger.StateInProgress: recordstate.InProgress,
	ledger.StateCompleted: recordstate.Completed, ledger.StateExpired: recordstate.Expired}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	d := overviewData{States: censusOrder, Totals: map[string]int{}, Store: c.cfg.Store, Ready: "serving"}
	if c.cfg.Census != nil {
		var census ledger.Census
		census, d.CensusAt = c.cfg.Census()
		for ns, byState := range census {
			counts := map[string]int{}
			for st, n := range byState {
				counts[CensusLabel[st]] = n
				d.Totals[CensusLabel[st]] += n
			}
			d.Namespaces = append(d.Namespaces, namespaceCount{Namespace: ns, Counts: counts})
		}
		slices.SortFunc(d.Namespaces, func(a, b namespaceCount) int { return strings.Compare(a.Namespace, b.Namespace) })
	}
	if c.cfg.Ready != nil {
		if err := c.cfg.Ready(r.Context()); err != nil {
			d.Ready = "not serving: " + err.Error()
		}
	}
	if c.cfg.Decisions != nil {
		d.Chart = newChart(c.cfg.Decisions())
	}
	c.render(w, http.StatusOK, "overview", view{Title: "Overview", Who: s.who, CSRF: s.csrf, Data: d})
}

// recordsData is the search page's.
type recordsData struct {
	Namespace, Tenant, State, Prefix, Method string
	From, To                                 string // first claimed, in UTC: "2006-01-02T15:04"
	States                                   []string
	Records                                  []*ledgerv1.AdminRecord
	Next, Page                               string
	Searched                                 bool
	Scanned                                  int
}

// records searches a namespace, a page at a time as AdminService pages
// it. The key prefix and the method narrow the page's records: a page may
// be short, with a next page.
func (c *Console) records(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := recordsData{Namespace: q.Get("namespace"), Tenant: q.Get("tenant"), State: q.Get("state"),
		Prefix: q.Get("prefix"), Method: q.Get("method"), From: q.Get("from"), To: q.Get("to"), Page: q.Get("page"), States: recordstate.Names}
	from, to, err := timeRange(d.From, d.To)
	if err != nil {
		c.fail(w, s, err)
		return
	}
	if d.Namespace == "" {
		c.render(w, http.StatusOK, "records", view{Title: "Search", Who: s.who, CSRF: s.csrf, Data: d})
		return
	}
	st, keep, ok := recordstate.Filter(d.State)
	if !ok {
		c.fail(w, s, errcode.Errorf(errcode.ValidationFailed, "unknown state %q: one of %s", d.State, strings.Join(recordstate.Names, ", ")))
		return
	}
	req := &ledgerv1.ListRecordsRequest{Namespace: d.Namespace, Tenant: d.Tenant, PageToken: d.Page, PageSize: 100, State: st}
	res, err := c.cfg.Admin.ListRecords(s.as(r), req)
	if err != nil {
		c.fail(w, s, err)
		return
	}
	d.Searched, d.Next, d.Scanned = true, res.GetNextPageToken(), len(res.GetRecords())
	now := c.cfg.Now()
	for _, rec := range res.GetRecords() {
		created := rec.GetRecord().GetCreatedAt().AsTime()
		if strings.HasPrefix(rec.GetKey(), d.Prefix) && (d.Method == "" || rec.GetRecord().GetMethod() == d.Method) &&
			!created.Before(from) && (to.IsZero() || created.Before(to)) && keep(rec.GetRecord(), now) {
			d.Records = append(d.Records, rec)
		}
	}
	c.render(w, http.StatusOK, "records", view{Title: "Search", Who: s.who, CSRF: s.csrf, Data: d})
}

// timeRange reads the search's range of first claims, in UTC to the
// minute; the end is the minute after to.
func timeRange(from, to string) (time.Time, time.Time, error) {
	var f, t time.Time
	var err error
	if from != "" {
		if f, err = time.Parse(minute, from); err != nil {
			return f, t, errcode.Errorf(errcode.ValidationFailed, "from %q is not a time such as 2026-12-02T15:04", from)
		}
	}
	if to != "" {
		if t, err = time.Parse(minute, to); err != nil {
			return f, t, errcode.Errorf(errcode.ValidationFailed, "to %q is not a time such as 2026-12-02T15:04", to)
		}
		t = t.Add(time.Minute)
	}
	return f, t, nil
}

const minute = "2006-01-02T15:04"

// recordData is the record page's.
type recordData struct {
	Rec      *ledgerv1.AdminRecord
	Timeline []event
	Outcome  decoded
	// Kind is the kind of outcome the record's method stores: the form
	// "Resolve: applied" asks for that one.
	Kind string
}

// event is one line of a record's timeline.
type event struct{ When, What string }

func (c *Console) record(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	res, err := c.cfg.Admin.GetRecord(s.as(r), &ledgerv1.GetRecordRequest{Namespace: q.Get("namespace"), Tenant: q.Get("tenant"), Key: q.Get("key")})
	if err != nil {
		c.fail(w, s, err)
		return
	}
	ar := res.GetRecord()
	d := recordData{Rec: ar, Timeline: timeline(ar), Outcome: decode(ar.GetRecord().GetOutcome()), Kind: outcomeKind(ar.GetRecord().GetMethod())}
	if c.cfg.Audit != nil {
		d.Timeline = withResolutions(d.Timeline, ar, c.cfg.Audit(false))
	}
	c.render(w, http.StatusOK, "record", view{Title: "Record " + ar.GetKey(), Who: s.who, CSRF: s.csrf, Data: d})
}

// timeline is what a record says of its history: when it was first
// claimed, its attempts and the token of the latest, when its lease ends,
// when its outcome was stored, and when it expires and is forgotten.
func timeline(ar *ledgerv1.AdminRecord) []event {
	rec := ar.GetRecord()
	var ev []event
	at := func(ts *timestamppb.Timestamp, what string) {
		if ts != nil {
			ev = append(ev, event{When: funcs["when"].(func(*timestamppb.Timestamp) string)(ts), What: what})
		}
	}
	at(rec.GetCreatedAt(), "first claimed (attempt 1)")
	if rec.GetAttempt() > 1 {
		ev = append(ev, event{What: fmt.Sprintf("attempt %d holds token %d (taken over after a lease ran out)", rec.GetAttempt(), ar.GetToken())})
	} else {
		ev = append(ev, event{What: fmt.Sprintf("attempt 1 holds token %d", ar.GetToken())})
	}
	switch rec.GetState() {
	case ledgerv1.State_STATE_IN_PROGRESS:
		at(rec.GetLeaseExpiresAt(), "lease ends ("+strings.ToLower(strings.TrimPrefix(rec.GetOnLeaseExpiry().String(), "ON_LEASE_EXPIRY_"))+" after it)")
	case ledgerv1.State_STATE_OUTCOME_UNKNOWN:
		at(rec.GetLeaseExpiresAt(), "lease ran out: outcome unknown until someone resolves it")
	case ledgerv1.State_STATE_COMPLETED:
		at(rec.GetCompletedAt(), "outcome stored")
	case ledgerv1.State_STATE_EXPIRED:
		at(rec.GetCompletedAt(), "outcome stored")
		ev = append(ev, event{What: "outcome dropped: a tombstone says the call ran"})
	}
	at(rec.GetExpiresAt(), "expires: the outcome is dropped, a tombstone stays")
	at(rec.GetForgetAt(), "forgotten: the key may be used afresh")
	return byTime(ev)
}

// withResolutions adds to a record's timeline who resolved its key and
// when, as the audit lines this ledgerd kept say (since it started).
func withResolutions(ev []event, ar *ledgerv1.AdminRecord, audit []AuditEntry) []event {
	scope := []string{"namespace=" + ar.GetNamespace(), "tenant=" + ar.GetTenant(), "key=" + ar.GetKey()}
	for _, e := range audit {
		if e.Action != "record resolved" || !containsAll(e.Attrs, scope) {
			continue
		}
		what := "resolved as not applied"
		if slices.Contains(e.Attrs, "applied=true") {
			what = "resolved as applied"
		}
		what += " by " + e.Who
		ev = append(ev, event{When: e.Time.UTC().Format("2006-01-02 15:04:05.000 UTC"), What: what})
	}
	return byTime(ev)
}

// byTime orders a timeline by time; a line without one stays after the
// line before it.
func byTime(ev []event) []event {
	slices.SortStableFunc(ev, func(a, b event) int {
		if a.When == "" || b.When == "" {
			return 0
		}
		return strings.Compare(a.When, b.When)
	})
	return ev
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// resolve settles a record whose outcome nobody knows: not applied, or
// applied with the outcome the operator gives (a type URL and its bytes
// as text). The operator types the key to confirm.
func (c *Console) resolve(w http.ResponseWriter, r *http.Request, s *session) {
	req := &ledgerv1.ResolveRecordRequest{Namespace: r.PostFormValue("namespace"), Tenant: r.PostFormValue("tenant"), Key: r.PostFormValue("key")}
	if r.PostFormValue("confirm") != req.GetKey() {
		c.fail(w, s, errcode.Errorf(errcode.ValidationFailed, "type the key to confirm"))
		return
	}
	switch r.PostFormValue("applied") {
	case "no":
		req.Resolution = &ledgerv1.ResolveRecordRequest_NotApplied{NotApplied: &ledgerv1.NotApplied{}}
	case "yes":
		// The outcome's type follows from the record's method, read now.
		got, err := c.cfg.Admin.GetRecord(s.as(r), &ledgerv1.GetRecordRequest{Namespace: req.GetNamespace(), Tenant: req.GetTenant(), Key: req.GetKey()})
		if err != nil {
			c.fail(w, s, err)
			return
		}
		applied, err := appliedOutcome(got.GetRecord().GetRecord().GetMethod(), r.PostFormValue)
		if err != nil {
			c.fail(w, s, err)
			return
		}
		req.Resolution = &ledgerv1.ResolveRecordRequest_Applied{Applied: applied}
	default:
		c.fail(w, s, errcode.Errorf(errcode.ValidationFailed, "say whether the write happened"))
		return
	}
	res, err := c.cfg.Admin.ResolveRecord(s.as(r), req)
	if err != nil {
		c.fail(w, s, err)
		return
	}
	what := "resolved as not applied: the next attempt claims the key afresh"
	if res.GetRecord() != nil {
		what = "resolved as applied: later attempts replay the outcome given"
	}
	c.done(w, s, req.GetNamespace(), req.GetTenant(), req.GetKey(), what)
}

// purgeKey erases one record; the operator types its key to confirm.
func (c *Console) purgeKey(w http.ResponseWriter, r *http.Request, s *session) {
	req := &ledgerv1.PurgeKeyRequest{Namespace: r.PostFormValue("namespace"), Tenant: r.PostFormValue("tenant"), Key: r.PostFormValue("key")}
	if r.PostFormValue("confirm") != req.GetKey() {
		c.fail(w, s, errcode.Errorf(errcode.ValidationFailed, "type the key to confirm"))
		return
	}
	res, err := c.cfg.Admin.PurgeKey(s.as(r), req)
	if err != nil {
		c.fail(w, s, err)
		return
	}
	what := "nothing to purge: the key has no record"
	if res.GetPurged() {
		what = "purged: the record and its outcome are erased"
	}
	c.done(w, s, req.GetNamespace(), req.GetTenant(), req.GetKey(), what)
}

// purgeTenant erases a tenant's records, a call of AdminService at a
// time; the operator types the tenant to confirm.
func (c *Console) purgeTenant(w http.ResponseWriter, r *http.Request, s *session) {
	req := &ledgerv1.PurgeTenantRequest{Namespace: r.PostFormValue("namespace"), Tenant: r.PostFormValue("tenant")}
	if r.PostFormValue("confirm") != req.GetTenant() || req.GetTenant() == "" {
		c.fail(w, s, errcode.Errorf(errcode.ValidationFailed, "type the tenant to confirm"))
		return
	}
	res, err := c.cfg.Admin.PurgeTenant(s.as(r), req)
	if err != nil {
		c.fail(w, s, err)
		return
	}
	what := fmt.Sprintf("purged %d records, skipped %d (in progress or unknown)", res.GetPurged(), res.GetSkipped())
	if res.GetMore() {
		what += "; more remain: purge again"
	}
	c.done(w, s, req.GetNamespace(), req.GetTenant(), "", what)
}

// doneData is what an action's page says.
type doneData struct{ Namespace, Tenant, Key, What string }

func (c *Console) done(w http.ResponseWriter, s *session, ns, tenant, key, what string) {
	c.render(w, http.StatusOK, "done", view{Title: "Done", Who: s.who, CSRF: s.csrf, Data: doneData{ns, tenant, key, what}})
}

// AuditEntry is one admin action as ledgerd audited it.
type AuditEntry struct {
	Time        time.Time
	Action      string // "record resolved", "list", "console sign-in refused", …
	Who, Tenant string
	Read        bool     // a list or a get
	Attrs       []string // key=value
}

// auditData is the audit page's: its filters and the lines they keep.
type auditData struct {
	Who, Action, Tenant, From, To string
	Reads                         bool
	Entries                       []AuditEntry
	Kept                          int
}

// auditPage lists the audit lines kept, newest first, filtered by who,
// action (a part of it), tenant and time; reads (list, get) only when
// asked for, so that browsing does not bury the changes.
func (c *Console) auditPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	d := auditData{Who: q.Get("who"), Action: q.Get("action"), Tenant: q.Get("tenant"), From: q.Get("from"), To: q.Get("to"), Reads: q.Get("reads") == "on"}
	from, to, err := timeRange(d.From, d.To)
	if err != nil {
		c.fail(w, s, err)
		return
	}
	var entries []AuditEntry
	if c.cfg.Audit != nil {
		entries = c.cfg.Audit(d.Reads)
	}
	d.Kept = len(entries)
	for _, e := range entries {
		if (d.Who == "" || e.Who == d.Who) && strings.Contains(e.Action, d.Action) && (d.Tenant == "" || e.Tenant == d.Tenant) &&
			!e.Time.Before(from) && (to.IsZero() || e.Time.Before(to)) {
			d.Entries = append(d.Entries, e)
		}
	}
	c.render(w, http.StatusOK, "audit", view{Title: "Audit", Who: s.who, CSRF: s.csrf, Data: d})
}

// chart is the decisions a minute, drawn as an SVG polyline.
type chart struct {
	Points   string
	Max, Sum int
	Width    int
	Height   int
}

func newChart(perMinute []int) chart {
	ch := chart{Width: 600, Height: 120}
	for _, n := range perMinute {
		ch.Max = max(ch.Max, n)
		ch.Sum += n
	}
	var pts []string
	for i, n := range perMinute {
		x := 0
		if len(perMinute) > 1 {
			x = i * ch.Width / (len(perMinute) - 1)
		}
		y := ch.Height
		if ch.Max > 0 {
			y = ch.Height - n*ch.Height/ch.Max
		}
		pts = append(pts, strconv.Itoa(x)+","+strconv.Itoa(y))
	}
	ch.Points = strings.Join(pts, " ")
	return ch
}
