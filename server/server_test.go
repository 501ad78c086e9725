package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// tokens is the test's principal table: the bearer token is the key.
var tokens = map[string]server.Principal{
	"billing-token": {Namespace: "billing", Tenants: []string{"acme", "globex"}},
	"refunds-token": {Namespace: "refunds", Tenants: []string{"*"}},
	"ops-token":     {Admin: "ops"},
}

var testAuth = server.AuthenticatorFunc(func(ctx context.Context) (server.Principal, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if p, ok := tokens[strings.TrimPrefix(v, "Bearer ")]; ok {
			return p, nil
		}
	}
	return server.Principal{}, errcode.Errorf(errcode.Unauthenticated, "no valid credentials")
})

type fixture struct {
	client ledgerv1.LedgerServiceClient
	conn   *grpc.ClientConn
	clock  *ledgertest.Clock
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	clock := ledgertest.NewClock(ledgertest.Start)
	l := ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{})
	conn := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth}))).Dial(t)
	return &fixture{client: ledgerv1.NewLedgerServiceClient(conn), conn: conn, clock: clock}
}

func as(t *testing.T, token string) context.Context {
	return metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
}

func beginReq(key string) *ledgerv1.BeginRequest {
	return &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
}

func TestLifecycleOverTheWire(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := as(t, "billing-token")
	res, err := f.client.Begin(ctx, beginReq("k1"))
	if err != nil {
		t.Fatal(err)
	}
	claim := res.GetClaim()
	if claim.GetToken() == 0 || claim.GetAttempt() != 1 {
		t.Fatalf("claim = %v", claim)
	}
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte{0xff, 1, 2}}}}
	if _, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k1", Token: claim.GetToken(), Outcome: out}); err != nil {
		t.Fatal(err)
	}
	again, err := f.client.Begin(ctx, beginReq("k1"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(out, again.GetReplay().GetOutcome(), protocmp.Transform()); d != "" {
		t.Fatalf("replay (-want +got):\n%s", d)
	}
	look, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k1"})
	if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_COMPLETED || look.GetRecord().GetMethod() != ledgertest.Method {
		t.Fatalf("Lookup = %v, %v", look, err)
	}

	// A stored error status is replayed as such.
	res, _ = f.client.Begin(ctx, beginReq("k2"))
	stored := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: 9, Message: "card declined"}}}
	if _, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k2", Token: res.GetClaim().GetToken(), Outcome: stored}); err != nil {
		t.Fatal(err)
	}
	again, _ = f.client.Begin(ctx, beginReq("k2"))
	if d := cmp.Diff(stored, again.GetReplay().GetOutcome(), protocmp.Transform()); d != "" {
		t.Fatalf("replayed status (-want +got):\n%s", d)
	}

	// Extend, then Release, then the key is absent.
	res, _ = f.client.Begin(ctx, beginReq("k3"))
	f.clock.Advance(10 * time.Second)
	ext, err := f.client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "k3", Token: res.GetClaim().GetToken(), Lease: durationpb.New(time.Minute)})
	if err != nil || !ext.GetLeaseExpiresAt().AsTime().Equal(f.clock.Now().Add(time.Minute)) {
		t.Fatalf("Extend = %v, %v", ext, err)
	}
	if _, err := f.client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "k3", Token: res.GetClaim().GetToken()}); err != nil {
		t.Fatal(err)
	}
	_, err = f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k3"})
	ledgertest.WantStatus(t, err, errcode.NotFound)
	_, err = f.client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "k3", Token: res.GetClaim().GetToken()})
	ledgertest.WantStatus(t, err, errcode.LeaseLost)
}

