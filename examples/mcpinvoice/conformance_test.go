package mcpinvoice_test

import (
	"strings"
	"testing"

	"github.com/idemledger/idemledger/internal/nodetest"
)

// TestConformance runs the official MCP conformance suite against the
// invoice tool server (the Go SDK with mcpguard). Every scenario that
// applies to it passes: those of the protocol (initialize, ping, logging
// level, listing, several streams, resumption, DNS-rebinding protection).
// The rest call the suite's fixtures, which a server of invoices does not
// have: tools, prompts and resources named test_* and test://, and a
// completion of a fixture prompt.
func TestConformance(t *testing.T) {
	url, _ := serve(t)
	applies := map[string]bool{
		"server-initialize": true, "logging-set-level": true, "ping": true, "tools-list": true,
		"server-sse-polling": true, "server-sse-multiple-streams": true, "resources-list": true,
		"prompts-list": true, "dns-rebinding-protection": true,
	}
	for name, s := range nodetest.Conformance(t, nodetest.Suite2025, url) {
		fixture := strings.HasPrefix(name, "tools-call-") || strings.HasPrefix(name, "prompts-get-") ||
			strings.HasPrefix(name, "elicitation-") || strings.HasPrefix(name, "resources-") && name != "resources-list" ||
			name == "json-schema-2020-12" || name == "completion-complete"
		switch {
		case applies[name] && s.Failed > 0:
			t.Errorf("%s: %d checks failed", name, s.Failed)
		case !applies[name] && !fixture:
			t.Errorf("%s is a scenario this test does not sort (%+v)", name, s)
		}
	}
}
