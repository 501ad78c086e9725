// Package ledgertest is the conformance suite that every ledger.Store
// passes: Run drives a Ledger over a fresh store through every rule of the
// contract, with a fake clock, and races many goroutines on the same keys.
package ledgertest

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// NewStore returns a store whose clock is now. Run calls it once per
// subtest; stores that share a database need not be emptied, because every
// subtest works in a namespace of its own.
type NewStore func(t *testing.T, now func() time.Time) ledger.Store

// Start is the fake clock's first reading.
var Start = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)

// env is one subtest's world: a Ledger over a fresh store, its clock, and a
// namespace no other subtest uses.
type env struct {
	t      *testing.T
	clock  *Clock
	ledger *ledger.Ledger
	ns     string
}

func newEnv(t *testing.T, newStore NewStore, cfg ledger.Config) *env {
	t.Helper()
	clock := NewClock(Start)
	return &env{
		t:      t,
		clock:  clock,
		ledger: ledger.New(newStore(t, clock.Now), cfg),
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
func WantCode(t testing.TB, err error, code ledger.Code) *ledger.Error {
	t.Helper()
	var le *ledger.Error
	if !errors.As(err, &le) || le.Code != code {
		t.Fatalf("error = %v, want code %s", err, code)
	}
	return le
}

// WantStatus fails t unless err is a typed status (ledgerstatus) with
// code: what a caller of the ledger or of a protected method must get. It
// returns the decoded error.
func WantStatus(t testing.TB, err error, code ledger.Code) *ledger.Error {
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

// Run runs the conformance suite against stores made by newStore.
func Run(t *testing.T, newStore NewStore) {
	t.Run("Rules", func(t *testing.T) { runRules(t, newStore) })
	t.Run("Validation", func(t *testing.T) { runValidation(t, newStore) })
	t.Run("Concurrency", func(t *testing.T) { runConcurrency(t, newStore) })
}

func runConcurrency(t *testing.T, newStore NewStore) {
	t.Run("OneWinnerOf64", func(t *testing.T) {
		e := newEnv(t, newStore, ledger.Config{})
		const n = 64
		var claims, inProgress, other atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				res, err := e.begin("hot", "same payload")
				switch {
				case err == nil && res.Claim != nil:
					claims.Add(1)
				case ledger.CodeOf(err) == ledger.CodeInProgress:
					inProgress.Add(1)
				default:
					other.Add(1)
					t.Errorf("Begin: %+v, %v", res, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if claims.Load() != 1 || inProgress.Load() != n-1 {
			t.Fatalf("claims = %d, in progress = %d, other = %d; want 1, %d, 0", claims.Load(), inProgress.Load(), other.Load(), n-1)
		}
	})

	t.Run("StaleAndFreshCompleteRace", func(t *testing.T) {
		e := newEnv(t, newStore, ledger.Config{})
		const keys = 20
		stale := make([]*ledger.Claim, keys)
		fresh := make([]*ledger.Claim, keys)
		for i := range keys {
			stale[i] = e.mustClaim(fmt.Sprint("k", i), "p")
		}
		e.clock.Advance(ledger.DefaultLease + time.Second)
		for i := range keys {
			fresh[i] = e.mustClaim(fmt.Sprint("k", i), "p")
			if fresh[i].Token <= stale[i].Token {
				t.Fatalf("takeover token %d is not above %d", fresh[i].Token, stale[i].Token)
			}
		}
		var wg sync.WaitGroup
		errs := make([][2]error, keys)
		for i := range keys {
			s := e.scope(fmt.Sprint("k", i))
			wg.Go(func() {
				_, errs[i][0] = e.ledger.Complete(t.Context(), s, stale[i].Token, Response("stale"))
			})
			wg.Go(func() {
				_, errs[i][1] = e.ledger.Complete(t.Context(), s, fresh[i].Token, Response("fresh"))
			})
		}
		wg.Wait()
		for i := range keys {
			WantCode(t, errs[i][0], ledger.CodeLeaseLost)
			if errs[i][1] != nil {
				t.Fatalf("key %d: fresh Complete: %v", i, errs[i][1])
			}
			res, err := e.begin(fmt.Sprint("k", i), "p")
			if err != nil || res.Replay == nil {
				t.Fatalf("key %d: Begin after race = %+v, %v; want a replay", i, res, err)
			}
			if d := diffOutcome(Response("fresh"), res.Replay.Outcome); d != "" {
				t.Fatalf("key %d: replayed outcome (-want +got):\n%s", i, d)
			}
		}
	})

	t.Run("ManyKeysInParallel", func(t *testing.T) {
		e := newEnv(t, newStore, ledger.Config{})
		const keys, callers = 100, 8
		var claims, replays, inProgress atomic.Int32
		var wg sync.WaitGroup
		for k := range keys {
			for range callers {
				wg.Go(func() {
					key := fmt.Sprint("key-", k)
					res, err := e.begin(key, "payload-"+key)
					switch {
					case err == nil && res.Claim != nil:
						claims.Add(1)
						if _, err := e.ledger.Complete(t.Context(), e.scope(key), res.Claim.Token, Response(key)); err != nil {
							t.Errorf("Complete(%s): %v", key, err)
						}
					case err == nil && res.Replay != nil:
						replays.Add(1)
						if d := diffOutcome(Response(key), res.Replay.Outcome); d != "" {
							t.Errorf("replay of %s (-want +got):\n%s", key, d)
						}
					case ledger.CodeOf(err) == ledger.CodeInProgress:
						inProgress.Add(1)
					default:
						t.Errorf("Begin(%s): %v", key, err)
					}
				})
			}
		}
		wg.Wait()
		if claims.Load() != keys {
			t.Fatalf("claims = %d, want %d (replays %d, in progress %d)", claims.Load(), keys, replays.Load(), inProgress.Load())
		}
		if total := claims.Load() + replays.Load() + inProgress.Load(); total != keys*callers {
			t.Fatalf("accounted calls = %d, want %d", total, keys*callers)
		}
		for k := range keys {
			key := fmt.Sprint("key-", k)
			rec, err := e.ledger.Lookup(t.Context(), e.scope(key), 0)
			if err != nil || rec.State != ledger.StateCompleted {
				t.Fatalf("Lookup(%s) = %v, %v; want COMPLETED", key, rec.State, err)
			}
		}
	})
}
