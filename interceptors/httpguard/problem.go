package httpguard

import (
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/anypb"

	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
)

// Problem is an RFC 9457 problem detail, with the ledger's typed fields.
type Problem struct {
	Type         string `json:"type"`
	Title        string `json:"title"`
	Status       int    `json:"status"`
	Detail       string `json:"detail"`
	Code         string `json:"code"`
	Retryable    bool   `json:"retryable"`
	RetryAfterMS int64  `json:"retry_after_ms"`
}

// ProblemType is the type URI of a code's problem.
func ProblemType(code ledger.Code) string {
	return "https://idemledger.io/problems/" + strings.ReplaceAll(strings.ToLower(code.String()), "_", "-")
}

// Status is the HTTP status of a ledger or guard error, as docs/contract.md maps them.
func Status(le *ledger.Error) int {
	switch le.Code {
	case ledger.CodeKeyMissing, ledger.CodeKeyInvalid, ledger.CodeValidationFailed:
		return http.StatusBadRequest
	case ledger.CodeKeyReused:
		return http.StatusUnprocessableEntity
	case ledger.CodeInProgress, ledger.CodeOutcomeUnknown, ledger.CodeKeyExpired, ledger.CodeRetryTooLate:
		return http.StatusConflict
	case ledger.CodeRateLimited:
		return http.StatusTooManyRequests
	case ledger.CodeUnavailable:
		return http.StatusServiceUnavailable
	case ledger.CodeUpstreamTimeout:
		return http.StatusGatewayTimeout
	case ledger.CodeOutcomeTooLarge:
		return http.StatusConflict // the request ran; its answer was not kept
	}
	if le.Metadata["applied"] == "true" {
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

var titles = map[ledger.Code]string{
	ledger.CodeKeyMissing:       "Idempotency-Key is missing",
	ledger.CodeKeyInvalid:       "Idempotency-Key is malformed",
	ledger.CodeKeyReused:        "Idempotency-Key is already used for another request",
	ledger.CodeInProgress:       "A request with this Idempotency-Key is being processed",
	ledger.CodeOutcomeUnknown:   "The outcome of an earlier request with this Idempotency-Key is unknown",
	ledger.CodeKeyExpired:       "The response of this Idempotency-Key is no longer kept",
	ledger.CodeRetryTooLate:     "This request is too old to be retried",
	ledger.CodeUnavailable:      "The idempotency ledger cannot be reached",
	ledger.CodeRateLimited:      "Too many requests",
	ledger.CodeValidationFailed: "The request cannot be guarded",
	ledger.CodeOutcomeTooLarge:  "The response was too large to keep",
	ledger.CodeUpstreamTimeout:  "The request ended before the idempotency ledger answered",
}

// writeProblem answers err as a problem. A body over the limit is 413.
func writeProblem(w http.ResponseWriter, err error) {
	var big *tooLarge
	if errors.As(err, &big) {
		err = ledger.Errorf(ledger.CodeValidationFailed, "%s", big.Error())
	}
	le := ledgerstatus.FromError(err)
	p := Problem{
		Type: ProblemType(le.Code), Title: titles[le.Code], Status: Status(le), Detail: le.Message,
		Code: le.Code.String(), Retryable: le.Retryable(), RetryAfterMS: le.RetryAfter.Milliseconds(),
	}
	if big != nil {
		p.Status = http.StatusRequestEntityTooLarge
	}
	if p.Title == "" {
		p.Title = "Internal error"
	}
	b, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	if le.Retryable() && le.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(le.RetryAfter.Seconds())), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}

// storedError is the error a stored non-response outcome says: the small
// error the guard stores when an answer could not be kept.
func storedError(out guard.Outcome) error {
	if out.Status != nil {
		if le := ledgerstatus.Decode(out.Status); le != nil {
			return le
		}
	}
	return ledger.Errorf(ledger.CodeInternal, "the key holds an outcome of another kind")
}

func anyOf(b []byte) *anypb.Any { return &anypb.Any{TypeUrl: ResponseTypeURL, Value: b} }
