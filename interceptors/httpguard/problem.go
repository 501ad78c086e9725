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
	"github.com/idemledger/idemledger/ledger/errcode"
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
func ProblemType(code errcode.Code) string {
	return "https://idemledger.io/problems/" + strings.ReplaceAll(strings.ToLower(code.String()), "_", "-")
}

// httpAnswers is how each code is answered over HTTP, as docs/contract.md
// maps them: its status and its problem's title. Every code has a row
// (TestEveryCodeHasAnHTTPAnswer).
var httpAnswers = map[errcode.Code]struct {
	status int
	title  string
}{
	errcode.KeyMissing:       {http.StatusBadRequest, "Idempotency-Key is missing"},
	errcode.KeyInvalid:       {http.StatusBadRequest, "Idempotency-Key is malformed"},
	errcode.ValidationFailed: {http.StatusBadRequest, "The request cannot be guarded"},
	errcode.KeyReused:        {http.StatusUnprocessableEntity, "Idempotency-Key is already used for another request"},
	errcode.InProgress:       {http.StatusConflict, "A request with this Idempotency-Key is being processed"},
	errcode.OutcomeUnknown:   {http.StatusConflict, "The outcome of an earlier request with this Idempotency-Key is unknown"},
	errcode.KeyExpired:       {http.StatusConflict, "The response of this Idempotency-Key is no longer kept"},
	errcode.RetryTooLate:     {http.StatusConflict, "This request is too old to be retried"},
	errcode.OutcomeTooLarge:  {http.StatusConflict, "The response was too large to keep"}, // the request ran; its answer was not kept
	errcode.RateLimited:      {http.StatusTooManyRequests, "Too many requests"},
	errcode.Unavailable:      {http.StatusServiceUnavailable, "The request cannot be served now"}, // the detail says whose fault it was
	errcode.UpstreamTimeout:  {http.StatusGatewayTimeout, "The request ended before the idempotency ledger answered"},
	errcode.PermissionDenied: {http.StatusForbidden, "The request's tenant is not one this service may write for"},
	errcode.Contention:       {http.StatusServiceUnavailable, "The idempotency ledger is busy with this key"}, // retryable: its Retry-After says when
	errcode.LeaseLost:        {http.StatusInternalServerError, "Internal error"},
	errcode.NotFound:         {http.StatusInternalServerError, "Internal error"},
	errcode.Unauthenticated:  {http.StatusInternalServerError, "Internal error"}, // the service's own credentials: the caller cannot mend them
	errcode.Internal:         {http.StatusInternalServerError, "Internal error"},
	errcode.Unspecified:      {http.StatusInternalServerError, "Internal error"},
}

// httpStatus is the HTTP status of a ledger or guard error: its code's,
// and 409 for another error that says its write ran.
func httpStatus(le *errcode.Error) int {
	a, ok := httpAnswers[le.Code]
	if (!ok || a.status == http.StatusInternalServerError) && le.Applied() {
		return http.StatusConflict
	}
	if !ok {
		return http.StatusInternalServerError
	}
	return a.status
}

// writeProblem answers err as a problem. A body over the limit is 413.
func writeProblem(w http.ResponseWriter, err error) {
	le, p := problemOf(err)
	b, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	if le.Retryable() && le.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(le.RetryAfter.Seconds())), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(b)
}

// problemOf is err as the ledger's error and as a problem.
func problemOf(err error) (*errcode.Error, Problem) {
	var big *tooLarge
	if errors.As(err, &big) {
		err = errcode.Errorf(errcode.ValidationFailed, "%s", big.Error())
	}
	le := ledgerstatus.FromError(err)
	p := Problem{
		Type: ProblemType(le.Code), Title: httpAnswers[le.Code].title, Status: httpStatus(le), Detail: le.Message,
		Code: le.Code.String(), Retryable: le.Retryable(), RetryAfterMS: le.RetryAfter.Milliseconds(),
	}
	if big != nil {
		p.Status = http.StatusRequestEntityTooLarge
	}
	if p.Title == "" {
		p.Title = "Internal error"
	}
	return le, p
}

// Stripe's headers, on a Stripe route (Route.Stripe).
const (
	stripeReplayedHeader    = "Idempotent-Replayed" // "true" on a replay, beside ReplayedHeader
	stripeShouldRetryHeader = "Stripe-Should-Retry" // whether a Stripe SDK should retry the answer
	stripeRequestIDHeader   = "Request-Id"          // the handler's request id, stored and replayed
)

// stripeError is the error object of a Stripe-shaped API
// (https://docs.stripe.com/api/errors), as a Stripe route answers a
// permanent error of the guard: {"error": {...}}.
type stripeError struct {
	Type    string `json:"type"`    // idempotency_error, invalid_request_error or api_error
	Code    string `json:"code"`    // the ledger's code, lowercased: key_reused
	Message string `json:"message"` // the problem's detail
	DocURL  string `json:"doc_url"` // the problem's type URI
}

// writeStripeError answers err on a Stripe route: with Stripe-Should-Retry,
// and a Stripe error object where err is permanent. A retryable err keeps
// its problem body: a Stripe SDK never retries a Stripe error object (bar a
// 429 lock_timeout), whatever Stripe-Should-Retry says, and retries any
// other body the header says to.
func writeStripeError(w http.ResponseWriter, err error) {
	le, p := problemOf(err)
	if le.Retryable() {
		w.Header().Set(stripeShouldRetryHeader, "true")
		writeProblem(w, err)
		return
	}
	w.Header().Set(stripeShouldRetryHeader, "false")
	e := stripeError{Type: "invalid_request_error", Code: strings.ToLower(p.Code), Message: p.Detail, DocURL: p.Type}
	switch le.Code {
	case errcode.KeyReused:
		e.Type, p.Status = "idempotency_error", http.StatusBadRequest // as Stripe answers a reused key
	case errcode.KeyExpired, errcode.RetryTooLate, errcode.OutcomeUnknown:
		e.Type = "idempotency_error"
	case errcode.KeyMissing, errcode.KeyInvalid, errcode.ValidationFailed:
	default:
		e.Type = "api_error"
	}
	b, _ := json.Marshal(struct {
		Error stripeError `json:"error"`
	}{e})
	w.Header().Set("Content-Type", "application/json")
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
	return errcode.Errorf(errcode.Internal, "the key holds an outcome of another kind")
}

func anyOf(b []byte) *anypb.Any { return &anypb.Any{TypeUrl: responseTypeURL, Value: b} }
