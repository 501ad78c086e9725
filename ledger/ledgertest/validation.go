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
		want ledger.Code
	}{
		{"EmptyKey", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "" }), ledger.CodeKeyMissing},
		{"KeyTooLong", begin(func(r *ledger.BeginRequest) { r.Scope.Key = strings.Repeat("k", 256) }), ledger.CodeKeyInvalid},
		{"KeyWithSpace", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "k k" }), ledger.CodeKeyInvalid},
		{"KeyWithControl", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "k\x00" }), ledger.CodeKeyInvalid},
		{"KeyNonASCII", begin(func(r *ledger.BeginRequest) { r.Scope.Key = "clé" }), ledger.CodeKeyInvalid},
		{"EmptyTenant", begin(func(r *ledger.BeginRequest) { r.Scope.Tenant = "" }), ledger.CodeValidationFailed},
		{"TenantTooLong", begin(func(r *ledger.BeginRequest) { r.Scope.Tenant = strings.Repeat("t", 256) }), ledger.CodeValidationFailed},
		{"EmptyNamespace", begin(func(r *ledger.BeginRequest) { r.Scope.Namespace = "" }), ledger.CodeValidationFailed},
		{"EmptyFingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "" }), ledger.CodeValidationFailed},
		{"UnversionedFingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = strings.Repeat("a", 64) }), ledger.CodeValidationFailed},
		{"ShortV1Fingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "v1:abcd" }), ledger.CodeValidationFailed},
		{"ShortJ1Fingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "j1:abcd" }), ledger.CodeValidationFailed},
		{"UppercaseProfile", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "J1:" + strings.Repeat("a", 64) }), ledger.CodeValidationFailed},
		{"UppercaseV1Fingerprint", begin(func(r *ledger.BeginRequest) { r.Fingerprint = strings.ToUpper(Fingerprint("p")) }), ledger.CodeValidationFailed},
		{"FingerprintTooLong", begin(func(r *ledger.BeginRequest) { r.Fingerprint = "v2:" + strings.Repeat("a", 200) }), ledger.CodeValidationFailed},
		{"EmptyMethod", begin(func(r *ledger.BeginRequest) { r.Method = "" }), ledger.CodeValidationFailed},
		{"MethodWithControl", begin(func(r *ledger.BeginRequest) { r.Method = "mcp:tools/create\n" }), ledger.CodeValidationFailed},
		{"MethodTooLong", begin(func(r *ledger.BeginRequest) { r.Method = "http:POST /" + strings.Repeat("x", 250) }), ledger.CodeValidationFailed},
		{"MethodPadded", begin(func(r *ledger.BeginRequest) { r.Method = " mcp:tools/x" }), ledger.CodeValidationFailed},
		{"NegativeTombstoneRetention", begin(func(r *ledger.BeginRequest) { d := -time.Second; r.TombstoneRetention = &d }), ledger.CodeValidationFailed},
		{"HugeTombstoneRetention", begin(func(r *ledger.BeginRequest) { d := 365 * 24 * time.Hour; r.TombstoneRetention = &d }), ledger.CodeValidationFailed},
		{"UnknownLeasePolicy", begin(func(r *ledger.BeginRequest) { r.OnLeaseExpiry = 7 }), ledger.CodeValidationFailed},
		{"ResolveBadOutcome", func() error { _, err := e.ledger.Resolve(t.Context(), s, &ledger.Outcome{}); return err }, ledger.CodeValidationFailed},
		{"NegativeLease", begin(func(r *ledger.BeginRequest) { r.Lease = -time.Second }), ledger.CodeValidationFailed},
		{"HugeLease", begin(func(r *ledger.BeginRequest) { r.Lease = 1 << 62 }), ledger.CodeValidationFailed},
		{"NegativeRetention", begin(func(r *ledger.BeginRequest) { r.Retention = -time.Second }), ledger.CodeValidationFailed},
		{"HugeRetention", begin(func(r *ledger.BeginRequest) { r.Retention = 8 * 24 * time.Hour }), ledger.CodeValidationFailed},
		{"RetentionShorterThanLease", begin(func(r *ledger.BeginRequest) { r.Lease, r.Retention = time.Minute, time.Second }), ledger.CodeValidationFailed},
		{"FirstAttemptAtOutOfRange", begin(func(r *ledger.BeginRequest) { r.FirstAttemptAt = time.Unix(1, 0) }), ledger.CodeValidationFailed},
		{"CompleteTokenZero", complete(0, Response("x")), ledger.CodeValidationFailed},
		{"CompleteNoOutcome", complete(c.Token, nil), ledger.CodeValidationFailed},
		{"CompleteEmptyOutcome", complete(c.Token, &ledger.Outcome{}), ledger.CodeValidationFailed},
		{"CompleteBothOutcomes", complete(c.Token, &ledger.Outcome{Response: Response("x").Response, Status: ErrorStatus("x").Status}), ledger.CodeValidationFailed},
		{"CompleteNoTypeURL", complete(c.Token, &ledger.Outcome{Response: &anypb.Any{Value: []byte("x")}}), ledger.CodeValidationFailed},
		{"CompleteStatusOK", complete(c.Token, &ledger.Outcome{Status: &spb.Status{Code: 0}}), ledger.CodeValidationFailed},
		{"CompleteStatusUnknownCode", complete(c.Token, &ledger.Outcome{Status: &spb.Status{Code: 99}}), ledger.CodeValidationFailed},
		{"CompleteTooLarge", complete(c.Token, Response(strings.Repeat("x", 2000))), ledger.CodeOutcomeTooLarge},
		{"ReleaseTokenZero", func() error { return e.ledger.Release(t.Context(), s, 0) }, ledger.CodeValidationFailed},
		{"ExtendNegativeLease", func() error { _, err := e.ledger.Extend(t.Context(), s, c.Token, -time.Second); return err }, ledger.CodeValidationFailed},
		{"ExtendHugeLease", func() error { _, err := e.ledger.Extend(t.Context(), s, c.Token, 2*time.Hour); return err }, ledger.CodeValidationFailed},
		{"LookupNegativeWait", func() error { _, err := e.ledger.Lookup(t.Context(), s, -time.Second); return err }, ledger.CodeValidationFailed},
		{"LookupHugeWait", func() error { _, err := e.ledger.Lookup(t.Context(), s, time.Hour); return err }, ledger.CodeValidationFailed},
		{"LookupBadKey", func() error {
			_, err := e.ledger.Lookup(t.Context(), ledger.Scope{Namespace: e.ns, Tenant: "t", Key: "a b"}, 0)
			return err
		}, ledger.CodeKeyInvalid},
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
