package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// badStrings are the values a string field must refuse, by what is wrong
// with them, and the code a key gets for them.
var badStrings = []struct {
	name, value string
	keyCode     errcode.Code
}{
	{"Empty", "", errcode.KeyMissing},
	{"Oversized", strings.Repeat("k", 256), errcode.KeyInvalid},
	{"NonASCII", "clé-1", errcode.KeyInvalid},
	{"Space", "a b", errcode.KeyInvalid},
	{"NUL", "a\x00b", errcode.KeyInvalid},
	{"Newline", "a\nb", errcode.KeyInvalid},
	{"DEL", "a\x7fb", errcode.KeyInvalid},
}

var badFingerprints = []string{
	"", "v1:", "v1:abc", "v1:" + strings.Repeat("a", 63), "v1:" + strings.Repeat("a", 65),
	"v1:" + strings.Repeat("A", 64), "v1:" + strings.Repeat("g", 64), "v2:" + strings.Repeat("a", 200),
	"sha256:" + strings.Repeat("a", 64), strings.Repeat("a", 64), "v:abc", "vx:abc", "v1 " + strings.Repeat("a", 64),
}

var badDurations = map[string]*durationpb.Duration{
	"Zero":         durationpb.New(0),
	"Negative":     durationpb.New(-time.Second),
	"AboveMaximum": durationpb.New(30 * 24 * time.Hour),
	"Huge":         {Seconds: 315_576_000_000},
	"BadNanos":     {Seconds: 1, Nanos: -1},
	"NanosOver":    {Seconds: 0, Nanos: 1_000_000_000},
}

// TestBadInputCatalogue sends every RPC every bad value of every field, as
// unary calls and as calls on a Stream: each gets its typed error, the
// server keeps answering, and the records that exist are unchanged, nor
// does any new one appear.
func TestBadInputCatalogue(t *testing.T) {
	t.Parallel()
	t.Run("Unary", func(t *testing.T) { badInputCatalogue(t, false) })
	t.Run("Stream", func(t *testing.T) { badInputCatalogue(t, true) })
}

