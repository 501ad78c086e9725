package mcpguard_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger"
)

// TestDocsShowTheAdvice: docs/mcp.md shows the line a model reads for
// each retryable and permanent code, as Advice writes it.
func TestDocsShowTheAdvice(t *testing.T) {
	doc, err := os.ReadFile("../../docs/mcp.md")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(doc), "`", "")
	for _, le := range []*ledger.Error{
		{Code: ledger.CodeInProgress, RetryAfter: 2 * time.Second},
		{Code: ledger.CodeUnavailable, RetryAfter: time.Second},
		{Code: ledger.CodeKeyReused},
		{Code: ledger.CodeKeyMissing},
		{Code: ledger.CodeKeyInvalid},
		{Code: ledger.CodeOutcomeUnknown},
		{Code: ledger.CodeKeyExpired},
		{Code: ledger.CodeRetryTooLate},
	} {
		if !strings.Contains(text, mcpguard.Advice(le)) {
			t.Errorf("docs/mcp.md lacks the %s line %q", le.Code, mcpguard.Advice(le))
		}
	}
}
