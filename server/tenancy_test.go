package server_test

import (
	"testing"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// TestNamespacesAreIsolated: refunds (every tenant) works on the very
// (tenant, key) that billing holds and completed. It can neither read,
// complete, release nor extend billing's records, its answers are the same
// as for a key nobody used (so it cannot learn that they exist), and its own
// Begin on the same key is a record of its own.
func TestNamespacesAreIsolated(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	billing, refunds := as(t, "billing-token"), as(t, "refunds-token")
	held, err := f.client.Begin(billing, beginReq("held"))
	if err != nil {
		t.Fatal(err)
	}
	done, _ := f.client.Begin(billing, beginReq("done"))
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/billing.Invoice", Value: []byte("secret")}}}
	if _, err := f.client.Complete(billing, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "done", Token: done.GetClaim().GetToken(), Outcome: out}); err != nil {
		t.Fatal(err)
	}
	token := held.GetClaim().GetToken()
	answers := func(key string) []string {
		var got []string
		record := func(err error) {
			le := ledgerstatus.FromError(err)
			got = append(got, le.Code.String()+": "+le.Message)
		}
		_, err := f.client.Lookup(refunds, &ledgerv1.LookupRequest{Tenant: "acme", Key: key})
		record(err)
		_, err = f.client.Lookup(refunds, &ledgerv1.LookupRequest{Tenant: "acme", Key: key, Wait: durationpb.New(1)})
		record(err)
		_, err = f.client.Complete(refunds, &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: token, Outcome: out})
		record(err)
		_, err = f.client.Release(refunds, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: key, Token: token})
		record(err)
		_, err = f.client.Extend(refunds, &ledgerv1.ExtendRequest{Tenant: "acme", Key: key, Token: token})
		record(err)
		return got
	}
	absent := answers("never-used")
	for _, key := range []string{"held", "done"} {
		got := answers(key)
		for i := range got {
			if got[i] != absent[i] {
				t.Errorf("refunds on billing's %s: %q; on an unused key: %q", key, got[i], absent[i])
			}
		}
	}
	// refunds' own Begin on the same tenant and key is a fresh claim.
	own, err := f.client.Begin(refunds, beginReq("done"))
	if err != nil || own.GetClaim() == nil || own.GetClaim().GetAttempt() != 1 {
		t.Fatalf("refunds' Begin on the same key = %v, %v; want a fresh claim of its own", own, err)
	}
	// billing's records are as they were.
	look, err := f.client.Lookup(billing, &ledgerv1.LookupRequest{Tenant: "acme", Key: "done"})
	if err != nil || look.GetRecord().GetOutcome().GetResponse().GetTypeUrl() != "t/billing.Invoice" {
		t.Fatalf("billing's completed record: %v, %v", look, err)
	}
	look, err = f.client.Lookup(billing, &ledgerv1.LookupRequest{Tenant: "acme", Key: "held"})
	if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_IN_PROGRESS || look.GetRecord().GetAttempt() != 1 {
		t.Fatalf("billing's held record: %v, %v", look, err)
	}
	_, err = f.client.Complete(billing, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: token, Outcome: out})
	if err != nil {
		t.Fatalf("billing completes its own claim after refunds' attempts: %v", err)
	}
}
