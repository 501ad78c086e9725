package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
)

func Example() {
	ctx := context.Background()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	req := ledger.BeginRequest{
		Scope:       ledger.Scope{Namespace: "billing", Tenant: "acme", Key: "4f1c2a9e-1d7b-4b55-9c1e-2f9b3c0d6a11"},
		Fingerprint: ledgertest.Fingerprint(`{"amount":4200}`),
		Method:      "/billing.v1.InvoiceService/CreateInvoice",
	}
	first, _ := l.Begin(ctx, req)
	fmt.Println("first attempt claims token", first.Claim.Token)
	_, _ = l.Complete(ctx, req.Scope, first.Claim.Token, ledgertest.Response("inv_42"))

	retry, _ := l.Begin(ctx, req)
	fmt.Printf("the retry replays %q\n", retry.Replay.Outcome.Response.Value[3:])

	req.Fingerprint = ledgertest.Fingerprint(`{"amount":9900}`)
	_, err := l.Begin(ctx, req)
	fmt.Println(errcode.Of(err), errcode.Of(err).Retryable())
	// Output:
	// first attempt claims token 1
	// the retry replays "inv_42"
	// KEY_REUSED false
}

func TestCodeOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		err  error
		want errcode.Code
	}{
		{"Nil", nil, errcode.Unspecified},
		{"Typed", errcode.Errorf(errcode.KeyReused, "x"), errcode.KeyReused},
		{"Wrapped", fmt.Errorf("crdb: claim: %w", errcode.Errorf(errcode.Contention, "x")), errcode.Contention},
		{"Deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), errcode.UpstreamTimeout},
		{"Canceled", context.Canceled, errcode.UpstreamTimeout},
		{"Foreign", errors.New("boom"), errcode.Internal},
		{"UnknownCode", &errcode.Error{Code: 99}, errcode.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errcode.Of(tt.err); got != tt.want {
				t.Fatalf("CodeOf = %s, want %s", got, tt.want)
			}
		})
	}
	if !errors.Is(fmt.Errorf("w: %w", errcode.Errorf(errcode.LeaseLost, "x")), &errcode.Error{Code: errcode.LeaseLost}) {
		t.Fatal("errors.Is does not match on the code")
	}
	if errcode.Code(99).String() != "Code(99)" || errcode.Code(99).Retryable() {
		t.Fatal("unknown codes must print as such and not be retryable")
	}
}

func TestOutcomeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, o := range []*ledger.Outcome{ledgertest.Response("inv_1"), ledgertest.ErrorStatus("declined")} {
		b, err := o.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var got ledger.Outcome
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatal(err)
		}
		if !got.Equal(o) {
			t.Fatalf("round trip changed the outcome: %v", &got)
		}
		if o.BinarySize() != len(b) {
			t.Fatalf("BinarySize = %d, MarshalBinary wrote %d bytes", o.BinarySize(), len(b))
		}
		appended, err := o.AppendBinary([]byte("prefix"))
		if err != nil || string(appended) != "prefix"+string(b) {
			t.Fatalf("AppendBinary = %q, %v; want the prefix, then MarshalBinary's bytes", appended, err)
		}
	}
	if _, err := (&ledger.Outcome{}).AppendBinary(nil); errcode.Of(err) != errcode.ValidationFailed {
		t.Fatalf("AppendBinary of an empty outcome: %v, want VALIDATION_FAILED", err)
	}
	var o ledger.Outcome
	for _, b := range [][]byte{nil, {'X'}, {'R', 0xff}} {
		if o.UnmarshalBinary(b) == nil {
			t.Fatalf("UnmarshalBinary(%x) accepted garbage", b)
		}
	}
}

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"", "a", "4f1c2a9e-1d7b", "a b", "\x7f", strings.Repeat("k", 255), strings.Repeat("k", 256), "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := ledger.ValidateKey(key, ledger.MaxKeyBytes)
		valid := len(key) >= 1 && len(key) <= 255 && strings.IndexFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }) < 0
		if valid != (err == nil) {
			t.Fatalf("ValidateKey(%q) = %v, valid = %v", key, err, valid)
		}
		if err != nil && errcode.Of(err) != errcode.KeyMissing && errcode.Of(err) != errcode.KeyInvalid {
			t.Fatalf("ValidateKey(%q) code %s", key, errcode.Of(err))
		}
	})
}

func FuzzValidateFingerprint(f *testing.F) {
	f.Add(ledgertest.Fingerprint("x"))
	f.Add("v2:abc")
	f.Add("v1:")
	f.Add("x1:abc")
	f.Add("X1:abc")
	f.Add("j1:abc")
	f.Fuzz(func(t *testing.T, fp string) {
		if err := ledger.ValidateFingerprint(fp); err != nil {
			if errcode.Of(err) != errcode.ValidationFailed {
				t.Fatalf("code %s", errcode.Of(err))
			}
			return
		}
		profile, digest, _ := strings.Cut(fp, ":")
		if len(profile) < 2 || profile[0] < 'a' || profile[0] > 'z' || digest == "" || len(fp) > ledger.MaxFingerprintBytes {
			t.Fatalf("accepted %q", fp)
		}
		if (profile == "v1" || profile == "j1" || profile == "b1") && len(digest) != 64 {
			t.Fatalf("accepted %q: a SHA-256 profile with %d digits", fp, len(digest))
		}
	})
}
