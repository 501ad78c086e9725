package ledgertest

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

func ruleClaimAbsent(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustClaim("k", "p")
	if c.Token == 0 || c.Attempt != 1 || !c.LeaseExpiresAt.Equal(Start.Add(ledger.DefaultLease)) {
		t.Fatalf("claim = %+v; want a token, attempt 1, lease to %s", c, Start.Add(ledger.DefaultLease))
	}
	rec, err := e.ledger.Lookup(t.Context(), e.scope("k"), 0)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != ledger.StateInProgress || rec.Method != Method || rec.Fingerprint != Fingerprint("p") ||
		rec.Attempt != 1 || !rec.CreatedAt.Equal(Start) || !rec.ExpiresAt.Equal(Start.Add(ledger.DefaultRetention)) || rec.Outcome != nil {
		t.Fatalf("Lookup = %+v", rec)
	}
}

func ruleReplayIsByteForByte(t *testing.T, suite Suite) {
	for name, out := range map[string]*ledger.Outcome{"response": Response("inv_1"), "status": ErrorStatus("card declined")} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, suite, ledger.Config{})
			c := e.mustClaim("k", "p")
			e.clock.Advance(time.Second)
			done, err := e.ledger.Complete(t.Context(), e.scope("k"), c.Token, out)
			if err != nil {
				t.Fatal(err)
			}
			if done.State != ledger.StateCompleted || !done.CompletedAt.Equal(Start.Add(time.Second)) {
				t.Fatalf("Complete = %+v", done)
			}
			for range 3 {
				e.clock.Advance(time.Minute)
				res, err := e.begin("k", "p")
				if err != nil || res.Replay == nil {
					t.Fatalf("Begin = %+v, %v; want a replay", res, err)
				}
				if d := diffOutcome(out, res.Replay.Outcome); d != "" {
					t.Fatalf("replay (-want +got):\n%s", d)
				}
				if out.Response != nil && !bytes.Equal(res.Replay.Outcome.Response.GetValue(), out.Response.GetValue()) {
					t.Fatalf("replayed bytes %x, want %x", res.Replay.Outcome.Response.GetValue(), out.Response.GetValue())
				}
				if !res.Replay.CompletedAt.Equal(Start.Add(time.Second)) || res.Replay.Attempt != 1 {
					t.Fatalf("replay = %+v", res.Replay)
				}
			}
		})
	}
}

func ruleKeyReused(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustClaim("k", "p")
	_, err := e.begin("k", "another payload")
	if le := WantCode(t, err, errcode.KeyReused); le.Metadata["method"] != Method {
		t.Fatalf("metadata = %v, want method %s", le.Metadata, Method)
	}
	if _, err := e.ledger.Complete(t.Context(), e.scope("k"), c.Token, Response("x")); err != nil {
		t.Fatal(err)
	}
	_, err = e.begin("k", "another payload")
	_ = WantCode(t, err, errcode.KeyReused)
	// An expired lease is no takeover for another payload.
	e2 := newEnv(t, suite, ledger.Config{})
	e2.mustClaim("k", "p")
	e2.clock.Advance(time.Hour)
	_, err = e2.begin("k", "another payload")
	_ = WantCode(t, err, errcode.KeyReused)
}

