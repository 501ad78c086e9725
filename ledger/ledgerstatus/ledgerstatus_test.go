package ledgerstatus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server/servertest"
)

// specTable is docs/contract.md's "Errors" table, copied by hand: the code's
// name, its gRPC code, and whether it is retryable.
var specTable = []struct {
	name      string
	grpc      codes.Code
	retryable bool
}{
	{"RATE_LIMITED", codes.ResourceExhausted, true},
	{"UNAVAILABLE", codes.Unavailable, true},
	{"UPSTREAM_TIMEOUT", codes.DeadlineExceeded, true},
	{"IN_PROGRESS", codes.Aborted, true},
	{"CONTENTION", codes.Aborted, true},
	{"VALIDATION_FAILED", codes.InvalidArgument, false},
	{"KEY_MISSING", codes.InvalidArgument, false},
	{"KEY_INVALID", codes.InvalidArgument, false},
	{"KEY_REUSED", codes.FailedPrecondition, false},
	{"LEASE_LOST", codes.FailedPrecondition, false},
	{"RETRY_TOO_LATE", codes.FailedPrecondition, false},
	{"OUTCOME_TOO_LARGE", codes.InvalidArgument, false},
	{"NOT_FOUND", codes.NotFound, false},
	{"UNAUTHENTICATED", codes.Unauthenticated, false},
	{"PERMISSION_DENIED", codes.PermissionDenied, false},
	{"INTERNAL", codes.Internal, false},
	// HOLD's unknown outcome, and a tombstone.
	{"OUTCOME_UNKNOWN", codes.FailedPrecondition, false},
	{"KEY_EXPIRED", codes.FailedPrecondition, false},
}

func TestTableMatchesSpec(t *testing.T) {
	t.Parallel()
	codesByName := map[string]errcode.Code{}
	for _, c := range errcode.Codes() {
		codesByName[c.String()] = c
	}
	if len(codesByName) != len(specTable) {
		t.Fatalf("the ledger has %d codes, the contract %d", len(codesByName), len(specTable))
	}
	for _, row := range specTable {
		c, ok := codesByName[row.name]
		if !ok {
			t.Errorf("contract code %s is missing", row.name)
			continue
		}
		if ledgerstatus.GRPCCode(c) != row.grpc || c.Retryable() != row.retryable {
			t.Errorf("%s: gRPC %s retryable %v, the contract says %s %v", row.name, ledgerstatus.GRPCCode(c), c.Retryable(), row.grpc, row.retryable)
		}
		if got := ledgerv1.ErrorCode(c).String(); got != "ERROR_CODE_"+row.name {
			t.Errorf("%s travels as wire enum %s", row.name, got)
		}
	}
	if n := len(ledgerv1.ErrorCode_name); n != len(specTable)+1 {
		t.Errorf("the wire enum has %d values, want %d and UNSPECIFIED", n, len(specTable))
	}
}

// dialFailer starts a real gRPC server whose method M fails with errs[M],
// encoded by ledgerstatus, with the pushback trailer set.
func dialFailer(t *testing.T, errs map[string]error) *grpc.ClientConn {
	t.Helper()
	return servertest.NewServer(t, nil, grpc.UnknownServiceHandler(func(_ any, stream grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(stream)
		err := errs[method]
		ledgerstatus.SetPushback(stream.Context(), err)
		return ledgerstatus.Err(err)
	})).Dial(t)
}