func TestTypedErrorsOverTheWire(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := as(t, "billing-token")
	if _, err := f.client.Begin(ctx, beginReq("k")); err != nil {
		t.Fatal(err)
	}
	var trailer metadata.MD
	_, err := f.client.Begin(ctx, beginReq("k"), grpc.Trailer(&trailer))
	if le := ledgertest.WantStatus(t, err, errcode.InProgress); le.RetryAfter != ledger.DefaultMaxRetryAfter {
		t.Fatalf("retry after = %s", le.RetryAfter)
	}
	if got := trailer.Get(ledgerstatus.PushbackTrailer); len(got) != 1 || got[0] != "2000" {
		t.Fatalf("pushback = %v, want 2000", got)
	}
	req := beginReq("k")
	req.Fingerprint = ledgertest.Fingerprint("other")
	_, err = f.client.Begin(ctx, req, grpc.Trailer(&trailer))
	if le := ledgertest.WantStatus(t, err, errcode.KeyReused); le.Metadata["method"] != ledgertest.Method {
		t.Fatalf("metadata = %v", le.Metadata)
	}
	if got := trailer.Get(ledgerstatus.PushbackTrailer); len(got) != 1 || got[0] != "-1" {
		t.Fatalf("pushback = %v, want -1", got)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res, err := f.client.Begin(as(t, "billing-token"), beginReq("k"))
	if err != nil {
		t.Fatal(err)
	}
	token := res.GetClaim().GetToken()
	tests := []struct {
		name string
		ctx  context.Context
		call func(ctx context.Context) error
		want errcode.Code
	}{
		{"NoCredentials", t.Context(), func(ctx context.Context) error { _, err := f.client.Begin(ctx, beginReq("x")); return err }, errcode.Unauthenticated},
		{"WrongToken", as(t, "nope"), func(ctx context.Context) error {
			_, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
			return err
		}, errcode.Unauthenticated},
		{"OtherTenant", as(t, "billing-token"), func(ctx context.Context) error {
			r := beginReq("x")
			r.Tenant = "initech"
			_, err := f.client.Begin(ctx, r)
			return err
		}, errcode.PermissionDenied},
		{"OtherNamespaceCannotSee", as(t, "refunds-token"), func(ctx context.Context) error {
			_, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
			return err
		}, errcode.NotFound},
		{"OtherNamespaceCannotComplete", as(t, "refunds-token"), func(ctx context.Context) error {
			_, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: token, Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x"}}}})
			return err
		}, errcode.LeaseLost},
		{"OtherNamespaceCannotRelease", as(t, "refunds-token"), func(ctx context.Context) error {
			_, err := f.client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "k", Token: token})
			return err
		}, errcode.LeaseLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { ledgertest.WantStatus(t, tt.call(tt.ctx), tt.want) })
	}
	look, err := f.client.Lookup(as(t, "billing-token"), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
	if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_IN_PROGRESS {
		t.Fatalf("the record after foreign calls = %v, %v; want it untouched", look, err)
	}
}

func TestRequestValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := as(t, "billing-token")
	edit := func(fn func(*ledgerv1.BeginRequest)) *ledgerv1.BeginRequest { r := beginReq("k"); fn(r); return r }
	tests := []struct {
		name string
		req  *ledgerv1.BeginRequest
		want errcode.Code
	}{
		{"MissingTenant", edit(func(r *ledgerv1.BeginRequest) { r.Tenant = "" }), errcode.ValidationFailed},
		{"MissingKey", edit(func(r *ledgerv1.BeginRequest) { r.Key = "" }), errcode.KeyMissing},
		{"KeyWithNewline", edit(func(r *ledgerv1.BeginRequest) { r.Key = "a\nb" }), errcode.KeyInvalid},
		{"ZeroLease", edit(func(r *ledgerv1.BeginRequest) { r.Lease = durationpb.New(0) }), errcode.ValidationFailed},
		{"NegativeRetention", edit(func(r *ledgerv1.BeginRequest) { r.Retention = durationpb.New(-time.Hour) }), errcode.ValidationFailed},
		{"InvalidDuration", edit(func(r *ledgerv1.BeginRequest) { r.Lease = &durationpb.Duration{Seconds: 1, Nanos: -5} }), errcode.ValidationFailed},
		{"InvalidTimestamp", edit(func(r *ledgerv1.BeginRequest) { r.FirstAttemptAt = &timestamppb.Timestamp{Seconds: 1 << 62} }), errcode.ValidationFailed},
		{"NoFingerprint", edit(func(r *ledgerv1.BeginRequest) { r.Fingerprint = "" }), errcode.ValidationFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.client.Begin(ctx, tt.req)
			ledgertest.WantStatus(t, err, tt.want)
		})
	}
	_, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
	ledgertest.WantStatus(t, err, errcode.NotFound)
	_, err = f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: 1})
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)
}
