package server_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestErrorsOfEveryRPC drives each RPC into each error it can answer,
// over the wire, and checks the typed code.
func TestErrorsOfEveryRPC(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := as(t, "billing-token")
	claim, err := f.client.Begin(ctx, beginReq("held"))
	if err != nil {
		t.Fatal(err)
	}
	token := claim.GetClaim().GetToken()
	small := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}}}
	huge := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte(strings.Repeat("x", ledger.DefaultMaxOutcomeBytes))}}}
	tooLate := beginReq("late")
	tooLate.FirstAttemptAt = timestamppb.New(f.clock.Now().Add(-9 * 24 * time.Hour))
	tests := []struct {
		name string
		call func() error
		want errcode.Code
	}{
		{"Begin/RetryTooLate", func() error { _, err := f.client.Begin(ctx, tooLate); return err }, errcode.RetryTooLate},
		{"Begin/RetentionAboveMax", func() error {
			r := beginReq("r")
			r.Retention = durationpb.New(30 * 24 * time.Hour)
			_, err := f.client.Begin(ctx, r)
			return err
		}, errcode.ValidationFailed},
		{"Begin/BadMethod", func() error {
			r := beginReq("m")
			r.Method = "Create\nInvoice"
			_, err := f.client.Begin(ctx, r)
			return err
		}, errcode.ValidationFailed},
		{"Complete/OutcomeTooLarge", func() error {
			_, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: token, Outcome: huge})
			return err
		}, errcode.OutcomeTooLarge},
		{"Complete/NoOutcome", func() error {
			_, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: token})
			return err
		}, errcode.ValidationFailed},
		{"Complete/StaleToken", func() error {
			_, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: token + 1, Outcome: small})
			return err
		}, errcode.LeaseLost},
		{"Complete/KeyInvalid", func() error {
			_, err := f.client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "bad\x00key", Token: token, Outcome: small})
			return err
		}, errcode.KeyInvalid},
		{"Release/KeyMissing", func() error {
			_, err := f.client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Token: token})
			return err
		}, errcode.KeyMissing},
		{"Release/StaleToken", func() error {
			_, err := f.client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "held", Token: token + 7})
			return err
		}, errcode.LeaseLost},
		{"Extend/ZeroLease", func() error {
			_, err := f.client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "held", Token: token, Lease: durationpb.New(0)})
			return err
		}, errcode.ValidationFailed},
		{"Extend/LeaseAboveMax", func() error {
			_, err := f.client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "held", Token: token, Lease: durationpb.New(2 * time.Hour)})
			return err
		}, errcode.ValidationFailed},
		{"Extend/Absent", func() error {
			_, err := f.client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "nobody", Token: 1})
			return err
		}, errcode.LeaseLost},
		{"Lookup/WaitAboveMax", func() error {
			_, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "held", Wait: durationpb.New(time.Hour)})
			return err
		}, errcode.ValidationFailed},
		{"Lookup/TenantInvalid", func() error {
			_, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "ac me", Key: "held"})
			return err
		}, errcode.PermissionDenied},
		{"Lookup/TenantInvalidForWildcard", func() error {
			_, err := f.client.Lookup(as(t, "refunds-token"), &ledgerv1.LookupRequest{Tenant: "ac me", Key: "held"})
			return err
		}, errcode.ValidationFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { ledgertest.WantStatus(t, tt.call(), tt.want) })
	}
	// None of it touched the held record.
	look, err := f.client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "held"})
	if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_IN_PROGRESS || look.GetRecord().GetAttempt() != 1 {
		t.Fatalf("the held record after the bad calls = %v, %v", look, err)
	}
}

// TestStoreUnavailable: a store that cannot answer gives UNAVAILABLE,
// retryable, on every RPC, and its cause stays out of the message.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	conn := servertest.NewServer(t, servertest.Ledger(server.New(ledger.New(downStore{}, ledger.Config{}), server.Config{Auth: testAuth}))).Dial(t)
	client := ledgerv1.NewLedgerServiceClient(conn)
	ctx := as(t, "billing-token")
	small := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y"}}}
	for name, call := range map[string]func() error{
		"Begin": func() error { _, err := client.Begin(ctx, beginReq("k")); return err },
		"Complete": func() error {
			_, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: 1, Outcome: small})
			return err
		},
		"Release": func() error {
			_, err := client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "k", Token: 1})
			return err
		},
		"Extend": func() error {
			_, err := client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "k", Token: 1})
			return err
		},
		"Lookup": func() error {
			_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			err := call()
			le := ledgertest.WantStatus(t, err, errcode.Unavailable)
			if !le.Retryable() || strings.Contains(err.Error(), "pebble") || strings.Contains(err.Error(), "store closed") {
				t.Fatalf("UNAVAILABLE retryable=%v, message %q leaks the cause", le.Retryable(), err)
			}
		})
	}
}

// downStore is a store whose disk is gone: every call fails UNAVAILABLE,
// with a cause that names the store, as the embedded store's does.
type downStore struct{}

var errDown = errcode.Wrap(errcode.Unavailable, errors.New("pebble: store closed"), "the ledger's store is unavailable")

func (downStore) Claim(context.Context, ledger.ClaimParams) (ledger.ClaimResult, error) {
	return ledger.ClaimResult{}, errDown
}

func (downStore) Complete(context.Context, ledger.CompleteParams) (ledger.Record, error) {
	return ledger.Record{}, errDown
}
func (downStore) Release(context.Context, ledger.ReleaseParams) error { return errDown }
func (downStore) Extend(context.Context, ledger.ExtendParams) (ledger.Record, error) {
	return ledger.Record{}, errDown
}
func (downStore) Get(context.Context, ledger.Scope) (ledger.Record, error) {
	return ledger.Record{}, errDown
}

func (downStore) Resolve(context.Context, ledger.ResolveParams) (ledger.Record, error) {
	return ledger.Record{}, errDown
}

func (downStore) GetMany(context.Context, []ledger.Scope) ([]ledger.Record, error) {
	return nil, errDown
}

func (downStore) List(context.Context, ledger.ListParams) (ledger.ListPage, error) {
	return ledger.ListPage{}, errDown
}

func (downStore) Purge(context.Context, ledger.PurgeParams) (ledger.PurgeResult, error) {
	return ledger.PurgeResult{}, errDown
}

func (downStore) CountByState(context.Context) (ledger.Census, error) { return nil, errDown }
