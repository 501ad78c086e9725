package pebble

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble/internal/recordkv"
)

func encode(t *testing.T, rec *ledger.Record) []byte {
	t.Helper()
	b, err := recordkv.Encode(rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHeldRecordsArePebbles: the records in progress that the stripes
// keep in memory are, after every call, exactly what Pebble holds, through
// random claims, takeovers, completions, releases, extensions,
// resolutions, purges and sweeps of a few keys; and a claim whose stripe
// saw no write since its lock-free read skips its second read only then.
func TestHeldRecordsArePebbles(t *testing.T) {
	clock := ledgertest.NewClock(ledgertest.Start)
	s, err := Open(t.TempDir(), Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	l := ledger.New(s, ledger.Config{})
	rng := rand.New(rand.NewPCG(1, 2))
	var scopes []ledger.Scope
	for _, k := range []string{"a", "b", "c", "d"} {
		scopes = append(scopes, ledger.Scope{Namespace: "ns", Tenant: "t", Key: k})
	}
	tokens := map[ledger.Scope]uint64{}
	outcome := &ledger.Outcome{Response: &anypb.Any{TypeUrl: "type.example/X", Value: []byte("x")}}
	held := 0
	for i := range 3000 {
		sc := scopes[rng.IntN(len(scopes))]
		ctx := t.Context()
		switch op := rng.IntN(9); op {
		case 0, 1:
			policy := ledger.Takeover
			if rng.IntN(2) == 0 {
				policy = ledger.Hold
			}
			res, err := l.Begin(ctx, ledger.BeginRequest{Scope: sc, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method,
				Lease: time.Second, Retention: 3 * time.Second, OnLeaseExpiry: policy, TombstoneRetention: new(2 * time.Second)})
			if err == nil && res.Claim != nil {
				tokens[sc] = res.Claim.Token
			}
		case 2:
			_, _ = l.Complete(ctx, sc, tokens[sc], outcome)
		case 3:
			_ = l.Release(ctx, sc, tokens[sc])
		case 4:
			_, _ = l.Extend(ctx, sc, tokens[sc], time.Second)
		case 5:
			_, _ = l.Resolve(ctx, sc, nil)
		case 6:
			_, _ = s.Purge(ctx, ledger.PurgeParams{Scope: sc})
		case 7:
			if _, err := s.Sweep(ctx, 100); err != nil {
				t.Fatal(err)
			}
		case 8:
			clock.Advance(time.Duration(rng.IntN(1500)) * time.Millisecond)
		}
		for _, sc := range scopes {
			key := recordKey(sc)
			st := s.stripe(key)
			st.Lock()
			rec, ok := st.held[string(key)]
			stored, err := getRecord(s.db, sc, key)
			st.Unlock()
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				held++
				if stored == nil || !bytes.Equal(encode(t, &rec), encode(t, stored)) {
					t.Fatalf("step %d: %s is held as %+v, and Pebble holds %+v", i, sc.Key, rec, stored)
				}
			} else if stored != nil && stored.State == ledger.StateInProgress && len(st.held) < maxHeld {
				t.Fatalf("step %d: %s is in progress in Pebble and not held", i, sc.Key)
			}
		}
	}
	if held == 0 {
		t.Fatal("no record was ever held")
	}
	t.Logf("%d checks found a held record", held)
}
