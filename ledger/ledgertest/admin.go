package ledgertest

import (
	"maps"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// The rules of the admin surface: List and Purge (Store.List, Store.Purge).

// adminWorld fills the env's namespace with records in every state, over
// two tenants, and a record of the same keys in another namespace. It
// returns the live records' states by scope, at the clock's time after it.
func adminWorld(t *testing.T, e *env) map[ledger.Scope]ledger.State {
	t.Helper()
	in := func(tenant, key string) ledger.Scope {
		return ledger.Scope{Namespace: e.ns, Tenant: tenant, Key: key}
	}
	begin := func(sc ledger.Scope, p ledger.LeaseExpiry, lease time.Duration) *ledger.Claim {
		return e.mustBegin(ledger.BeginRequest{Scope: sc, Fingerprint: Fingerprint("p"), Method: Method,
			Lease: lease, Retention: time.Hour, OnLeaseExpiry: p})
	}
	complete := func(sc ledger.Scope) {
		c := begin(sc, ledger.Takeover, time.Minute)
		if _, err := e.ledger.Complete(t.Context(), sc, c.Token, Response(sc.Key)); err != nil {
			t.Fatal(err)
		}
	}
	want := map[ledger.Scope]ledger.State{}
	for _, tenant := range []string{"t1", "t2"} {
		for i := range 5 {
			sc := in(tenant, "done-"+string(rune('a'+i)))
			complete(sc)
			want[sc] = ledger.StateCompleted
		}
		// A tombstone: completed long enough ago.
		old := in(tenant, "old")
		complete(old)
		want[old] = ledger.StateExpired
		released := in(tenant, "released")
		c := begin(released, ledger.Takeover, time.Minute)
		if err := e.ledger.Release(t.Context(), released, c.Token); err != nil {
			t.Fatal(err)
		}
	}
	e.clock.Advance(2 * time.Hour) // "old" and every "done-" past retention...
	for sc, st := range want {
		if st == ledger.StateCompleted {
			delete(want, sc)
			want[sc] = ledger.StateExpired
		}
	}
	for _, tenant := range []string{"t1", "t2"} {
		fresh := in(tenant, "fresh")
		complete(fresh)
		want[fresh] = ledger.StateCompleted
		held := in(tenant, "held")
		begin(held, ledger.Takeover, time.Hour)
		want[held] = ledger.StateInProgress
		unknown := in(tenant, "unknown")
		begin(unknown, ledger.Hold, time.Second)
		want[unknown] = ledger.StateUnknown
	}
	e.clock.Advance(2 * time.Second) // the HOLD lease ran out
	other := ledger.Scope{Namespace: e.ns + "-other", Tenant: "t1", Key: "fresh"}
	complete(other)
	return want
}

// listAll pages through a listing and returns what it saw.
func listAll(t *testing.T, e *env, req ledger.ListRequest) (map[ledger.Scope]ledger.State, int) {
	t.Helper()
	seen := map[ledger.Scope]ledger.State{}
	pages := 0
	for {
		res, err := e.ledger.List(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(res.Records) > req.PageSize {
			t.Fatalf("a page of %d records, page size %d", len(res.Records), req.PageSize)
		}
		for _, rec := range res.Records {
			if _, dup := seen[rec.Scope]; dup {
				t.Fatalf("%v listed twice", rec.Scope)
			}
			seen[rec.Scope] = rec.State
			if rec.State == ledger.StateExpired && rec.Outcome != nil {
				t.Fatalf("a tombstone listed with its outcome: %+v", rec)
			}
		}
		if !res.More {
			return seen, pages
		}
		if pages > 100 {
			t.Fatal("the listing does not end")
		}
		req.After = res.Next
	}
}

// ruleList: a listing pages through the live records of a namespace (and
// of one tenant), each once, in the state it reads in, released and other
// namespaces' records left out; a state filter keeps that state only.
func ruleList(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	world := adminWorld(t, e)
	got, pages := listAll(t, e, ledger.ListRequest{Namespace: e.ns, PageSize: 3})
	if !mapsEqual(got, world) || pages < 6 {
		t.Fatalf("listed %v in %d pages, want %v", got, pages, world)
	}
	t1, _ := listAll(t, e, ledger.ListRequest{Namespace: e.ns, Tenant: "t1", PageSize: 2})
	for sc := range world {
		if _, ok := t1[sc]; ok != (sc.Tenant == "t1") {
			t.Fatalf("tenant t1's listing: %v", t1)
		}
	}
	for _, st := range []ledger.State{ledger.StateCompleted, ledger.StateInProgress, ledger.StateUnknown, ledger.StateExpired} {
		only, _ := listAll(t, e, ledger.ListRequest{Namespace: e.ns, State: st, PageSize: 2})
		for sc, s := range world {
			if _, ok := only[sc]; ok != (s == st) {
				t.Fatalf("state %s: listed %v", st, only)
			}
		}
	}
	for _, bad := range []ledger.ListRequest{
		{Namespace: "", PageSize: 10},
		{Namespace: e.ns, PageSize: ledger.MaxListPage + 1},
		{Namespace: e.ns, PageSize: 10, After: ledger.Scope{Namespace: "another", Tenant: "t", Key: "k"}},
	} {
		_, err := e.ledger.List(t.Context(), bad)
		want(t, err, errcode.ValidationFailed)
	}
}

// ruleListScan: a store's page by state reads at most Scan rows: it
// resumes after its Last, which is never more than Scan rows past the
// page before, and holds only records of that state. Paged so, a listing
// by state finds each record of the state once.
func ruleListScan(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	world := adminWorld(t, e)
	all, err := e.store.List(t.Context(), ledger.ListParams{Namespace: e.ns, Limit: ledger.MaxListPage})
	if err != nil || all.More {
		t.Fatalf("the whole listing: %v, more %v", err, all.More)
	}
	// Every row the store holds, in its order, released rows included:
	// a page reads those too.
	var order []ledger.Scope
	for after := (ledger.Scope{}); ; {
		page, err := e.store.List(t.Context(), ledger.ListParams{Namespace: e.ns, After: after, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		if page.Last != (ledger.Scope{}) {
			order = append(order, page.Last)
		}
		if !page.More {
			break
		}
		after = page.Last
	}
	if len(order) < len(all.Records) {
		t.Fatalf("%d rows read one by one, %d records", len(order), len(all.Records))
	}
	at := map[ledger.Scope]int{}
	for i, sc := range order {
		at[sc] = i
	}
	for _, st := range []ledger.State{ledger.StateCompleted, ledger.StateInProgress, ledger.StateUnknown, ledger.StateExpired} {
		seen := map[ledger.Scope]bool{}
		prev := -1
		for after, pages := (ledger.Scope{}), 0; ; pages++ {
			if pages > len(order)+1 {
				t.Fatalf("state %s: the listing does not end", st)
			}
			page, err := e.store.List(t.Context(), ledger.ListParams{Namespace: e.ns, State: st, After: after, Limit: 2, Scan: 3})
			if err != nil {
				t.Fatal(err)
			}
			if len(page.Records) > 2 {
				t.Fatalf("state %s: a page of %d records, limit 2", st, len(page.Records))
			}
			for _, rec := range page.Records {
				if rec.State != st || world[rec.Scope] != st || seen[rec.Scope] {
					t.Fatalf("state %s: listed %v in %s (seen before: %v)", st, rec.Scope, rec.State, seen[rec.Scope])
				}
				seen[rec.Scope] = true
			}
			if page.Last != (ledger.Scope{}) {
				i, ok := at[page.Last]
				if !ok || i <= prev || i > prev+3 {
					t.Fatalf("state %s: a page read from row %d to row %d (%v), more than Scan 3", st, prev+1, i, page.Last)
				}
				prev = i
			}
			if !page.More {
				break
			}
			after = page.Last
		}
		for sc, s := range world {
			if seen[sc] != (s == st) {
				t.Fatalf("state %s: listed %v, world %v", st, seen, world)
			}
		}
	}
}

// rulePurge: a purge erases records (outcomes and tombstones) but never
// one an attempt holds or whose outcome is unknown; a tenant purge goes a
// limit at a time and leaves other tenants and namespaces alone.
func rulePurge(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	world := adminWorld(t, e)
	key := func(tenant, key string) ledger.Scope { return ledger.Scope{Namespace: e.ns, Tenant: tenant, Key: key} }

	res, err := e.ledger.Purge(t.Context(), key("t1", "fresh"), 0)
	if err != nil || res.Purged != 1 {
		t.Fatalf("purge a completed record: %+v, %v", res, err)
	}
	if _, err := e.ledger.Get(t.Context(), key("t1", "fresh")); errcode.Of(err) != errcode.NotFound {
		t.Fatalf("after its purge: %v", err)
	}
	if res, err := e.ledger.Purge(t.Context(), key("t1", "no-such-key"), 0); err != nil || res.Purged != 0 {
		t.Fatalf("purge of nothing: %+v, %v", res, err)
	}
	for _, k := range []string{"held", "unknown"} {
		_, err := e.ledger.Purge(t.Context(), key("t1", k), 0)
		want(t, err, errcode.ValidationFailed)
		if rec, err := e.ledger.Get(t.Context(), key("t1", k)); err != nil || rec.State != world[key("t1", k)] {
			t.Fatalf("a refused purge changed %s: %+v, %v", k, rec, err)
		}
	}

	// Tenant t2: 9 live records, 2 of them held: calls of 3 until none is
	// left to erase.
	total, calls := 0, 0
	for {
		res, err := e.ledger.Purge(t.Context(), ledger.Scope{Namespace: e.ns, Tenant: "t2"}, 3)
		if err != nil {
			t.Fatal(err)
		}
		calls++
		total += res.Purged
		if res.Purged > 3 || res.Skipped != 2 {
			t.Fatalf("a tenant purge: %+v", res)
		}
		if !res.More {
			break
		}
		if calls > 10 {
			t.Fatal("the tenant purge does not end")
		}
	}
	if total != 7 || calls != 3 {
		t.Fatalf("purged %d of tenant t2's 7 erasable records in %d calls", total, calls)
	}
	left, _ := listAll(t, e, ledger.ListRequest{Namespace: e.ns, Tenant: "t2", PageSize: 10})
	if len(left) != 2 || left[key("t2", "held")] != ledger.StateInProgress || left[key("t2", "unknown")] != ledger.StateUnknown {
		t.Fatalf("tenant t2 after its purge: %v", left)
	}
	if t1, _ := listAll(t, e, ledger.ListRequest{Namespace: e.ns, Tenant: "t1", PageSize: 10}); len(t1) != 8 {
		t.Fatalf("tenant t1 after t2's purge: %v", t1)
	}
	if _, err := e.ledger.Get(t.Context(), ledger.Scope{Namespace: e.ns + "-other", Tenant: "t1", Key: "fresh"}); err != nil {
		t.Fatalf("another namespace's record after the purges: %v", err)
	}
	// A purged key starts afresh.
	if c := e.mustBegin(ledger.BeginRequest{Scope: key("t1", "fresh"), Fingerprint: Fingerprint("other"), Method: Method}); c.Attempt != 1 {
		t.Fatalf("a purged key claimed again: %+v", c)
	}
	_, err = e.ledger.Purge(t.Context(), ledger.Scope{Namespace: e.ns, Tenant: "t2"}, ledger.MaxPurgeSize+1)
	want(t, err, errcode.ValidationFailed)
}

func mapsEqual(a, b map[ledger.Scope]ledger.State) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// CountsByState checks a store's census (Store.CountByState) on a fresh store
// that newStore makes with the given clock: every live record counted once,
// in the state it reads in now.
func CountsByState(t *testing.T, newStore func(now func() time.Time) ledger.Store) {
	t.Helper()
	clock := NewClock(Start)
	e := &env{t: t, clock: clock, ledger: ledger.New(newStore(clock.Now), ledger.Config{}), ns: "ns-" + randomHex(8)}
	world := adminWorld(t, e)
	want := ledger.Census{}
	want.Add(e.ns+"-other", ledger.StateCompleted) // the other namespace's record
	for sc, st := range world {
		want.Add(sc.Namespace, st)
	}
	got, err := e.ledger.Store().CountByState(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !maps.EqualFunc(got, want, maps.Equal) {
		t.Fatalf("census %v, want %v", got, want)
	}
}
