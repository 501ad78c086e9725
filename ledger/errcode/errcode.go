// Package errcode is the error taxonomy of idemledger: the stable codes,
// whether each may be retried with the same key, and the one typed error
// that carries a code, a safe message, a retry-after hint and metadata.
// It imports the standard library only, so that a write service that
// checks an answer's code needs nothing else; the transports map the codes
// to their own (ledgerstatus to gRPC statuses, httpguard to HTTP).
package errcode

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Code is the stable, typed code of an error. Its numbers equal those of
// idemledger.v1.ErrorCode on the wire.
type Code int32

// The codes of the taxonomy (docs/contract.md, "Errors").
const (
	Unspecified      Code = 0
	RateLimited      Code = 1
	Unavailable      Code = 2
	UpstreamTimeout  Code = 3
	InProgress       Code = 4
	Contention       Code = 5
	ValidationFailed Code = 6
	KeyMissing       Code = 7
	KeyInvalid       Code = 8
	KeyReused        Code = 9
	LeaseLost        Code = 10
	RetryTooLate     Code = 11
	OutcomeTooLarge  Code = 12
	NotFound         Code = 13
	Unauthenticated  Code = 14
	PermissionDenied Code = 15
	Internal         Code = 16
	OutcomeUnknown   Code = 17
	KeyExpired       Code = 18
)

// codeTable is the taxonomy: each code's name and whether it is
// retryable. Tests pin it to docs/contract.md's table.
var codeTable = [...]struct {
	name      string
	retryable bool
}{
	Unspecified:      {"UNSPECIFIED", false},
	RateLimited:      {"RATE_LIMITED", true},
	Unavailable:      {"UNAVAILABLE", true},
	UpstreamTimeout:  {"UPSTREAM_TIMEOUT", true},
	InProgress:       {"IN_PROGRESS", true},
	Contention:       {"CONTENTION", true},
	ValidationFailed: {"VALIDATION_FAILED", false},
	KeyMissing:       {"KEY_MISSING", false},
	KeyInvalid:       {"KEY_INVALID", false},
	KeyReused:        {"KEY_REUSED", false},
	LeaseLost:        {"LEASE_LOST", false},
	RetryTooLate:     {"RETRY_TOO_LATE", false},
	OutcomeTooLarge:  {"OUTCOME_TOO_LARGE", false},
	NotFound:         {"NOT_FOUND", false},
	Unauthenticated:  {"UNAUTHENTICATED", false},
	PermissionDenied: {"PERMISSION_DENIED", false},
	Internal:         {"INTERNAL", false},
	OutcomeUnknown:   {"OUTCOME_UNKNOWN", false},
	KeyExpired:       {"KEY_EXPIRED", false},
}

// Codes returns every code of the taxonomy, Unspecified excluded.
func Codes() []Code {
	cs := make([]Code, 0, len(codeTable)-1)
	for c := range codeTable {
		if c != int(Unspecified) {
			cs = append(cs, Code(c))
		}
	}
	return cs
}

// Known reports whether c is a code of the taxonomy.
func (c Code) Known() bool { return c > Unspecified && int(c) < len(codeTable) }

// String returns the code's name as docs/contract.md spells it, such as
// "KEY_REUSED".
func (c Code) String() string {
	if c.Known() || c == Unspecified {
		return codeTable[c].name
	}
	return fmt.Sprintf("Code(%d)", int32(c))
}

// Retryable reports whether a request that failed with c may be sent again
// with the same key.
func (c Code) Retryable() bool { return c.Known() && codeTable[c].retryable }

// Error is the one typed error of the ledger and its adapters. Message is
// safe to show to callers; Err, the cause, is not and never leaves the
// process.
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
// errors.Is(err, &errcode.Error{Code: errcode.KeyReused}) works.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Retryable reports whether the request may be sent again with the same key.
func (e *Error) Retryable() bool { return e.Code.Retryable() }

// Of classifies any error. It returns Unspecified for nil, the code of an
// *Error in the chain, UPSTREAM_TIMEOUT for context errors (the outcome is
// unknown: retry with the same key), and INTERNAL for anything else.
func Of(err error) Code {
	if err == nil {
		return Unspecified
	}
	var e *Error
	if errors.As(err, &e) && e.Code.Known() {
		return e.Code
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return UpstreamTimeout
	}
	return Internal
}

// As returns the *Error in err's chain or, for a foreign error, an *Error
// classified by Of with a generic message and err as its cause. It
// returns nil for nil.
func As(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) && e.Code.Known() {
		return e
	}
	code := Of(err)
	msg := "internal error"
	if code == UpstreamTimeout {
		msg = "deadline exceeded or call canceled"
	}
	return Wrap(code, err, msg)
}
