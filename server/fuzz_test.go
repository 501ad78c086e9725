package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// FuzzServerRequests decodes arbitrary bytes as each RPC's request, as the
// server's codec would, and calls the server with them: it never panics,
// every error is typed, and the completed record of another key never
// changes.
func FuzzServerRequests(f *testing.F) {
	seeds := []proto.Message{
		beginReq("k"),
		&ledgerv1.BeginRequest{Tenant: "acme", Key: "done", Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method, Lease: durationpb.New(-1)},
		&ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: 1, Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x"}}}},
		&ledgerv1.CompleteRequest{Tenant: "acme", Key: "done", Token: 1, Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: 3}}}},
		&ledgerv1.ReleaseRequest{Tenant: "acme", Key: "done", Token: 1},
		&ledgerv1.ExtendRequest{Tenant: "acme", Key: "k", Token: 1, Lease: durationpb.New(1e9)},
		&ledgerv1.LookupRequest{Tenant: "acme", Key: "done", Wait: durationpb.New(-5)},
	}
	for i, m := range seeds {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8([]int{0, 0, 1, 1, 2, 3, 4}[i]), b)
	}
	clock := ledgertest.NewClock(ledgertest.Start)
	srv := server.New(ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{}), server.Config{Auth: testAuth})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer refunds-token"))
	res, err := srv.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: "done", Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	if err != nil {
		f.Fatal(err)
	}
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x", Value: []byte("inv_1")}}}
	if _, err := srv.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "done", Token: res.GetClaim().GetToken(), Outcome: out}); err != nil {
		f.Fatal(err)
	}
	done, err := srv.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "done"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, rpc uint8, b []byte) {
		var err error
		switch rpc % 5 {
		case 0:
			req := &ledgerv1.BeginRequest{}
			if proto.Unmarshal(b, req) != nil {
				return
			}
			_, err = srv.Begin(ctx, req)
		case 1:
			req := &ledgerv1.CompleteRequest{}
			if proto.Unmarshal(b, req) != nil {
				return
			}
			_, err = srv.Complete(ctx, req)
		case 2:
			req := &ledgerv1.ReleaseRequest{}
			if proto.Unmarshal(b, req) != nil {
				return
			}
			_, err = srv.Release(ctx, req)
		case 3:
			req := &ledgerv1.ExtendRequest{}
			if proto.Unmarshal(b, req) != nil {
				return
			}
			_, err = srv.Extend(ctx, req)
		case 4:
			req := &ledgerv1.LookupRequest{}
			if proto.Unmarshal(b, req) != nil {
				return
			}
			if req.GetWait().AsDuration() > 0 {
				req.Wait = nil // a fuzzer must not sleep
			}
			_, err = srv.Lookup(ctx, req)
		}
		if err != nil && !ledgerstatus.IsTyped(err) {
			t.Fatalf("untyped error %v", err)
		}
		after, err := srv.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "done"})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(done, after, protocmp.Transform()); d != "" {
			t.Fatalf("the completed record changed (-before +after):\n%s", d)
		}
	})
}

// FuzzStreamRequests sends arbitrary bytes, decoded as a StreamRequest, on
// one real Stream: every call is answered with its id (but a cancel,
// which has no answer), every error is typed, the stream goes on, and the
// completed record of another key never changes.
func FuzzStreamRequests(f *testing.F) {
	for _, m := range []*ledgerv1.StreamRequest{
		{Call: &ledgerv1.StreamRequest_Begin{Begin: beginReq("k")}},
		{Timeout: durationpb.New(-1), Call: &ledgerv1.StreamRequest_Begin{Begin: beginReq("k")}},
		{Timeout: durationpb.New(time.Second), Call: &ledgerv1.StreamRequest_Complete{Complete: &ledgerv1.CompleteRequest{Tenant: "acme", Key: "done", Token: 1}}},
		{Call: &ledgerv1.StreamRequest_Release{Release: &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "done", Token: 1}}},
		{Call: &ledgerv1.StreamRequest_Extend{Extend: &ledgerv1.ExtendRequest{Tenant: "acme", Key: "k", Lease: durationpb.New(1e9)}}},
		{Call: &ledgerv1.StreamRequest_Lookup{Lookup: &ledgerv1.LookupRequest{Tenant: "acme", Key: "done"}}},
		{Call: &ledgerv1.StreamRequest_Cancel{Cancel: &ledgerv1.CancelRequest{}}},
		{},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	l := ledger.New(memory.New(memory.Config{Now: ledgertest.NewClock(ledgertest.Start).Now}), ledger.Config{})
	conn := servertest.NewServer(f, servertest.Ledger(server.New(l, server.Config{Auth: testAuth}))).Dial(f)
	client := ledgerv1.NewLedgerServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer refunds-token")
	res, err := client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: "done", Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method})
	if err != nil {
		f.Fatal(err)
	}
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x", Value: []byte("inv_1")}}}
	if _, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "done", Token: res.GetClaim().GetToken(), Outcome: out}); err != nil {
		f.Fatal(err)
	}
	done, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "done"})
	if err != nil {
		f.Fatal(err)
	}
	stream, err := client.Stream(ctx)
	if err != nil {
		f.Fatal(err)
	}
	var id uint64
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &ledgerv1.StreamRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		if req.GetLookup().GetWait() != nil {
			req.GetLookup().Wait = nil // a fuzzer must not sleep on a clock that stands still
		}
		if req.GetCancel() != nil {
			return // no answer to wait for
		}
		id++
		req.Id = id
		if err := stream.Send(req); err != nil {
			t.Fatalf("the stream broke: %v", err)
		}
		res, err := stream.Recv()
		if err != nil {
			t.Fatalf("the stream broke: %v", err)
		}
		if res.GetId() != id {
			t.Fatalf("answer for %d, want %d", res.GetId(), id)
		}
		if e := res.GetError(); e != nil && !ledgerstatus.IsTyped(ledgerstatus.FromFields(e).Err()) {
			t.Fatalf("untyped error %v", e)
		}
		after, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "done"})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(done, after, protocmp.Transform()); d != "" {
			t.Fatalf("the completed record changed (-before +after):\n%s", d)
		}
	})
}
