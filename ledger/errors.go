package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
)

// Code is the stable, typed code of an error. Its numbers equal those of
// idemledger.v1.ErrorCode on the wire.
type Code int32

// The codes of the taxonomy (docs/contract.md, "Errors").
const (
	CodeUnspecified      Code = 0
	CodeRateLimited      Code = 1
	CodeUnavailable      Code = 2
	CodeUpstreamTimeout  Code = 3
	CodeInProgress       Code = 4
	CodeContention       Code = 5
	CodeValidationFailed Code = 6
	CodeKeyMissing       Code = 7
	CodeKeyInvalid       Code = 8
	CodeKeyReused        Code = 9
	CodeLeaseLost        Code = 10
	CodeRetryTooLate     Code = 11
	CodeOutcomeTooLarge  Code = 12
	CodeNotFound         Code = 13
	CodeUnauthenticated  Code = 14
	CodePermissionDenied Code = 15
	CodeInternal         Code = 16
	CodeOutcomeUnknown   Code = 17
	CodeKeyExpired       Code = 18
)

// codeTable is the one table of the taxonomy: the name, the gRPC code and
// whether the code is retryable. ledgerstatus maps it to the wire in both
// directions; tests pin it to docs/contract.md's table.
var codeTable = [...]struct {
	name      string
	grpc      codes.Code
	retryable bool
}{
	CodeUnspecified:      {"UNSPECIFIED", codes.Internal, false},
	CodeRateLimited:      {"RATE_LIMITED", codes.ResourceExhausted, true},
	CodeUnavailable:      {"UNAVAILABLE", codes.Unavailable, true},
	CodeUpstreamTimeout:  {"UPSTREAM_TIMEOUT", codes.DeadlineExceeded, true},
	CodeInProgress:       {"IN_PROGRESS", codes.Aborted, true},
	CodeContention:       {"CONTENTION", codes.Aborted, true},
	CodeValidationFailed: {"VALIDATION_FAILED", codes.InvalidArgument, false},
	CodeKeyMissing:       {"KEY_MISSING", codes.InvalidArgument, false},
	CodeKeyInvalid:       {"KEY_INVALID", codes.InvalidArgument, false},
	CodeKeyReused:        {"KEY_REUSED", codes.FailedPrecondition, false},
	CodeLeaseLost:        {"LEASE_LOST", codes.FailedPrecondition, false},
	CodeRetryTooLate:     {"RETRY_TOO_LATE", codes.FailedPrecondition, false},
	CodeOutcomeTooLarge:  {"OUTCOME_TOO_LARGE", codes.InvalidArgument, false},
	CodeNotFound:         {"NOT_FOUND", codes.NotFound, false},
	CodeUnauthenticated:  {"UNAUTHENTICATED", codes.Unauthenticated, false},
	CodePermissionDenied: {"PERMISSION_DENIED", codes.PermissionDenied, false},
	CodeInternal:         {"INTERNAL", codes.Internal, false},
	CodeOutcomeUnknown:   {"OUTCOME_UNKNOWN", codes.FailedPrecondition, false},
	CodeKeyExpired:       {"KEY_EXPIRED", codes.FailedPrecondition, false},
}

// Codes returns every code of the taxonomy, CodeUnspecified excluded.
func Codes() []Code {
	cs := make([]Code, 0, len(codeTable)-1)
	for c := range codeTable {
		if c != int(CodeUnspecified) {
			cs = append(cs, Code(c))
		}
	}
	return cs
}

// Known reports whether c is a code of the taxonomy.
func (c Code) Known() bool { return c > CodeUnspecified && int(c) < len(codeTable) }

// String returns the code's name as docs/contract.md spells it, such as "KEY_REUSED".
func (c Code) String() string {
	if c.Known() || c == CodeUnspecified {
		return codeTable[c].name
	}
	return fmt.Sprintf("Code(%d)", int32(c))
}

// GRPCCode returns the gRPC status code the code travels as. Unknown codes
// travel as INTERNAL.
func (c Code) GRPCCode() codes.Code {
	if !c.Known() {
		return codes.Internal
	}
	return codeTable[c].grpc
}

// Retryable reports whether a request that failed with c may be sent again
// with the same key.
func (c Code) Retryable() bool { return c.Known() && codeTable[c].retryable }

// Error is the one typed error of the ledger. Message is safe to show to
// callers; Err, the cause, is not and never leaves the process.
type Error struct {
	Code       Code
	Message    string
	RetryAfter time.Duration     // least wait before a retry; 0 means no hint
	Metadata   map[string]string // code-specific facts, such as "method"
	Err        error             // the cause, for logs only
}

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap returns an *Error with the code and message that keeps err as its
// cause.
func Wrap(code Code, err error, message string) *Error {
	return &Error{Code: code, Message: message, Err: err}
}

func (e *Error) Error() string {
	s := e.Code.String()
	if e.Message != "" {
		s += ": " + e.Message
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error of the same code, so that
// errors.Is(err, &ledger.Error{Code: ledger.CodeKeyReused}) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Retryable reports whether the request may be sent again with the same key.
func (e *Error) Retryable() bool { return e.Code.Retryable() }

// CodeOf classifies any error. It returns CodeUnspecified for nil, the code
// of an *Error in the chain, UPSTREAM_TIMEOUT for context errors (the
// outcome is unknown: retry with the same key), and INTERNAL for anything
// else.
func CodeOf(err error) Code {
	if err == nil {
		return CodeUnspecified
	}
	var e *Error
	if errors.As(err, &e) && e.Code.Known() {
		return e.Code
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return CodeUpstreamTimeout
	}
	return CodeInternal
}

// StoreRetryAfter is the retry-after of the UNAVAILABLE a store answers
// when it cannot answer.
const StoreRetryAfter = time.Second

// Unavailable is what every store answers when it cannot answer (its disk
// or database failed, is full, or is unreachable): UNAVAILABLE, retryable
// after StoreRetryAfter, with err as the cause. Stores use it so that the
// same kind of failure gets the same answer whatever the store.
func Unavailable(err error) *Error {
	return &Error{Code: CodeUnavailable, Message: "the ledger's store is unavailable", RetryAfter: StoreRetryAfter, Err: err}
}

// TimedOut is what every store answers when a call's context ended, or a
// bound on the call ran out, before the store answered: UPSTREAM_TIMEOUT,
// retryable with the same key, with err as the cause.
func TimedOut(err error) *Error {
	return Wrap(CodeUpstreamTimeout, err, "the ledger's store did not answer in time")
}

// AsError returns the *Error in err's chain or, for a foreign error, an
// *Error classified by CodeOf with a generic message and err as its cause.
// It returns nil for nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) && e.Code.Known() {
		return e
	}
	code := CodeOf(err)
	msg := "internal error"
	if code == CodeUpstreamTimeout {
		msg = "deadline exceeded or call canceled"
	}
	return Wrap(code, err, msg)
}
