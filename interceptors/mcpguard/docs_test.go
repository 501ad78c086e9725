package mcpguard_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/errcode"
)

// TestDocsShowTheAdvice: docs/mcp.md shows the line a model reads for
// each retryable and permanent code, as Advice writes it.
func TestDocsShowTheAdvice(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(doc), "`", "")
	for _, le := range []*errcode.Error{
		{Code: errcode.InProgress, RetryAfter: 2 * time.Second},
		{Code: errcode.Unavailable, Message: "the idempotency ledger cannot be reached", RetryAfter: time.Second},
		{Code: errcode.KeyReused},
		{Code: errcode.KeyMissing},
		{Code: errcode.KeyInvalid},
		{Code: errcode.OutcomeUnknown},
		{Code: errcode.KeyExpired},
		{Code: errcode.RetryTooLate},
	} {
		if !strings.Contains(text, mcpguard.Advice(le)) {
			t.Errorf("docs/mcp.md lacks the %s line %q", le.Code, mcpguard.Advice(le))
		}
	}
}
