package ledgertest

import (
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// The rules of tombstones, the HOLD policy and OUTCOME_UNKNOWN, and
// Resolve.

// hold is a Begin request of the HOLD policy with a 10 s lease and an hour
// of retention.
func (e *env) hold(key string) ledger.BeginRequest {
	return ledger.BeginRequest{Scope: e.scope(key), Fingerprint: Fingerprint("p"), Method: Method,
		Lease: 10 * time.Second, Retention: time.Hour, OnLeaseExpiry: ledger.Hold}
}

func (e *env) mustBegin(req ledger.BeginRequest) *ledger.Claim {
	e.t.Helper()
	res, err := e.ledger.Begin(e.t.Context(), req)
	if err != nil || res.Claim == nil {
		e.t.Fatalf("Begin(%s) = %+v, %v; want a claim", req.Scope.Key, res, err)
	}
	return res.Claim
}

func (e *env) lookupState(key string) ledger.State {
	e.t.Helper()
	rec, err := e.ledger.Lookup(e.t.Context(), e.scope(key), 0)
	if errcode.Of(err) == errcode.NotFound {
		return ledger.StateAbsent
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return rec.State
}

// ruleTombstone: a completed record past its retention is a tombstone
// until ForgetAt: Lookup says EXPIRED and shows no outcome, a Begin with
// the same fingerprint is KEY_EXPIRED (never a second run), with another
// KEY_REUSED; RETRY_TOO_LATE waits for both windows; past ForgetAt the key
// is free again, with a higher token.
func ruleTombstone(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	week := 7 * 24 * time.Hour
	req := ledger.BeginRequest{Scope: e.scope("k"), Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour}
	c := e.mustBegin(req)
	if _, err := e.ledger.Complete(t.Context(), e.scope("k"), c.Token, Response("inv")); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	rec, err := e.ledger.Lookup(t.Context(), e.scope("k"), 0)
	if err != nil || rec.State != ledger.StateExpired || rec.Outcome != nil || !rec.ForgetAt.Equal(Start.Add(time.Hour+week)) {
		t.Fatalf("Lookup of a tombstone = %+v, %v; want EXPIRED, no outcome, forgotten a week after the retention", rec, err)
	}
	_, err = e.ledger.Begin(t.Context(), req)
	if le := WantCode(t, err, errcode.KeyExpired); le.Retryable() || le.Metadata["completedAt"] == "" {
		t.Fatalf("KEY_EXPIRED %+v: want permanent, with completedAt", le)
	}
	other := req
	other.Fingerprint = Fingerprint("another payload")
	_, err = e.ledger.Begin(t.Context(), other)
	want(t, err, errcode.KeyReused)
	// A late retry whose first attempt is older than the retention but not
	// the tombstone window is KEY_EXPIRED, not RETRY_TOO_LATE.
	late := req
	late.FirstAttemptAt = e.clock.Now().Add(-2 * time.Hour)
	_, err = e.ledger.Begin(t.Context(), late)
	want(t, err, errcode.KeyExpired)
	_, err = e.ledger.Complete(t.Context(), e.scope("k"), c.Token, Response("inv"))
	want(t, err, errcode.LeaseLost)

	e.clock.Advance(week)
	if st := e.lookupState("k"); st != ledger.StateAbsent {
		t.Fatalf("past ForgetAt the key reads %s, want absent", st)
	}
	again := e.mustBegin(req)
	if again.Token <= c.Token || again.Attempt != 1 {
		t.Fatalf("claim after the tombstone = %+v, want a token above %d", again, c.Token)
	}
	// Both windows passed since the first attempt: RETRY_TOO_LATE.
	tooLate := ledger.BeginRequest{Scope: e.scope("late"), Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour,
		FirstAttemptAt: e.clock.Now().Add(-time.Hour - week - time.Second)}
	_, err = e.ledger.Begin(t.Context(), tooLate)
	want(t, err, errcode.RetryTooLate)
}

// ruleNoTombstones: a tombstone retention of 0 keeps none; a released key
// never leaves a visible tombstone.
func ruleNoTombstones(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	zero := time.Duration(0)
	req := ledger.BeginRequest{Scope: e.scope("k"), Fingerprint: Fingerprint("p"), Method: Method, Retention: time.Hour, TombstoneRetention: &zero}
	c := e.mustBegin(req)
	if _, err := e.ledger.Complete(t.Context(), e.scope("k"), c.Token, Response("inv")); err != nil {
		t.Fatal(err)
	}
	r := e.mustClaim("released", "p")
	if err := e.ledger.Release(t.Context(), e.scope("released"), r.Token); err != nil {
		t.Fatal(err)
	}
	if st := e.lookupState("released"); st != ledger.StateAbsent {
		t.Fatalf("a released key reads %s, want absent", st)
	}
	e.clock.Advance(time.Hour)
	if st := e.lookupState("k"); st != ledger.StateAbsent {
		t.Fatalf("past its retention without tombstones the key reads %s, want absent", st)
	}
	if again := e.mustBegin(req); again.Token <= c.Token {
		t.Fatalf("the next claim has token %d, want above %d", again.Token, c.Token)
	}
}

// ruleHold: under the HOLD policy an attempt whose lease ran out is
// OUTCOME_UNKNOWN, to every Begin and Lookup, until someone resolves it,
// also past its retention; its holder may still extend or complete it.
func ruleHold(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	c := e.mustBegin(e.hold("k"))
	e.clock.Advance(5 * time.Second)
	_, err := e.ledger.Begin(t.Context(), e.hold("k"))
	want(t, err, errcode.InProgress)
	e.clock.Advance(5 * time.Second)
	for range 2 {
		_, err = e.ledger.Begin(t.Context(), e.hold("k"))
		le := WantCode(t, err, errcode.OutcomeUnknown)
		if le.Retryable() || le.Metadata["attempt"] != "1" || le.Metadata["leaseExpiredAt"] == "" {
			t.Fatalf("OUTCOME_UNKNOWN %+v: want permanent, with the attempt and when its lease expired", le)
		}
	}
	other := e.hold("k")
	other.Fingerprint = Fingerprint("another payload")
	_, err = e.ledger.Begin(t.Context(), other)
	want(t, err, errcode.KeyReused)
	if st := e.lookupState("k"); st != ledger.StateUnknown {
		t.Fatalf("Lookup = %s, want OUTCOME_UNKNOWN", st)
	}
	// A TAKEOVER Begin does not change the stored policy.
	takeover := e.hold("k")
	takeover.OnLeaseExpiry = ledger.Takeover
	_, err = e.ledger.Begin(t.Context(), takeover)
	want(t, err, errcode.OutcomeUnknown)
	// Past the retention, still unknown: nothing runs again by itself.
	e.clock.Advance(2 * time.Hour)
	_, err = e.ledger.Begin(t.Context(), e.hold("k"))
	want(t, err, errcode.OutcomeUnknown)

	// The holder comes back: an Extend gives it a live lease again, and
	// its Complete settles the record.
	h := e.mustBegin(e.hold("back"))
	e.clock.Advance(11 * time.Second)
	if _, err := e.ledger.Extend(t.Context(), e.scope("back"), h.Token, 10*time.Second); err != nil {
		t.Fatalf("the holder's Extend of an unknown record: %v", err)
	}
	if st := e.lookupState("back"); st != ledger.StateInProgress {
		t.Fatalf("after the holder's Extend: %s, want IN_PROGRESS", st)
	}
	e.clock.Advance(11 * time.Second)
	if _, err := e.ledger.Complete(t.Context(), e.scope("back"), h.Token, Response("late")); err != nil {
		t.Fatalf("the holder's Complete of an unknown record: %v", err)
	}
	res, err := e.ledger.Begin(t.Context(), e.hold("back"))
	if err != nil || res.Replay == nil || diffOutcome(Response("late"), res.Replay.Outcome) != "" {
		t.Fatalf("Begin after the holder completed = %+v, %v; want its outcome replayed", res, err)
	}
	_ = c
}

// ruleResolve: an unknown record resolved as applied is completed with the
// given outcome and replayed; resolved as not applied it is free again
// (token above, attempt 1); an in-progress record of the TAKEOVER policy
// whose lease ran out can be resolved too.
func ruleResolve(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	applied := e.mustBegin(e.hold("applied"))
	notApplied := e.mustBegin(e.hold("not-applied"))
	takeover := e.mustClaim("takeover", "p")
	e.clock.Advance(ledger.DefaultLease)

	rec, err := e.ledger.Resolve(t.Context(), e.scope("applied"), Response("settled"))
	if err != nil || rec.State != ledger.StateCompleted || rec.Token != applied.Token {
		t.Fatalf("Resolve(applied) = %+v, %v; want COMPLETED with the holder's token", rec, err)
	}
	res, err := e.ledger.Begin(t.Context(), e.hold("applied"))
	if err != nil || res.Replay == nil || diffOutcome(Response("settled"), res.Replay.Outcome) != "" {
		t.Fatalf("Begin after Resolve(applied) = %+v, %v; want the resolved outcome replayed", res, err)
	}
	// The holder's own Complete, with the same outcome, still succeeds;
	// with another it is LEASE_LOST.
	if _, err := e.ledger.Complete(t.Context(), e.scope("applied"), applied.Token, Response("settled")); err != nil {
		t.Fatalf("the holder's Complete with the resolved outcome: %v", err)
	}
	_, err = e.ledger.Complete(t.Context(), e.scope("applied"), applied.Token, Response("other"))
	want(t, err, errcode.LeaseLost)

	if _, err := e.ledger.Resolve(t.Context(), e.scope("not-applied"), nil); err != nil {
		t.Fatalf("Resolve(not applied): %v", err)
	}
	if st := e.lookupState("not-applied"); st != ledger.StateAbsent {
		t.Fatalf("after Resolve(not applied): %s, want absent", st)
	}
	again := e.mustBegin(e.hold("not-applied"))
	if again.Token <= notApplied.Token || again.Attempt != 1 {
		t.Fatalf("claim after Resolve(not applied) = %+v, want a token above %d, attempt 1", again, notApplied.Token)
	}
	// The old holder is fenced.
	_, err = e.ledger.Complete(t.Context(), e.scope("not-applied"), notApplied.Token, Response("stale"))
	want(t, err, errcode.LeaseLost)

	if _, err := e.ledger.Resolve(t.Context(), e.scope("takeover"), ErrorStatus("declined")); err != nil {
		t.Fatalf("Resolve of an expired TAKEOVER lease: %v", err)
	}
	res, err = e.ledger.Begin(t.Context(), ledger.BeginRequest{Scope: e.scope("takeover"), Fingerprint: Fingerprint("p"), Method: Method})
	if err != nil || res.Replay == nil || res.Replay.Attempt != takeover.Attempt {
		t.Fatalf("Begin after resolving a takeover record = %+v, %v; want a replay", res, err)
	}
}

// ruleResolveRefusals: Resolve refuses a live lease (IN_PROGRESS, with a
// retry-after), a completed record or a tombstone (VALIDATION_FAILED), no
// record (NOT_FOUND), and another namespace's record (NOT_FOUND, as if
// absent), and changes nothing.
func ruleResolveRefusals(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
	live := e.mustBegin(e.hold("live"))
	done := e.mustClaim("done", "p")
	if _, err := e.ledger.Complete(t.Context(), e.scope("done"), done.Token, Response("x")); err != nil {
		t.Fatal(err)
	}
	_, err := e.ledger.Resolve(t.Context(), e.scope("live"), nil)
	if le := WantCode(t, err, errcode.InProgress); le.RetryAfter <= 0 {
		t.Fatalf("%+v: want a retry-after", le)
	}
	_, err = e.ledger.Resolve(t.Context(), e.scope("done"), Response("y"))
	want(t, err, errcode.ValidationFailed)
	_, err = e.ledger.Resolve(t.Context(), e.scope("nothing"), nil)
	want(t, err, errcode.NotFound)
	e.clock.Advance(11 * time.Second) // the HOLD lease ran out: unknown
	foreign := e.scope("live")
	foreign.Namespace += "-other"
	_, err = e.ledger.Resolve(t.Context(), foreign, nil)
	want(t, err, errcode.NotFound)
	if st := e.lookupState("live"); st != ledger.StateUnknown {
		t.Fatalf("after the refusals: %s, want OUTCOME_UNKNOWN", st)
	}
	e.clock.Advance(25 * time.Hour) // the completed record is a tombstone
	_, err = e.ledger.Resolve(t.Context(), e.scope("done"), nil)
	want(t, err, errcode.ValidationFailed)
	_ = live
}
