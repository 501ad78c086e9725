package server_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// adminFixture serves LedgerService and AdminService on one ledger, with
// an audit log.
type adminFixture struct {
	ledger ledgerv1.LedgerServiceClient
	admin  ledgerv1.AdminServiceClient
	clock  *ledgertest.Clock
	log    *bytes.Buffer
}

func newAdminFixture(t *testing.T) *adminFixture {
	t.Helper()
	clock := ledgertest.NewClock(ledgertest.Start)
	l := ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{})
	var log bytes.Buffer
	cfg := server.Config{Auth: testAuth, Logger: slog.New(slog.NewJSONHandler(&log, nil))}
	conn := servertest.NewServer(t, func(gs *grpc.Server) {
		ledgerv1.RegisterLedgerServiceServer(gs, server.New(l, cfg))
		ledgerv1.RegisterAdminServiceServer(gs, server.NewAdmin(l, cfg))
	}).Dial(t)
	return &adminFixture{ledgerv1.NewLedgerServiceClient(conn), ledgerv1.NewAdminServiceClient(conn), clock, &log}
}

// TestAdminIsForAdminsOnly: a write service's credentials are refused by
// AdminService, and an admin's by LedgerService.
func TestAdminIsForAdminsOnly(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	_, err := f.admin.ListRecords(as(t, "billing-token"), &ledgerv1.ListRecordsRequest{Namespace: "billing"})
	ledgertest.WantStatus(t, err, errcode.PermissionDenied)
	_, err = f.admin.ListRecords(t.Context(), &ledgerv1.ListRecordsRequest{Namespace: "billing"})
	ledgertest.WantStatus(t, err, errcode.Unauthenticated)
	_, err = f.ledger.Begin(as(t, "ops-token"), beginReq("k"))
	ledgertest.WantStatus(t, err, errcode.PermissionDenied)
}

// TestAdminRefusalsAreTypedAndAudited: every refused admin call carries
// the pushback trailer LedgerService's errors carry (-1: never retry as
// it is), and is audited with who asked (a write service's namespace,
// unauthenticated, or the admin) for what (namespace, tenant, key).
func TestAdminRefusalsAreTypedAndAudited(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	for _, tc := range []struct {
		name, who string
		call      func(opts ...grpc.CallOption) error
		code      errcode.Code
	}{
		{"WriteService", "namespace:billing", func(opts ...grpc.CallOption) error {
			_, err := f.admin.GetRecord(as(t, "billing-token"), &ledgerv1.GetRecordRequest{Namespace: "billing", Tenant: "acme", Key: "k-who"}, opts...)
			return err
		}, errcode.PermissionDenied},
		{"NoCredentials", "unauthenticated", func(opts ...grpc.CallOption) error {
			_, err := f.admin.PurgeKey(t.Context(), &ledgerv1.PurgeKeyRequest{Namespace: "billing", Tenant: "acme", Key: "k-who"}, opts...)
			return err
		}, errcode.Unauthenticated},
		{"NotFound", "ops", func(opts ...grpc.CallOption) error {
			_, err := f.admin.GetRecord(as(t, "ops-token"), &ledgerv1.GetRecordRequest{Namespace: "billing", Tenant: "acme", Key: "k-who"}, opts...)
			return err
		}, errcode.NotFound},
		{"Invalid", "ops", func(opts ...grpc.CallOption) error {
			_, err := f.admin.PurgeTenant(as(t, "ops-token"), &ledgerv1.PurgeTenantRequest{Namespace: "billing"}, opts...)
			return err
		}, errcode.ValidationFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.log.Reset()
			var trailer metadata.MD
			ledgertest.WantStatus(t, tc.call(grpc.Trailer(&trailer)), tc.code)
			if got := trailer.Get(ledgerstatus.PushbackTrailer); len(got) != 1 || got[0] != "-1" {
				t.Errorf("pushback trailer %v, want [-1]", got)
			}
			line := f.log.String()
			if !strings.Contains(line, `refused"`) || !strings.Contains(line, `"principal":"`+tc.who+`"`) ||
				!strings.Contains(line, `"namespace":"billing"`) || !strings.Contains(line, `"code":"`+tc.code.String()+`"`) {
				t.Errorf("audit line %s; want the refusal, who (%s), the namespace and the code", line, tc.who)
			}
		})
	}
}

