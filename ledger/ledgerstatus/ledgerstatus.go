// Package ledgerstatus converts the ledger's typed errors to gRPC statuses
// with details, and back, through the one taxonomy table of package ledger.
//
// Every status it encodes carries an idemledger.v1.ErrorDetail, a
// google.rpc.ErrorInfo (reason: the code's name; domain: Domain; metadata:
// the error's metadata plus "retryable" and "retryAfterMs") and, when the
// error is retryable with a delay, a google.rpc.RetryInfo. Decoding accepts
// a status from any server and never panics.
package ledgerstatus

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// Domain is the ErrorInfo domain of the ledger's errors: the service's name.
const Domain = "idemledger.v1.LedgerService"

// PushbackTrailer is the trailer that tells stock gRPC retry policies
// whether and when to retry: the delay in milliseconds, or -1 for never.
const PushbackTrailer = "grpc-retry-pushback-ms"

// maxRetryAfter bounds a decoded retry-after hint, so that a hostile or
// broken server cannot park a client for days.
const maxRetryAfter = time.Hour

// Encode returns the status for err: nil for nil; for an *errcode.Error in
// the chain, its code, safe message and details; for any other error,
// ledger.CodeOf's code with a generic message, so internals never reach
// callers.
func Encode(err error) *status.Status {
	le := errcode.As(err)
	if le == nil {
		return nil
	}
	msg := le.Message
	if msg == "" {
		msg = le.Code.String()
	}
	st := status.New(GRPCCode(le.Code), msg)
	retryable := le.Code.Retryable()
	info := &errdetails.ErrorInfo{
		Reason:   le.Code.String(),
		Domain:   Domain,
		Metadata: map[string]string{"retryable": strconv.FormatBool(retryable)},
	}
	detail := &ledgerv1.ErrorDetail{Code: ledgerv1.ErrorCode(le.Code), Retryable: retryable}
	if len(le.Metadata) > 0 {
		detail.Metadata = make(map[string]string, len(le.Metadata))
		for k, v := range le.Metadata {
			detail.Metadata[k] = v
			info.Metadata[k] = v
		}
	}
	details := []protoadapt.MessageV1{detail, info}
	if retryable && le.RetryAfter > 0 {
		detail.RetryAfter = durationpb.New(le.RetryAfter)
		info.Metadata["retryAfterMs"] = strconv.FormatInt(le.RetryAfter.Milliseconds(), 10)
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(le.RetryAfter)})
	}
	withDetails, derr := st.WithDetails(details...)
	if derr != nil {
		return st
	}
	return withDetails
}

// Err returns Encode(err).Err(): the error a gRPC handler returns.
func Err(err error) error {
	if err == nil {
		return nil
	}
	return Encode(err).Err()
}

// Pushback returns the value of the grpc-retry-pushback-ms trailer for err:
// the retry-after in milliseconds when the error is retryable, "-1" when
// it is not.
func Pushback(err error) string {
	le := errcode.As(err)
	if le == nil || !le.Code.Retryable() {
		return "-1"
	}
	return strconv.FormatInt(le.RetryAfter.Milliseconds(), 10)
}

// SetPushback sets the grpc-retry-pushback-ms trailer for err on the
// server call in ctx. It does nothing for nil.
func SetPushback(ctx context.Context, err error) {
	if err == nil {
		return
	}
	_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackTrailer, Pushback(err)))
}

// FromError decodes an error returned by a gRPC call: nil for nil, a
// *errcode.Error in err's chain as it is, the typed error for a status, and
// ledger.AsError's classification for any other error (a context error is
// UPSTREAM_TIMEOUT).
func FromError(err error) *errcode.Error {
	if err == nil {
		return nil
	}
	if le := (*errcode.Error)(nil); errors.As(err, &le) && le.Code.Known() {
		return le
	}
	if st, ok := status.FromError(err); ok {
		if le := Decode(st); le != nil {
			return le
		}
	}
	return errcode.As(err)
}

// IsTyped reports whether err is a status that carries an
// idemledger.v1.ErrorDetail: an error typed by the ledger or by one of its
// interceptors, rather than one Decode would classify by its gRPC code.
func IsTyped(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return false
	}
	for _, d := range st.Details() {
		if _, ok := d.(*ledgerv1.ErrorDetail); ok {
			return true
		}
	}
	return false
}

// Decode returns the typed error a status carries, or nil for nil and OK.
// It prefers the ErrorDetail, then an ErrorInfo of Domain, then falls back
// on the gRPC code (see fallback). Unparseable details are skipped; it never
// panics.
func Decode(st *status.Status) *errcode.Error {
	if st == nil || st.Code() == codes.OK {
		return nil
	}
	le := &errcode.Error{Code: fallback(st), Message: st.Message()}
	var fromDetail, fromInfo bool
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *ledgerv1.ErrorDetail:
			if c := errcode.Code(d.GetCode()); c.Known() && !fromDetail {
				fromDetail = true
				le.Code = c
				le.Metadata = copyMap(d.GetMetadata())
				if d.GetRetryAfter() != nil {
					le.RetryAfter = clampDelay(d.GetRetryAfter())
				}
			}
		case *errdetails.ErrorInfo:
			if d.GetDomain() == Domain && !fromDetail && !fromInfo {
				if c, ok := byName[d.GetReason()]; ok {
					fromInfo = true
					le.Code = c
				}
			}
		case *errdetails.RetryInfo:
			if le.RetryAfter == 0 && d.GetRetryDelay() != nil {
				le.RetryAfter = clampDelay(d.GetRetryDelay())
			}
		}
	}
	if !le.Code.Retryable() {
		le.RetryAfter = 0
	}
	return le
}

func clampDelay(d *durationpb.Duration) time.Duration {
	if d.CheckValid() != nil {
		return 0
	}
	return min(max(d.AsDuration(), 0), maxRetryAfter)
}

// fallback types a status that carries no detail of ours, by its gRPC code.
// It is deliberately not the inverse of the taxonomy table: a foreign
// FAILED_PRECONDITION is no KEY_REUSED, and a foreign ABORTED is a conflict
// (CONTENTION), not a lease held by another attempt. gRPC's own refusal of
// a message over a size limit (RESOURCE_EXHAUSTED, "message larger than
// max", on either side) is OUTCOME_TOO_LARGE: sending it again cannot
// succeed, and only an outcome makes a ledger call that large.
func fallback(st *status.Status) errcode.Code {
	switch st.Code() {
	case codes.ResourceExhausted:
		if strings.Contains(st.Message(), "message larger than max") {
			return errcode.OutcomeTooLarge
		}
		return errcode.RateLimited
	case codes.Unavailable:
		return errcode.Unavailable
	case codes.DeadlineExceeded, codes.Canceled:
		return errcode.UpstreamTimeout
	case codes.Aborted:
		return errcode.Contention
	case codes.InvalidArgument, codes.OutOfRange:
		return errcode.ValidationFailed
	case codes.NotFound:
		return errcode.NotFound
	case codes.Unauthenticated:
		return errcode.Unauthenticated
	case codes.PermissionDenied:
		return errcode.PermissionDenied
	}
	return errcode.Internal
}

var byName = func() map[string]errcode.Code {
	m := make(map[string]errcode.Code)
	for _, c := range errcode.Codes() {
		m[c.String()] = c
	}
	return m
}()

func copyMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}
