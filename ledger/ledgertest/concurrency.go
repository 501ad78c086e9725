package ledgertest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

func raceOneWinnerOf64(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
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
			case errcode.Of(err) == errcode.InProgress:
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
}

func raceStaleAndFreshCompleteRace(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
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
		_ = WantCode(t, errs[i][0], errcode.LeaseLost)
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
}

func raceManyKeysInParallel(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{})
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
				case errcode.Of(err) == errcode.InProgress:
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
}
