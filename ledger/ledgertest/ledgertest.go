// Package ledgertest is the conformance suite that every ledger.Store
// passes: Run drives a Ledger over a fresh store through every rule of the
// contract, with a fake clock, and races many goroutines on the same keys.
package ledgertest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Suite is the conformance suite of a ledger.Store: one value says how to
// make the store under test and what else it offers, and Run drives a
// Ledger over fresh stores through every rule of the contract, with a fake
// clock, and races many goroutines on the same keys.
//
//	ledgertest.Suite{NewStore: func(t *testing.T, now func() time.Time) ledger.Store {
//		return memory.New(memory.Config{Now: now})
//	}}.Run(t)
type Suite struct {
	// NewStore returns a store whose clock is now; required. Run calls it
	// once per rule. Stores that share a database need not be emptied:
	// every rule works in a namespace of its own. A store that sweeps
	// (Sweeper) must, when its Run method runs, sweep every few
	// milliseconds in batches of a few records.
	NewStore func(t *testing.T, now func() time.Time) ledger.Store
	// Count, when set, returns how many records the store holds in
	// namespace, expired or not, without sweeping. The sweep rules run when
	// it is set and the store is a Sweeper.
	Count func(t *testing.T, s ledger.Store, namespace string) int

	// start is the fake clock's first reading for a sweep rule: Start, and
	// for each sweep rule after the first, sweepEra later than the one
	// before.
	start time.Time
}

// rule is one named rule of the suite.
type rule struct {
	name string
	run  func(t *testing.T, suite Suite)
}

// rules are the contract's rules, each on a fresh store.
var rules = []rule{
	{"ClaimAbsent", ruleClaimAbsent},
	{"KeySource", ruleKeySource},
	{"ReplayIsByteForByte", ruleReplayIsByteForByte},
	{"KeyReused", ruleKeyReused},
	{"InProgressRetryAfter", ruleInProgressRetryAfter},
	{"TakeoverFencesTheOldToken", ruleTakeoverFencesTheOldToken},
	{"CompleteAfterLeaseRanOutWithoutTakeover", ruleCompleteAfterLeaseRanOutWithoutTakeover},
	{"CompleteRepeated", ruleCompleteRepeated},
	{"AbsentKeyIsLeaseLost", ruleAbsentKeyIsLeaseLost},
	{"ClaimNamesItsRecord", ruleClaimNamesItsRecord},
	{"Release", ruleRelease},
	{"Extend", ruleExtend},
	{"RetentionExpiry", ruleRetentionExpiry},
	{"RetryTooLate", ruleRetryTooLate},
	{"Lookup", ruleLookup},
	{"LookupWait", ruleLookupWait},
	{"ScopesAreIsolated", ruleScopesAreIsolated},
	{"CanceledCall", ruleCanceledCall},
	// Tombstones, HOLD and the outcome nobody knows.
	{"Tombstone", ruleTombstone},
	{"NoTombstones", ruleNoTombstones},
	{"Hold", ruleHold},
	{"Resolve", ruleResolve},
	{"ResolveRefusals", ruleResolveRefusals},
	// The admin surface.
	{"List", ruleList},
	{"ListScan", ruleListScan},
	{"Purge", rulePurge},
}

// races race many goroutines on the same keys and assert exactly one
// winner.
var races = []rule{
	{"OneWinnerOf64", raceOneWinnerOf64},
	{"StaleAndFreshCompleteRace", raceStaleAndFreshCompleteRace},
	{"ManyKeysInParallel", raceManyKeysInParallel},
}

// sweeps check a Sweeper's Sweep and Run.
var sweeps = []rule{
	{"Sweep", ruleSweep},
	{"SweepLoop", ruleSweepLoop},
	{"SweepTombstones", ruleSweepTombstones},
	{"SweepAbandoned", ruleSweepAbandoned},
}

// Run runs every rule of the suite, each as a subtest: Rules/<name>,
// Validation, Concurrency/<name> and, for a store that sweeps,
// Sweeps/<name>.
func (s Suite) Run(t *testing.T) {
	if s.NewStore == nil {
		t.Fatal("ledgertest: Suite.NewStore is required")
	}
	group := func(name string, rs []rule) {
		t.Run(name, func(t *testing.T) {
			for _, r := range rs {
				t.Run(r.name, func(t *testing.T) { r.run(t, s) })
			}
		})
	}
	group("Rules", rules)
	t.Run("Validation", func(t *testing.T) { ruleValidation(t, s) })
	group("Concurrency", races)
	if s.Count != nil {
		t.Run("Sweeps", func(t *testing.T) {
			for i, r := range sweeps {
				era := s
				era.start = Start.Add(time.Duration(i) * sweepEra)
				t.Run(r.name, func(t *testing.T) { r.run(t, era) })
			}
		})
	}
}