func badInputCatalogue(t *testing.T, stream bool) {
	clock := ledgertest.NewClock(ledgertest.Start)
	l := ledger.New(memory.New(memory.Config{Now: clock.Now}), ledger.Config{})
	srv := servertest.NewServer(t, func(gs *grpc.Server) {
		ledgerv1.RegisterLedgerServiceServer(gs, server.New(l, server.Config{Auth: testAuth}))
	}, grpc.MaxRecvMsgSize(2<<20), grpc.ForceServerCodecV2(server.Codec()))
	raw := ledgerv1.NewLedgerServiceClient(srv.Dial(t))
	client := raw
	ctx := as(t, "refunds-token") // every tenant, so tenant checks reach validation
	// with is a client whose calls carry md: on a stream, the stream's.
	with := func(md metadata.MD) (ledgerv1.LedgerServiceClient, context.Context) {
		if !stream {
			return raw, metadata.NewOutgoingContext(t.Context(), md)
		}
		c := ledgerclient.New(raw, ledgerclient.WithMetadata(md))
		t.Cleanup(func() { _ = c.Close() })
		return c, t.Context()
	}
	if stream {
		client = streamClient(t, srv.Dial(t), "refunds-token")
	}
	held, err := client.Begin(ctx, beginReq("held"))
	if err != nil {
		t.Fatal(err)
	}
	token := held.GetClaim().GetToken()
	done, _ := client.Begin(ctx, beginReq("done"))
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte{1}}}}
	if _, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "done", Token: done.GetClaim().GetToken(), Outcome: out}); err != nil {
		t.Fatal(err)
	}
	snapshot := func() []*ledgerv1.LookupResponse {
		var all []*ledgerv1.LookupResponse
		for _, k := range []string{"held", "done"} {
			res, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: k})
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, res)
		}
		return all
	}
	before := snapshot()

	type tc struct {
		name string
		call func() error
		want errcode.Code
	}
	var cases []tc
	begin := func(name string, want errcode.Code, edit func(*ledgerv1.BeginRequest)) {
		r := beginReq("fresh")
		edit(r)
		cases = append(cases, tc{"Begin/" + name, func() error { _, err := client.Begin(ctx, r); return err }, want})
	}
	for _, b := range badStrings {
		tenantCode := errcode.ValidationFailed
		begin("Tenant"+b.name, tenantCode, func(r *ledgerv1.BeginRequest) { r.Tenant = b.value })
		begin("Key"+b.name, b.keyCode, func(r *ledgerv1.BeginRequest) { r.Key = b.value })
		cases = append(cases,
			tc{"Complete/Key" + b.name, func() error {
				_, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: b.value, Token: token, Outcome: out})
				return err
			}, b.keyCode},
			tc{"Release/Key" + b.name, func() error {
				_, err := client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: b.value, Token: token})
				return err
			}, b.keyCode},
			tc{"Extend/Key" + b.name, func() error {
				_, err := client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: b.value, Token: token})
				return err
			}, b.keyCode},
			tc{"Lookup/Key" + b.name, func() error {
				_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: b.value})
				return err
			}, b.keyCode},
			tc{"Lookup/Tenant" + b.name, func() error {
				_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: b.value, Key: "held"})
				return err
			}, errcode.ValidationFailed},
		)
	}
	// A method is 1 to 255 bytes of printable ASCII, spaces inside allowed
	// ("http:POST /v1/invoices").
	for name, m := range map[string]string{
		"Empty": "", "Oversized": "/" + strings.Repeat("a", 300) + ".B/C", "NonASCII": "mcp:tools/clé", "Leading": " mcp:tools/x",
		"Trailing": "http:POST /x ", "NUL": "a\x00b", "Newline": "a\nb", "DEL": "a\x7fb", "Tab": "a\tb",
	} {
		begin("Method"+name, errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) { r.Method = m })
	}
	for i, fp := range badFingerprints {
		begin("Fingerprint"+string(rune('A'+i)), errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) { r.Fingerprint = fp })
	}
	for name, d := range badDurations {
		begin("Lease"+name, errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) { r.Lease = d })
		begin("Retention"+name, errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) { r.Retention = d })
		cases = append(cases,
			tc{"Extend/Lease" + name, func() error {
				_, err := client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "held", Token: token, Lease: d})
				return err
			}, errcode.ValidationFailed},
			tc{"Lookup/Wait" + name, func() error {
				if name == "Zero" {
					return ledgerstatus.Err(errcode.Errorf(errcode.ValidationFailed, "a zero wait is valid"))
				}
				_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "held", Wait: d})
				return err
			}, errcode.ValidationFailed},
		)
	}
	begin("RetentionBelowLease", errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) {
		r.Lease, r.Retention = durationpb.New(time.Hour), durationpb.New(time.Minute)
	})
	begin("FirstAttemptInvalid", errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) { r.FirstAttemptAt = &timestamppb.Timestamp{Seconds: 1 << 62} })
	begin("FirstAttemptBadNanos", errcode.ValidationFailed, func(r *ledgerv1.BeginRequest) { r.FirstAttemptAt = &timestamppb.Timestamp{Nanos: -1} })

	complete := func(name string, want errcode.Code, tok uint64, o *ledgerv1.Outcome) {
		cases = append(cases, tc{"Complete/" + name, func() error {
			_, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: tok, Outcome: o})
			return err
		}, want})
	}
	complete("TokenZero", errcode.ValidationFailed, 0, out)
	complete("TokenStale", errcode.LeaseLost, token+1, out)
	complete("TokenHuge", errcode.LeaseLost, ^uint64(0), out)
	complete("NoOutcome", errcode.ValidationFailed, token, nil)
	complete("EmptyOutcome", errcode.ValidationFailed, token, &ledgerv1.Outcome{})
	complete("NilResponse", errcode.ValidationFailed, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{}})
	complete("NoTypeURL", errcode.ValidationFailed, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{Value: []byte{1}}}})
	complete("LongTypeURL", errcode.ValidationFailed, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: strings.Repeat("t", 3000)}}})
	complete("StatusOK", errcode.ValidationFailed, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: 0, Message: "fine"}}})
	complete("StatusUnknownCode", errcode.ValidationFailed, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: 99}}})
	complete("StatusNegativeCode", errcode.ValidationFailed, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Status{Status: &ledgerv1.StoredStatus{Code: -3}}})
	complete("Oversized", errcode.OutcomeTooLarge, token, &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x", Value: make([]byte, ledger.DefaultMaxOutcomeBytes)}}})
	cases = append(cases,
		tc{"Release/TokenZero", func() error {
			_, err := client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "held"})
			return err
		}, errcode.ValidationFailed},
		tc{"Release/TokenStale", func() error {
			_, err := client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "held", Token: token + 1})
			return err
		}, errcode.LeaseLost},
		tc{"Release/Completed", func() error {
			_, err := client.Release(ctx, &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "done", Token: done.GetClaim().GetToken()})
			return err
		}, errcode.LeaseLost},
		tc{"Extend/TokenZero", func() error {
			_, err := client.Extend(ctx, &ledgerv1.ExtendRequest{Tenant: "acme", Key: "held"})
			return err
		}, errcode.ValidationFailed},
		tc{"Begin/OtherPayloadOnHeld", func() error {
			r := beginReq("held")
			r.Fingerprint = ledgertest.Fingerprint("other")
			_, err := client.Begin(ctx, r)
			return err
		}, errcode.KeyReused},
	)
	// Malformed credentials.
	for name, md := range map[string]metadata.MD{
		"NoAuthorization":   {},
		"BearerNoToken":     {"authorization": {"Bearer "}},
		"BearerOnly":        {"authorization": {"Bearer"}},
		"TwoBadTokens":      {"authorization": {"Bearer x", "Bearer y"}},
		"BinaryJunk":        {"authorization-bin": {"\x00\xff"}},
		"TokenInWrongField": {"token": {"refunds-token"}},
	} {
		cases = append(cases, tc{"Auth/" + name, func() error {
			c, ctx := with(md)
			_, err := c.Begin(ctx, beginReq("fresh"))
			return err
		}, errcode.Unauthenticated})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			le := ledgertest.WantStatus(t, err, c.want)
			if !ledgerstatus.IsTyped(err) || le.Retryable() {
				t.Fatalf("%v: want a typed, permanent error", err)
			}
		})
	}

	t.Run("OverTheMessageLimit", func(t *testing.T) {
		big := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "t/x", Value: make([]byte, 3<<20)}}}
		_, err := client.Complete(ctx, &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: token, Outcome: big})
		if status.Code(err) != codes.ResourceExhausted || ledgerstatus.FromError(err).Code != errcode.OutcomeTooLarge {
			t.Fatalf("a 3 MiB request over a 2 MiB limit: %v; want gRPC's refusal, decoded as OUTCOME_TOO_LARGE", err)
		}
	})
	// Strings that are not UTF-8 cannot come from a Go client: append a
	// second value of the field to a valid request's bytes (the last one
	// wins) and send the bytes as they are. The server's codec lets them
	// through, marked, and the ledger answers them typed.
	for _, m := range []struct {
		method string
		req    proto.Message
		field  protoreflect.Name
		want   errcode.Code
	}{
		{"Begin", beginReq("fresh"), "tenant", errcode.ValidationFailed},
		{"Begin", beginReq("fresh"), "key", errcode.KeyInvalid},
		{"Begin", beginReq("fresh"), "method", errcode.ValidationFailed},
		{"Complete", &ledgerv1.CompleteRequest{Tenant: "acme", Key: "held", Token: token, Outcome: out}, "key", errcode.KeyInvalid},
		{"Release", &ledgerv1.ReleaseRequest{Tenant: "acme", Key: "held", Token: token}, "key", errcode.KeyInvalid},
		{"Extend", &ledgerv1.ExtendRequest{Tenant: "acme", Key: "held", Token: token}, "tenant", errcode.ValidationFailed},
		{"Lookup", &ledgerv1.LookupRequest{Tenant: "acme", Key: "held"}, "key", errcode.KeyInvalid},
	} {
		t.Run("NotUTF8/"+m.method+"/"+string(m.field), func(t *testing.T) {
			b, err := proto.Marshal(m.req)
			if err != nil {
				t.Fatal(err)
			}
			num := m.req.ProtoReflect().Descriptor().Fields().ByName(m.field).Number()
			b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), []byte("held\xff"))
			if !stream {
				err = srv.Dial(t).Invoke(ctx, "/idemledger.v1.LedgerService/"+m.method, ptr(rawMessage(b)), new(rawMessage), grpc.ForceCodecV2(rawCodec{}))
				ledgertest.WantStatus(t, err, m.want)
				return
			}
			// On a stream: the call, as raw bytes, inside a StreamRequest.
			callNum := map[string]protowire.Number{"Begin": 3, "Complete": 4, "Release": 5, "Extend": 6, "Lookup": 7}[m.method]
			sreq := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 99)
			sreq = protowire.AppendBytes(protowire.AppendTag(sreq, callNum, protowire.BytesType), b)
			st, err := srv.Dial(t).NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true},
				ledgerv1.LedgerService_Stream_FullMethodName, grpc.ForceCodecV2(rawCodec{}))
			if err != nil {
				t.Fatal(err)
			}
			if err := st.SendMsg(ptr(rawMessage(sreq))); err != nil {
				t.Fatal(err)
			}
			var raw rawMessage
			if err := st.RecvMsg(&raw); err != nil {
				t.Fatal(err)
			}
			_ = st.CloseSend()
			var res ledgerv1.StreamResponse
			if err := proto.Unmarshal(raw, &res); err != nil || res.GetId() != 99 || res.GetError() == nil {
				t.Fatalf("the stream's answer = %v, %v; want call 99's error", &res, err)
			}
			ledgertest.WantStatus(t, ledgerstatus.FromFields(res.GetError()).Err(), m.want)
		})
	}

	if d := cmp.Diff(before, snapshot(), protocmp.Transform()); d != "" {
		t.Fatalf("bad input changed the records (-before +after):\n%s", d)
	}
	if _, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "fresh"}); ledgerstatus.FromError(err).Code != errcode.NotFound {
		t.Fatalf("bad input created a record: %v", err)
	}
}

// rawMessage is bytes sent and received as they are, through rawCodec.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMessage))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*rawMessage) = data.Materialize()
	return nil
}

func ptr[T any](v T) *T { return &v }