func TestRoundTripEveryCode(t *testing.T) {
	t.Parallel()
	errs := map[string]error{}
	for _, c := range errcode.Codes() {
		e := &errcode.Error{Code: c, Message: "message of " + c.String(), Metadata: map[string]string{"method": "/a.B/C"}}
		if c.Retryable() {
			e.RetryAfter = 1500 * time.Millisecond
		}
		errs["/test.Fail/"+c.String()] = e
	}
	conn := dialFailer(t, errs)
	for _, c := range errcode.Codes() {
		t.Run(c.String(), func(t *testing.T) {
			var trailer metadata.MD
			err := conn.Invoke(t.Context(), "/test.Fail/"+c.String(), &emptypb.Empty{}, &emptypb.Empty{}, grpc.Trailer(&trailer))
			st := status.Convert(err)
			if st.Code() != ledgerstatus.GRPCCode(c) {
				t.Fatalf("gRPC code = %s, want %s", st.Code(), ledgerstatus.GRPCCode(c))
			}
			got := ledgerstatus.FromError(err)
			want := errcode.As(errs["/test.Fail/"+c.String()])
			if d := cmp.Diff(want, got, cmpopts.IgnoreFields(errcode.Error{}, "Err")); d != "" {
				t.Fatalf("decoded (-want +got):\n%s", d)
			}
			var info *errdetails.ErrorInfo
			var retry *errdetails.RetryInfo
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					info = d
				case *errdetails.RetryInfo:
					retry = d
				}
			}
			wantInfo := &errdetails.ErrorInfo{Reason: c.String(), Domain: ledgerstatus.Domain,
				Metadata: map[string]string{"retryable": fmt.Sprint(c.Retryable()), "method": "/a.B/C"}}
			wantPushback := "-1"
			if c.Retryable() {
				wantInfo.Metadata["retryAfterMs"] = "1500"
				wantPushback = "1500"
				if retry.GetRetryDelay().AsDuration() != 1500*time.Millisecond {
					t.Fatalf("RetryInfo = %v, want 1.5s", retry)
				}
			} else if retry != nil {
				t.Fatalf("RetryInfo on a permanent error: %v", retry)
			}
			if !proto.Equal(info, wantInfo) {
				t.Fatalf("ErrorInfo = %v, want %v", info, wantInfo)
			}
			if got := trailer.Get(ledgerstatus.PushbackTrailer); len(got) != 1 || got[0] != wantPushback {
				t.Fatalf("pushback trailer = %v, want %s", got, wantPushback)
			}
		})
	}
}

func TestForeignErrorsLeakNothing(t *testing.T) {
	t.Parallel()
	st := ledgerstatus.Encode(fmt.Errorf("crdb: claim: %w", errors.New("dial tcp 10.1.2.3:26257: secret")))
	if st.Code() != codes.Internal || st.Message() != "internal error" {
		t.Fatalf("foreign error encoded as %s %q", st.Code(), st.Message())
	}
	wrapped := errcode.Wrap(errcode.Unavailable, errors.New("password=hunter2"), "the store is unavailable")
	if st := ledgerstatus.Encode(wrapped); st.Message() != "the store is unavailable" {
		t.Fatalf("message = %q leaks the cause", st.Message())
	}
	if got := ledgerstatus.Encode(context.DeadlineExceeded).Code(); got != codes.DeadlineExceeded {
		t.Fatalf("context deadline encoded as %s", got)
	}
}