// sweepEra is how far apart the sweep rules' clocks start. A sweep deletes
// whatever is past its end in the whole store, not only in its rule's
// namespace, and a sweep can outlive its rule in a database: Run returns
// when its context ends, and the driver gives up on the statement in
// flight, but the database may still run it after the next rule has
// begun. Each rule's clock starts a day after the one before's (which
// moves at most a few hours), so such a late sweep, at an earlier time,
// finds none of a later rule's records past their end.
const sweepEra = 24 * time.Hour

// Start is the fake clock's first reading.
var Start = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)

// env is one subtest's world: a Ledger over a fresh store, its clock, and a
// namespace no other subtest uses.
type env struct {
	t      *testing.T
	clock  *Clock
	ledger *ledger.Ledger
	store  ledger.Store
	ns     string
}

func newEnv(t *testing.T, suite Suite, cfg ledger.Config) *env {
	t.Helper()
	clock := NewClock(Start)
	store := suite.NewStore(t, clock.Now)
	return &env{
		t:      t,
		clock:  clock,
		ledger: ledger.New(store, cfg),
		store:  store,
		ns:     "ns-" + randomHex(8),
	}
}

func (e *env) scope(key string) ledger.Scope {
	return ledger.Scope{Namespace: e.ns, Tenant: "tenant-1", Key: key}
}

func (e *env) begin(key, payload string) (ledger.BeginResponse, error) {
	e.t.Helper()
	return e.ledger.Begin(e.t.Context(), ledger.BeginRequest{
		Scope:       e.scope(key),
		Fingerprint: Fingerprint(payload),
		Method:      Method,
	})
}

func (e *env) mustClaim(key, payload string) *ledger.Claim {
	e.t.Helper()
	res, err := e.begin(key, payload)
	if err != nil {
		e.t.Fatalf("Begin(%q): %v", key, err)
	}
	if res.Claim == nil {
		e.t.Fatalf("Begin(%q) = replay, want a claim", key)
	}
	return res.Claim
}

// Method is the method name the suite claims keys for.
const Method = "/billing.v1.InvoiceService/CreateInvoice"

// Fingerprint returns a v1 fingerprint of payload.
func Fingerprint(payload string) string {
	sum := sha256.Sum256([]byte(payload))
	return "v1:" + hex.EncodeToString(sum[:])
}

// Response returns a response outcome whose bytes are not even valid
// protobuf, to show that stores keep them byte for byte.
func Response(id string) *ledger.Outcome {
	return &ledger.Outcome{Response: &anypb.Any{
		TypeUrl: "type.googleapis.com/billing.v1.Invoice",
		Value:   append([]byte{0xff, 0x00, 0x80}, id...),
	}}
}

// ErrorStatus returns an error-status outcome with a detail.
func ErrorStatus(msg string) *ledger.Outcome {
	return &ledger.Outcome{Status: &spb.Status{
		Code:    9, // FAILED_PRECONDITION
		Message: msg,
		Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/google.rpc.ErrorInfo", Value: []byte{0x0a, 0x01, 'x'}}},
	}}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// WantCode fails the test unless err carries code.
func WantCode(t testing.TB, err error, code errcode.Code) *errcode.Error {
	t.Helper()
	var le *errcode.Error
	if !errors.As(err, &le) || le.Code != code {
		t.Fatalf("error = %v, want code %s", err, code)
	}
	return le
}

// want fails t unless err carries code.
func want(t testing.TB, err error, code errcode.Code) {
	t.Helper()
	_ = WantCode(t, err, code)
}

// WantStatus fails t unless err is a typed status (ledgerstatus) with
// code: what a caller of the ledger or of a protected method must get. It
// returns the decoded error.
func WantStatus(t testing.TB, err error, code errcode.Code) *errcode.Error {
	t.Helper()
	le := ledgerstatus.FromError(err)
	if le == nil || le.Code != code || !ledgerstatus.IsTyped(err) {
		t.Fatalf("error = %v, want a typed %s", err, code)
	}
	return le
}

func diffOutcome(want, got *ledger.Outcome) string {
	return cmp.Diff(want, got, protocmp.Transform())
}
