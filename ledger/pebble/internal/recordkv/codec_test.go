package recordkv

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

func TestRecordRoundTrip(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	scope := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k-1"}
	for name, rec := range map[string]ledger.Record{
		"in progress": {Scope: scope, State: ledger.StateInProgress, Method: ledgertest.Method, Fingerprint: ledgertest.Fingerprint("p"), Token: 7, Attempt: 2, CreatedAt: at, LeaseExpiresAt: at.Add(time.Minute), ExpiresAt: at.Add(time.Hour), KeySource: "host:claudecode/toolUseId"},
		"response":    {Scope: scope, State: ledger.StateCompleted, Token: 1, Attempt: 1, CreatedAt: at, LeaseExpiresAt: at, CompletedAt: at.Add(time.Second), ExpiresAt: at.Add(time.Hour), Outcome: ledgertest.Response("inv_1")},
		"status":      {Scope: scope, State: ledger.StateCompleted, Token: 1 << 60, Attempt: 1<<32 - 1, CompletedAt: at, ExpiresAt: at, Outcome: ledgertest.ErrorStatus("declined")},
		"released":    {Scope: scope, State: ledger.StateReleased, Token: 3, ExpiresAt: at},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := Encode(&rec)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(scope, b)
			if err != nil {
				t.Fatal(err)
			}
			for i := range b {
				b[i] = 0xee // Pebble reuses a value's memory once read: the record must not share it
			}
			if diff := cmp.Diff(rec, got, protocmp.Transform()); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
			key, err := DecodeScopeKey(ScopeKey(scope))
			if err != nil || key != scope {
				t.Errorf("scope key round trip = %v, %v", key, err)
			}
		})
	}
}

// FuzzDecodeRecord: any bytes decode to a record or to ErrCorrupt, never a
// panic, and what decodes encodes back to the same bytes.
func FuzzDecodeRecord(f *testing.F) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, rec := range []ledger.Record{
		{State: ledger.StateCompleted, Token: 1, Attempt: 1, CreatedAt: at, ExpiresAt: at, Outcome: ledgertest.Response("inv_1")},
		{State: ledger.StateInProgress, Method: ledgertest.Method, Fingerprint: ledgertest.Fingerprint("p"), Token: 2, Attempt: 2, ExpiresAt: at, KeySource: "meta"},
	} {
		b, err := Encode(&rec)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{Version})
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := Decode(ledger.Scope{}, b)
		if err != nil {
			return
		}
		again, err := Encode(&rec)
		if err != nil {
			t.Fatalf("a decoded record does not encode: %v", err)
		}
		back, err := Decode(ledger.Scope{}, again)
		if err != nil {
			t.Fatalf("a re-encoded record does not decode: %v", err)
		}
		if diff := cmp.Diff(rec, back, protocmp.Transform()); diff != "" {
			t.Fatalf("decode(encode(decode(b))) differs (-first +second):\n%s", diff)
		}
	})
}

// BenchmarkDecode: a completed record, as a replay reads it, by outcome size.
func BenchmarkDecode(b *testing.B) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	scope := ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "k-1"}
	for _, size := range []int{500, 256 << 10} {
		rec := ledger.Record{Scope: scope, State: ledger.StateCompleted, Method: ledgertest.Method, Fingerprint: ledgertest.Fingerprint("p"),
			Token: 1, Attempt: 1, CreatedAt: at, CompletedAt: at, ExpiresAt: at.Add(time.Hour), Outcome: ledgertest.Response(string(make([]byte, size)))}
		v, err := Encode(&rec)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("outcome=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(v)))
			for b.Loop() {
				if _, err := Decode(scope, v); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