func TestDecodeForeignStatuses(t *testing.T) {
	t.Parallel()
	garbage, _ := anypb.New(&errdetails.ErrorInfo{Reason: "KEY_REUSED", Domain: "someone.else"})
	tests := []struct {
		name string
		st   *spb.Status
		want errcode.Code
		wait time.Duration
	}{
		{"Unavailable", &spb.Status{Code: int32(codes.Unavailable)}, errcode.Unavailable, 0},
		{"ResourceExhaustedWithRetryInfo", withDetail(codes.ResourceExhausted, &errdetails.RetryInfo{RetryDelay: durationpb.New(3 * time.Second)}), errcode.RateLimited, 3 * time.Second},
		{"AbortedIsContention", &spb.Status{Code: int32(codes.Aborted)}, errcode.Contention, 0},
		{"FailedPreconditionIsInternal", &spb.Status{Code: int32(codes.FailedPrecondition)}, errcode.Internal, 0},
		{"OtherDomainIgnored", &spb.Status{Code: int32(codes.Unknown), Details: []*anypb.Any{garbage}}, errcode.Internal, 0},
		{"UndecodableDetail", &spb.Status{Code: int32(codes.Unavailable), Details: []*anypb.Any{{TypeUrl: "type.googleapis.com/idemledger.v1.ErrorDetail", Value: []byte{0xff}}}}, errcode.Unavailable, 0},
		{"UnknownWireCode", withDetail(codes.Aborted, &ledgerv1.ErrorDetail{Code: 999}), errcode.Contention, 0},
		{"HugeRetryAfterClamped", withDetail(codes.Aborted, &ledgerv1.ErrorDetail{Code: ledgerv1.ErrorCode_ERROR_CODE_IN_PROGRESS, RetryAfter: durationpb.New(1000 * time.Hour)}), errcode.InProgress, time.Hour},
		{"NegativeRetryAfter", withDetail(codes.Aborted, &ledgerv1.ErrorDetail{Code: ledgerv1.ErrorCode_ERROR_CODE_IN_PROGRESS, RetryAfter: durationpb.New(-time.Hour)}), errcode.InProgress, 0},
		{"ErrorInfoOnly", withDetail(codes.FailedPrecondition, &errdetails.ErrorInfo{Reason: "LEASE_LOST", Domain: ledgerstatus.Domain}), errcode.LeaseLost, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ledgerstatus.Decode(status.FromProto(tt.st))
			if got.Code != tt.want || got.RetryAfter != tt.wait {
				t.Fatalf("Decode = %v after %s, want %s after %s", got.Code, got.RetryAfter, tt.want, tt.wait)
			}
		})
	}
	if ledgerstatus.Decode(nil) != nil || ledgerstatus.Decode(status.New(codes.OK, "")) != nil || ledgerstatus.FromError(nil) != nil {
		t.Fatal("nil and OK must decode to nil")
	}
}

func withDetail(c codes.Code, m proto.Message) *spb.Status {
	a, err := anypb.New(m)
	if err != nil {
		panic(err)
	}
	return &spb.Status{Code: int32(c), Message: "m", Details: []*anypb.Any{a}}
}

func FuzzDecode(f *testing.F) {
	for _, c := range errcode.Codes() {
		b, _ := proto.Marshal(ledgerstatus.Encode(&errcode.Error{Code: c, RetryAfter: time.Second}).Proto())
		f.Add(b)
	}
	f.Add([]byte{0x08, 0x0e, 0x1a, 0x03, 0x0a, 0x01, 0x78})
	f.Fuzz(func(t *testing.T, b []byte) {
		var sp spb.Status
		if proto.Unmarshal(b, &sp) != nil {
			return
		}
		le := ledgerstatus.Decode(status.FromProto(&sp))
		if sp.GetCode() == 0 {
			if le != nil {
				t.Fatalf("OK decoded to %v", le)
			}
			return
		}
		if !le.Code.Known() || le.RetryAfter < 0 || le.RetryAfter > time.Hour || (!le.Code.Retryable() && le.RetryAfter != 0) {
			t.Fatalf("Decode = %+v", le)
		}
		// Whatever was decoded encodes again to a status of the same code.
		if again := ledgerstatus.Decode(ledgerstatus.Encode(le)); again.Code != le.Code {
			t.Fatalf("re-encoded %s decoded as %s", le.Code, again.Code)
		}
	})
}

func TestIsTyped(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		err  error
		want bool
	}{
		"Nil":        {nil, false},
		"Typed":      {ledgerstatus.Err(errcode.Errorf(errcode.KeyReused, "x")), true},
		"Foreign":    {status.Error(codes.Unavailable, "connection refused"), false},
		"NotAStatus": {errors.New("plain"), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := ledgerstatus.IsTyped(tt.err); got != tt.want {
				t.Fatalf("IsTyped(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
