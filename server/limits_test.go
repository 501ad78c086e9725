package server_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

func TestRateLimitPerNamespace(t *testing.T) {
	t.Parallel()
	l := ledger.New(memory.New(memory.Config{}), ledger.Config{})
	conn := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth, RateLimit: server.NewRateLimit(0.5, 3)}))).Dial(t)
	client := ledgerv1.NewLedgerServiceClient(conn)
	for i := range 3 {
		if _, err := client.Lookup(as(t, "billing-token"), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); errcode.Of(ledgerstatus.FromError(err)) != errcode.NotFound {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
	}
	var trailer metadata.MD
	_, err := client.Lookup(as(t, "billing-token"), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}, grpc.Trailer(&trailer))
	le := ledgertest.WantStatus(t, err, errcode.RateLimited)
	if !le.Retryable() || le.RetryAfter < time.Second || le.RetryAfter > 2*time.Second {
		t.Fatalf("RATE_LIMITED retryable=%v retry-after=%v; want retryable and about 2s", le.Retryable(), le.RetryAfter)
	}
	if got := trailer.Get(ledgerstatus.PushbackTrailer); len(got) != 1 || got[0] != fmt.Sprint(le.RetryAfter.Milliseconds()) {
		t.Fatalf("pushback trailer = %q", got)
	}
	// Another namespace has a bucket of its own.
	if _, err := client.Lookup(as(t, "refunds-token"), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); errcode.Of(ledgerstatus.FromError(err)) != errcode.NotFound {
		t.Fatalf("another namespace: %v", err)
	}
}

func TestDecisionMetrics(t *testing.T) {
	t.Parallel()
	clock := ledgertest.NewClock(ledgertest.Start)
	var metrics decisions
	l := ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{})
	conn := servertest.NewServer(t, servertest.Ledger(server.New(l, server.Config{Auth: testAuth, Observe: metrics.observe}))).Dial(t)
	client := ledgerv1.NewLedgerServiceClient(conn)
	ctx := as(t, "billing-token")
	mustBegin := func(req *ledgerv1.BeginRequest) *ledgerv1.BeginResponse {
		t.Helper()
		res, err := client.Begin(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	done := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: 9, Message: "declined"}}}

	// claimed
	c := mustBegin(beginReq("a")).GetClaim()
	// in_progress
	_, _ = client.Begin(ctx, beginReq("a"))
	// key_reused
	_, _ = client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: "a", Fingerprint: ledgertest.Fingerprint("other"), Method: ledgertest.Method})
	// completed
	_, _ = client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "a", Token: c.GetToken(), Outcome: done})
	// replayed
	mustBegin(beginReq("a"))
	// lease_lost
	_, _ = client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "a", Token: c.GetToken()})
	// claimed
	b := mustBegin(beginReq("b")).GetClaim()
	// released
	_, _ = client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "b", Token: b.GetToken()})
	// claimed
	mustBegin(beginReq("c"))
	clock.Advance(time.Hour)
	// taken_over
	c2 := mustBegin(beginReq("c")).GetClaim()
	// extended
	_, _ = client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "c", Token: c2.GetToken()})

	metrics.want(t, map[string]int{
		"billing claimed": 3, "billing completed": 1, "billing extended": 1, "billing in_progress": 1, "billing key_reused": 1,
		"billing lease_lost": 1, "billing released": 1, "billing replayed": 1, "billing taken_over": 1,
	})
}

// decisions counts what Config.Observe hears, by "namespace decision".
type decisions struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *decisions) observe(namespace string, dec server.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[namespace+" "+string(dec)]++
}

// want fails t unless exactly these decisions were heard.
func (d *decisions) want(t *testing.T, want map[string]int) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if diff := cmp.Diff(want, d.n); diff != "" {
		t.Fatalf("decisions (-want +got):\n%s", diff)
	}
}
