package httpguard

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// TestEveryCodeHasAnHTTPAnswer: each code of the taxonomy has its row in
// the one table of HTTP answers, with a status and a title; a retryable
// code is never answered 500 (a client would not retry it), and another
// error that says its write ran is 409.
func TestEveryCodeHasAnHTTPAnswer(t *testing.T) {
	t.Parallel()
	for c := errcode.Code(0); !strings.HasPrefix(c.String(), "Code("); c++ {
		a, ok := httpAnswers[c]
		if !ok || a.status == 0 || a.title == "" {
			t.Errorf("%s has no HTTP answer: %+v", c, a)
			continue
		}
		if c.Retryable() && a.status == http.StatusInternalServerError {
			t.Errorf("%s is retryable but answered 500", c)
		}
		if got := httpStatus(&errcode.Error{Code: c}); got != a.status {
			t.Errorf("%s answers %d, its row says %d", c, got, a.status)
		}
	}
	if got := httpStatus(&errcode.Error{Code: errcode.Internal, Metadata: map[string]string{errcode.MetaApplied: "true"}}); got != http.StatusConflict {
		t.Errorf("an INTERNAL whose write ran answers %d, want 409", got)
	}
}