// TestAdminListGetResolvePurge: an operator finds a key whose outcome is
// unknown, settles it, and erases a tenant; each call is audited.
func TestAdminListGetResolvePurge(t *testing.T) {
	t.Parallel()
	f := newAdminFixture(t)
	billing, ops := as(t, "billing-token"), as(t, "ops-token")
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.StringValue", Value: []byte("\x0a\x03inv")}}}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		res, err := f.ledger.Begin(billing, beginReq(k))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.ledger.Complete(billing, &ledgerv1.CompleteRequest{Tenant: "acme", Key: k, Token: res.GetClaim().GetToken(), Outcome: out}); err != nil {
			t.Fatal(err)
		}
	}
	held := beginReq("charge")
	held.OnLeaseExpiry, held.Lease = ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_HOLD, durationpb.New(time.Second)
	if _, err := f.ledger.Begin(billing, held); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Second)

	// List every record, two a page.
	var keys []string
	req := &ledgerv1.ListRecordsRequest{Namespace: "billing", Tenant: "acme", PageSize: 2}
	for pages := 0; ; pages++ {
		res, err := f.admin.ListRecords(ops, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res.GetRecords() {
			keys = append(keys, r.GetKey())
			if r.GetRecord().GetOutcome() != nil {
				t.Fatal("an outcome listed without with_outcomes")
			}
		}
		if res.GetNextPageToken() == "" {
			break
		}
		req.PageToken = res.GetNextPageToken()
	}
	if strings.Join(keys, ",") != "a,b,c,charge,d,e" {
		t.Fatalf("listed %v", keys)
	}
	// Find the unknown one, and read it with its token.
	unknown, err := f.admin.ListRecords(ops, &ledgerv1.ListRecordsRequest{Namespace: "billing", State: ledgerv1.State_STATE_OUTCOME_UNKNOWN})
	if err != nil || len(unknown.GetRecords()) != 1 || unknown.GetRecords()[0].GetKey() != "charge" {
		t.Fatalf("unknown records: %v, %v", unknown, err)
	}
	got, err := f.admin.GetRecord(ops, &ledgerv1.GetRecordRequest{Namespace: "billing", Tenant: "acme", Key: "charge"})
	if err != nil || got.GetRecord().GetToken() != 1 || got.GetRecord().GetRecord().GetState() != ledgerv1.State_STATE_OUTCOME_UNKNOWN {
		t.Fatalf("get: %v, %v", got, err)
	}
	// Settle it as applied: the write service's retry replays it.
	if _, err := f.admin.ResolveRecord(ops, &ledgerv1.ResolveRecordRequest{Namespace: "billing", Tenant: "acme", Key: "charge",
		Resolution: &ledgerv1.ResolveRecordRequest_Applied{Applied: out}}); err != nil {
		t.Fatal(err)
	}
	if res, err := f.ledger.Begin(billing, beginReq("charge")); err != nil || res.GetReplay() == nil {
		t.Fatalf("after the resolution: %v, %v", res, err)
	}
	// Erase a key, then the tenant.
	if res, err := f.admin.PurgeKey(ops, &ledgerv1.PurgeKeyRequest{Namespace: "billing", Tenant: "acme", Key: "a"}); err != nil || !res.GetPurged() {
		t.Fatalf("purge a: %v, %v", res, err)
	}
	total := int64(0)
	for {
		res, err := f.admin.PurgeTenant(ops, &ledgerv1.PurgeTenantRequest{Namespace: "billing", Tenant: "acme", Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		total += res.GetPurged()
		if !res.GetMore() {
			break
		}
	}
	if total != 5 {
		t.Fatalf("purged %d of the tenant's 5 records", total)
	}
	if left, err := f.admin.ListRecords(ops, &ledgerv1.ListRecordsRequest{Namespace: "billing"}); err != nil || len(left.GetRecords()) != 0 {
		t.Fatalf("after the tenant's purge: %v, %v", left, err)
	}
	// Refusals.
	_, err = f.admin.ListRecords(ops, &ledgerv1.ListRecordsRequest{Namespace: "billing", PageToken: "not a token"})
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)
	_, err = f.admin.PurgeTenant(ops, &ledgerv1.PurgeTenantRequest{Namespace: "billing"})
	ledgertest.WantStatus(t, err, errcode.ValidationFailed)

	log := f.log.String()
	for _, want := range []string{`"msg":"audit: record resolved"`, `"msg":"audit: key purged"`, `"msg":"audit: tenant purged"`, `"msg":"audit: list"`, `"msg":"audit: purge tenant refused"`} {
		if !strings.Contains(log, want) {
			t.Errorf("no %s in the audit log", want)
		}
	}
	if !strings.Contains(log, `"principal":"ops"`) {
		t.Error("the audit lines do not name the principal")
	}
}