func ruleInProgressRetryAfter(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	req := ledger.BeginRequest{Scope: e.scope("k"), Fingerprint: Fingerprint("p"), Method: Method, Lease: time.Second}
	if _, err := e.ledger.Begin(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(700 * time.Millisecond)
	_, err := e.ledger.Begin(t.Context(), req)
	if le := WantCode(t, err, errcode.InProgress); le.RetryAfter != 300*time.Millisecond {
		t.Fatalf("retry after = %s, want 300ms (time left on the lease)", le.RetryAfter)
	}
	// A long lease is capped.
	req.Scope, req.Lease = e.scope("long"), 10*time.Minute
	if _, err := e.ledger.Begin(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	_, err = e.ledger.Begin(t.Context(), req)
	if le := WantCode(t, err, errcode.InProgress); le.RetryAfter != ledger.DefaultMaxRetryAfter {
		t.Fatalf("retry after = %s, want the cap %s", le.RetryAfter, ledger.DefaultMaxRetryAfter)
	}
}

func ruleTakeoverFencesTheOldToken(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	old := e.mustClaim("k", "p")
	e.clock.Advance(ledger.DefaultLease - time.Microsecond)
	_, err := e.begin("k", "p")
	want(t, err, errcode.InProgress)
	e.clock.Advance(time.Microsecond)
	c := e.mustClaim("k", "p")
	if c.Token != old.Token+1 || c.Attempt != 2 || !c.LeaseExpiresAt.Equal(e.clock.Now().Add(ledger.DefaultLease)) {
		t.Fatalf("takeover = %+v, want token %d, attempt 2", c, old.Token+1)
	}
	// The takeover is an attempt of the same record: a fence in the write
	// service's database tells the records of a key apart by CreatedAt.
	if !c.CreatedAt.Equal(old.CreatedAt) || c.CreatedAt.IsZero() || c.ExpiresAt.Before(old.ExpiresAt) {
		t.Fatalf("takeover = %+v, want the record's creation and retention of the first claim %+v", c, old)
	}
	s := e.scope("k")
	_, err = e.ledger.Extend(t.Context(), s, old.Token, 0)
	want(t, err, errcode.LeaseLost)
	want(t, e.ledger.Release(t.Context(), s, old.Token), errcode.LeaseLost)
	_, err = e.ledger.Complete(t.Context(), s, old.Token, Response("old"))
	want(t, err, errcode.LeaseLost)
	if _, err := e.ledger.Complete(t.Context(), s, c.Token, Response("new")); err != nil {
		t.Fatal(err)
	}
	res, err := e.begin("k", "p")
	if err != nil || res.Replay == nil || res.Replay.Attempt != 2 {
		t.Fatalf("Begin = %+v, %v; want a replay of attempt 2", res, err)
	}
}

func ruleCompleteAfterLeaseRanOutWithoutTakeover(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustClaim("k", "p")
	e.clock.Advance(ledger.DefaultLease * 2)
	if _, err := e.ledger.Complete(t.Context(), e.scope("k"), c.Token, Response("late")); err != nil {
		t.Fatalf("Complete by the current token after its lease ran out: %v", err)
	}
}

func ruleCompleteRepeated(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustClaim("k", "p")
	s := e.scope("k")
	first, err := e.ledger.Complete(t.Context(), s, c.Token, Response("a"))
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Second)
	again, err := e.ledger.Complete(t.Context(), s, c.Token, Response("a"))
	if err != nil {
		t.Fatalf("the same Complete repeated: %v", err)
	}
	if !again.CompletedAt.Equal(first.CompletedAt) {
		t.Fatalf("repeated Complete moved completed_at from %s to %s", first.CompletedAt, again.CompletedAt)
	}
	_, err = e.ledger.Complete(t.Context(), s, c.Token, Response("b"))
	want(t, err, errcode.LeaseLost)
	_, err = e.ledger.Complete(t.Context(), s, c.Token+1, Response("a"))
	want(t, err, errcode.LeaseLost)
	want(t, e.ledger.Release(t.Context(), s, c.Token), errcode.LeaseLost)
	_, err = e.ledger.Extend(t.Context(), s, c.Token, 0)
	want(t, err, errcode.LeaseLost)
	res, err := e.begin("k", "p")
	if err != nil || res.Replay == nil {
		t.Fatalf("Begin = %+v, %v", res, err)
	}
	if d := diffOutcome(Response("a"), res.Replay.Outcome); d != "" {
		t.Fatalf("replay (-want +got):\n%s", d)
	}
}

func ruleAbsentKeyIsLeaseLost(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	s := e.scope("nobody")
	_, err := e.ledger.Complete(t.Context(), s, 1, Response("x"))
	want(t, err, errcode.LeaseLost)
	want(t, e.ledger.Release(t.Context(), s, 1), errcode.LeaseLost)
	_, err = e.ledger.Extend(t.Context(), s, 1, 0)
	want(t, err, errcode.LeaseLost)
	_, err = e.ledger.Lookup(t.Context(), s, 0)
	want(t, err, errcode.NotFound)
}

// ruleClaimNamesItsRecord: a claim says when its record was created and
// until when it is kept; a claim of the key after its record was released
// names a new record.
func ruleClaimNamesItsRecord(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustClaim("k", "p")
	if !c.CreatedAt.Equal(e.clock.Now()) || !c.ExpiresAt.Equal(e.clock.Now().Add(ledger.DefaultRetention)) {
		t.Fatalf("claim = %+v, want created now and kept for the default retention", c)
	}
	if err := e.ledger.Release(t.Context(), e.scope("k"), c.Token); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Millisecond)
	if next := e.mustClaim("k", "p"); !next.CreatedAt.Equal(e.clock.Now()) || next.Token <= c.Token {
		t.Fatalf("claim after release = %+v, want a new record created now, with a token above %d", next, c.Token)
	}
}

