package ledgertest

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
)

func ruleValidation(t *testing.T, suite Suite) {
	e := newEnv(t, suite, ledger.Config{MaxOutcomeBytes: 1024})
	s := e.scope("k")
	c := e.mustClaim("k", "p")
	before, err := e.ledger.Lookup(t.Context(), s, 0)
	if err != nil {
		t.Fatal(err)
	}
	good := ledger.BeginRequest{Scope: s, Fingerprint: Fingerprint("p"), Method: Method}
	begin := func(edit func(*ledger.BeginRequest)) func() error {
		return func() error {
			req := good
			edit(&req)
			_, err := e.ledger.Begin(t.Context(), req)
			return err
		}
	}
	complete := func(token uint64, o *ledger.Outcome) func() error {
		return func() error {
			_, err := e.ledger.Complete(t.Context(), s, token, o)
			return err
		}
	}
	tests := []struct {
		name string
		call func() error
		want errcode.Code
	}{
		{"EmptyKey", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "" }), errcode.KeyMissing},
		{"KeyTooLong", begin(func(r *ledger.BeginRequest) { r.Scope.Key = strings.Repeat("k", 256) }), errcode.KeyInvalid},
		{"KeyWithSpace", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "k k" }), errcode.KeyInvalid},
		{"KeyWithControl", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "k\x00" }), errcode.KeyInvalid},
		{"KeyNonASCII", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "clé" }), errcode.KeyInvalid},
		{"EmptyTenant", begin(func(r *ledger.BeginRequest) { r.Scope.Tenant = "" }), errcode.ValidationFailed},
		{"TenantTooLong", begin(func(r *ledger.BeginRequest) { r.Scope.Tenant = strings.Repeat("t", 256) }), errcode.ValidationFailed},
		{"EmptyNamespace", begin(func(r *ledger.BeginRequest) { r.Scope.Namespace = "" }), errcode.ValidationFailed},
		{"EmptyFingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "" }), errcode.ValidationFailed},
		{"UnversionedFingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = strings.Repeat("a", 64) }), errcode.ValidationFailed},
		{"ShortV1Fingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "v1:abcd" }), errcode.ValidationFailed},
		{"ShortJ1Fingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "j1:abcd" }), errcode.ValidationFailed},
		{"UppercaseProfile", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "J1:" + strings.Repeat("a", 64) }), errcode.ValidationFailed},
		{"UppercaseV1Fingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = strings.ToUpper(Fingerprint("p")) }), errcode.ValidationFailed},
		{"FingerprintTooLong", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "v2:" + strings.Repeat("a", 200) }), errcode.ValidationFailed},
		{"EmptyMethod", begin(func(r *ledger.BeginRequest) { r.Method = "" }), errcode.ValidationFailed},
		{"MethodWithControl", begin(func(r *ledger.BeginRequest) { r.Method = "mcp:tools/create\n" }), errcode.ValidationFailed},
		{"MethodTooLong", begin(func(r *ledger.BeginRequest) { r.Method = "http:POST /" + strings.Repeat("x", 250) }), errcode.ValidationFailed},
		{"MethodPadded", begin(func(r *ledger.BeginRequest) { r.Method = " mcp:tools/x" }), errcode.ValidationFailed},
		{"NegativeTombstoneRetention", begin(func(r *ledger.BeginRequest) { d := -time.Second; r.TombstoneRetention = &d }), errcode.ValidationFailed},
		{"HugeTombstoneRetention", begin(func(r *ledger.BeginRequest) { d := 365 * 24 * time.Hour; r.TombstoneRetention = &d }), errcode.ValidationFailed},
		{"UnknownLeasePolicy", begin(func(r *ledger.BeginRequest) { r.OnLeaseExpiry = 7 }), errcode.ValidationFailed},
		{"ResolveBadOutcome", func() error { _, err := e.ledger.Resolve(t.Context(), s, &ledger.Outcome{}); return err }, errcode.ValidationFailed},
		{"NegativeLease", begin(func(r *ledger.BeginRequest) { r.Lease = -time.Second }), errcode.ValidationFailed},
		{"HugeLease", begin(func(r *ledger.BeginRequest) { r.Lease = 1 << 62 }), errcode.ValidationFailed},
		{"NegativeRetention", begin(func(r *ledger.BeginRequest) { r.Retention = -time.Second }), errcode.ValidationFailed},
		{"HugeRetention", begin(func(r *ledger.BeginRequest) { r.Retention = 8 * 24 * time.Hour }), errcode.ValidationFailed},
		{"RetentionShorterThanLease", begin(func(r *ledger.BeginRequest) { r.Lease, r.Retention = time.Minute, time.Second }), errcode.ValidationFailed},
		{"FirstAttemptAtOutOfRange", begin(func(r *ledger.BeginRequest) { r.FirstAttemptAt = time.Unix(1, 0) }), errcode.ValidationFailed},
		{"CompleteTokenZero", complete(0, Response("x")), errcode.ValidationFailed},
		{"CompleteNoOutcome", complete(c.Token, nil), errcode.ValidationFailed},
		{"CompleteEmptyOutcome", complete(c.Token, &ledger.Outcome{}), errcode.ValidationFailed},
		{"CompleteBothOutcomes", complete(c.Token, &ledger.Outcome{Response: Response("x").Response, Status: ErrorStatus("x").Status}), errcode.ValidationFailed},
		{"CompleteNoTypeURL", complete(c.Token, &ledger.Outcome{Response: &anypb.Any{Value: []byte("x")}}), errcode.ValidationFailed},
		{"CompleteStatusOK", complete(c.Token, &ledger.Outcome{Status: &spb.Status{Code: 0}}), errcode.ValidationFailed},
		{"CompleteStatusUnknownCode", complete(c.Token, &ledger.Outcome{Status: &spb.Status{Code: 99}}), errcode.ValidationFailed},
		{"CompleteTooLarge", complete(c.Token, Response(strings.Repeat("x", 2000))), errcode.OutcomeTooLarge},
		{"ReleaseTokenZero", func() error { return e.ledger.Release(t.Context(), s, 0) }, errcode.ValidationFailed},
		{"ExtendNegativeLease", func() error { _, err := e.ledger.Extend(t.Context(), s, c.Token, -time.Second); return err }, errcode.ValidationFailed},
		{"ExtendHugeLease", func() error { _, err := e.ledger.Extend(t.Context(), s, c.Token, 2*time.Hour); return err }, errcode.ValidationFailed},
		{"LookupNegativeWait", func() error { _, err := e.ledger.Lookup(t.Context(), s, -time.Second); return err }, errcode.ValidationFailed},
		{"LookupHugeWait", func() error { _, err := e.ledger.Lookup(t.Context(), s, time.Hour); return err }, errcode.ValidationFailed},
		{"LookupBadKey", func() error {
			_, err := e.ledger.Lookup(t.Context(), ledger.Scope{Namespace: e.ns, Tenant: "t", Key: "a b"}, 0)
			return err
		}, errcode.KeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want(t, tt.call(), tt.want)
			after, err := e.ledger.Lookup(t.Context(), s, 0)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(before, after, protocmp.Transform()); d != "" {
				t.Fatalf("the record changed (-before +after):\n%s", d)
			}
		})
	}
}