func ruleRelease(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	s := e.scope("k")
	c := e.mustClaim("k", "p")
	if err := e.ledger.Release(t.Context(), s, c.Token); err != nil {
		t.Fatal(err)
	}
	if err := e.ledger.Release(t.Context(), s, c.Token); err != nil {
		t.Fatalf("the same Release repeated: %v", err)
	}
	_, err := e.ledger.Lookup(t.Context(), s, 0)
	want(t, err, errcode.NotFound)
	_, err = e.ledger.Complete(t.Context(), s, c.Token, Response("x"))
	want(t, err, errcode.LeaseLost)
	// The key is absent again: even another payload may claim it, with a
	// higher token, so the released holder stays fenced.
	next := e.mustClaim("k", "another payload")
	if next.Token <= c.Token || next.Attempt != 1 {
		t.Fatalf("claim after release = %+v, want a token above %d and attempt 1", next, c.Token)
	}

	want(t, e.ledger.Release(t.Context(), s, c.Token), errcode.LeaseLost)
	_, err = e.ledger.Complete(t.Context(), s, c.Token, Response("x"))
	want(t, err, errcode.LeaseLost)
}

func ruleExtend(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	s := e.scope("k")
	c := e.mustClaim("k", "p")
	e.clock.Advance(20 * time.Second)
	rec, err := e.ledger.Extend(t.Context(), s, c.Token, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if want := e.clock.Now().Add(time.Minute); !rec.LeaseExpiresAt.Equal(want) {
		t.Fatalf("lease expires at %s, want %s", rec.LeaseExpiresAt, want)
	}
	e.clock.Advance(30 * time.Second) // past the first lease, inside the extended one
	_, err = e.begin("k", "p")
	want(t, err, errcode.InProgress)
	e.clock.Advance(31 * time.Second)
	if c2 := e.mustClaim("k", "p"); c2.Token != c.Token+1 {
		t.Fatalf("takeover token = %d, want %d", c2.Token, c.Token+1)
	}
	// A lease that reaches past the retention keeps the record alive.
	req := ledger.BeginRequest{Scope: e.scope("short"), Fingerprint: Fingerprint("p"), Method: Method, Lease: time.Minute, Retention: time.Minute}
	res, err := e.ledger.Begin(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(50 * time.Second)
	rec, err = e.ledger.Extend(t.Context(), req.Scope, res.Claim.Token, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ExpiresAt.Before(rec.LeaseExpiresAt) {
		t.Fatalf("record expires at %s, before its lease %s", rec.ExpiresAt, rec.LeaseExpiresAt)
	}
	e.clock.Advance(50 * time.Second)
	_, err = e.ledger.Begin(t.Context(), req)
	want(t, err, errcode.InProgress)
}

// noTombstones is a ledger configuration whose records keep no tombstone:
// a record past its retention is absent at once.
var noTombstones = ledger.Config{DefaultTombstoneRetention: -1}

func ruleRetentionExpiry(t *testing.T, suite Suite) {
	e := newEnv(t, suite, noTombstones)
	s := e.scope("k")
	req := ledger.BeginRequest{Scope: s, Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour}
	res, err := e.ledger.Begin(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.ledger.Complete(t.Context(), s, res.Claim.Token, Response("x")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour - time.Microsecond)
	if res, err := e.ledger.Begin(t.Context(), req); err != nil || res.Replay == nil {
		t.Fatalf("Begin just inside the retention = %+v, %v; want a replay", res, err)
	}
	e.clock.Advance(time.Microsecond)
	_, err = e.ledger.Lookup(t.Context(), s, 0)
	want(t, err, errcode.NotFound)
	req.Fingerprint = Fingerprint("another payload")
	again, err := e.ledger.Begin(t.Context(), req)
	if err != nil || again.Claim == nil {
		t.Fatalf("Begin after the retention = %+v, %v; want a fresh claim", again, err)
	}
	if again.Claim.Token <= res.Claim.Token || again.Claim.Attempt != 1 {
		t.Fatalf("claim after expiry = %+v, want a token above %d and attempt 1", again.Claim, res.Claim.Token)
	}
}

func ruleRetryTooLate(t *testing.T, suite Suite) {
	e := newEnv(t, suite, noTombstones)
	s := e.scope("k")
	req := ledger.BeginRequest{Scope: s, Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour,
		FirstAttemptAt: Start.Add(-time.Hour - time.Second)}
	_, err := e.ledger.Begin(t.Context(), req)
	want(t, err, errcode.RetryTooLate)
	_, err = e.ledger.Lookup(t.Context(), s, 0)
	want(t, err, errcode.NotFound)
	// The refusal leaves no trace: no token to release, and the next
	// claim is the first.
	want(t, e.ledger.Release(t.Context(), s, 1), errcode.LeaseLost)
	req.FirstAttemptAt = Start.Add(-time.Hour + time.Second)
	res, err := e.ledger.Begin(t.Context(), req)
	if err != nil || res.Claim == nil || res.Claim.Token != 1 || res.Claim.Attempt != 1 {
		t.Fatalf("Begin inside the window = %+v, %v; want the first claim (token 1)", res, err)
	}
	// A stored outcome is still replayed: a replay is no second execution.
	if _, err := e.ledger.Complete(t.Context(), s, res.Claim.Token, Response("x")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(30 * time.Minute)
	if res, err := e.ledger.Begin(t.Context(), req); err != nil || res.Replay == nil {
		t.Fatalf("late Begin of a completed key = %+v, %v; want a replay", res, err)
	}
}

func ruleLookup(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	s := e.scope("k")
	c := e.mustClaim("k", "p")
	e.clock.Advance(time.Second)
	if _, err := e.ledger.Complete(t.Context(), s, c.Token, ErrorStatus("no")); err != nil {
		t.Fatal(err)
	}
	rec, err := e.ledger.Lookup(t.Context(), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != ledger.StateCompleted || !rec.CompletedAt.Equal(Start.Add(time.Second)) || rec.Attempt != 1 {
		t.Fatalf("Lookup = %+v", rec)
	}
	if d := diffOutcome(ErrorStatus("no"), rec.Outcome); d != "" {
		t.Fatalf("outcome (-want +got):\n%s", d)
	}
}

func ruleLookupWait(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	s := e.scope("k")
	c := e.mustClaim("k", "p")
	rec, err := e.ledger.Lookup(t.Context(), s, 20*time.Millisecond)
	if err != nil || rec.State != ledger.StateInProgress {
		t.Fatalf("Lookup whose wait runs out = %v, %v; want IN_PROGRESS", rec.State, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(30 * time.Millisecond)
		if _, err := e.ledger.Complete(t.Context(), s, c.Token, Response("x")); err != nil {
			t.Error(err)
		}
	})
	rec, err = e.ledger.Lookup(t.Context(), s, 10*time.Second)
	wg.Wait()
	if err != nil || rec.State != ledger.StateCompleted {
		t.Fatalf("Lookup with a wait = %v, %v; want COMPLETED", rec.State, err)
	}
	c2 := e.mustClaim("k2", "p")
	wg.Go(func() {
		time.Sleep(30 * time.Millisecond)
		if err := e.ledger.Release(t.Context(), e.scope("k2"), c2.Token); err != nil {
			t.Error(err)
		}
	})
	_, err = e.ledger.Lookup(t.Context(), e.scope("k2"), 10*time.Second)
	wg.Wait()
	want(t, err, errcode.NotFound)
}

func ruleScopesAreIsolated(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	a := e.mustClaim("k", "p")
	other := ledger.Scope{Namespace: e.ns, Tenant: "tenant-2", Key: "k"}
	res, err := e.ledger.Begin(t.Context(), ledger.BeginRequest{Scope: other, Fingerprint: Fingerprint("q"), Method: Method})
	if err != nil || res.Claim == nil {
		t.Fatalf("Begin in another tenant = %+v, %v; want its own claim", res, err)
	}
	foreign := ledger.Scope{Namespace: e.ns + "-other", Tenant: "tenant-1", Key: "k"}
	_, err = e.ledger.Lookup(t.Context(), foreign, 0)
	want(t, err, errcode.NotFound)
	_, err = e.ledger.Complete(t.Context(), foreign, a.Token, Response("x"))
	want(t, err, errcode.LeaseLost)
	want(t, e.ledger.Release(t.Context(), foreign, a.Token), errcode.LeaseLost)
	if rec, err := e.ledger.Lookup(t.Context(), e.scope("k"), 0); err != nil || rec.State != ledger.StateInProgress {
		t.Fatalf("the first scope's record = %v, %v; want it untouched", rec.State, err)
	}
}

// ruleCanceledCall: a call whose context has ended gets the same answer
// from every store, UPSTREAM_TIMEOUT (retry with the same key), and
// changes nothing.
func ruleCanceledCall(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustClaim("k", "p")
	s := e.scope("k")
	before, err := e.ledger.Lookup(t.Context(), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for name, call := range map[string]func() error{
		"Begin": func() error {
			_, err := e.ledger.Begin(ctx, ledger.BeginRequest{Scope: e.scope("other"), Fingerprint: Fingerprint("p"), Method: Method})
			return err
		},
		"Complete": func() error { _, err := e.ledger.Complete(ctx, s, c.Token, Response("x")); return err },
		"Release":  func() error { return e.ledger.Release(ctx, s, c.Token) },
		"Extend":   func() error { _, err := e.ledger.Extend(ctx, s, c.Token, 0); return err },
		"Lookup":   func() error { _, err := e.ledger.Lookup(ctx, s, 0); return err },
	} {
		if le := WantCode(t, call(), errcode.UpstreamTimeout); !le.Retryable() {
			t.Fatalf("%s: UPSTREAM_TIMEOUT must be retryable", name)
		}
	}
	after, err := e.ledger.Lookup(t.Context(), s, 0)
	if err != nil || after.State != before.State || after.Token != before.Token || !after.LeaseExpiresAt.Equal(before.LeaseExpiresAt) {
		t.Fatalf("the record after canceled calls = %+v, %v; want %+v", after, err, before)
	}
	if _, err := e.ledger.Lookup(t.Context(), e.scope("other"), 0); errcode.Of(err) != errcode.NotFound {
		t.Fatalf("a canceled Begin left a record: %v", err)
	}
}

// ruleKeySource: a record keeps the key's source of its first claim: a
// takeover and a replay leave it, Lookup and List read it, and a new
// record after a release takes its own claim's; a source that is not
// printable ASCII, or too long, is VALIDATION_FAILED.
func ruleKeySource(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	claim := func(key, source string) (ledger.BeginResponse, error) {
		return e.ledger.Begin(t.Context(), ledger.BeginRequest{Scope: e.scope(key), Fingerprint: Fingerprint("p"), Method: Method, KeySource: source})
	}
	source := func(key string) string {
		t.Helper()
		rec, err := e.ledger.Lookup(t.Context(), e.scope(key), 0)
		if err != nil {
			t.Fatal(err)
		}
		return rec.KeySource
	}
	if _, err := claim("k", "host:claudecode/toolUseId"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(ledger.DefaultLease)
	if res, err := claim("k", "meta"); err != nil || res.Claim == nil || res.Claim.Attempt != 2 {
		t.Fatalf("takeover = %+v, %v", res, err)
	}
	if got := source("k"); got != "host:claudecode/toolUseId" {
		t.Fatalf("after a takeover with another source, the record says %q; want its first claim's", got)
	}
	list, err := e.ledger.List(t.Context(), ledger.ListRequest{Namespace: e.ns, Tenant: e.scope("k").Tenant, PageSize: 10})
	if err != nil || len(list.Records) == 0 || list.Records[0].KeySource != "host:claudecode/toolUseId" {
		t.Fatalf("List = %+v, %v", list, err)
	}
	c, err := claim("r", "header")
	if err != nil || c.Claim == nil {
		t.Fatal(err)
	}
	if err := e.ledger.Release(t.Context(), e.scope("r"), c.Claim.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := claim("r", "argument"); err != nil || source("r") != "argument" {
		t.Fatalf("a new record after a release says %q, %v; want its own claim's source", source("r"), err)
	}
	for _, bad := range []string{"meta\n", strings.Repeat("x", ledger.MaxKeySourceBytes+1), "ключ"} {
		_, err := claim("bad", bad)
		want(t, err, errcode.ValidationFailed)
	}
}
