package mcpinvoice_test

import (
	"strings"
	"testing"

	"github.com/idemledger/idemledger/internal/nodetest"
)

// TestConformance runs the official MCP conformance suite against the
// invoice tool server (the Go SDK with mcpguard), both versions: 0.1.16
// (the 2025 revisions) and 0.2.0 (2026-07-28 beside them). Every scenario
// that applies to it passes: those of the protocol (initialize, sessions,
// ping, logging level, listing, several streams, DNS-rebinding
// protection; and of 2026-07-28, caching hints, the headers bound to the
// body, a resource not found, an input_required round on a method that
// has none). The rest call the suite's fixtures, which a server of
// invoices does not have: tools, prompts and resources named test_* and
// test://, a completion of a fixture prompt, the stateless diagnostics'
// tools, a tool with an x-mcp-header argument, the tasks extension.
func TestConformance(t *testing.T) {
	url, _ := serve(t)
	applies := map[string]bool{
		"server-initialize": true, "server-session-lifecycle": true, "logging-set-level": true, "ping": true, "tools-list": true,
		"server-sse-polling": true, "server-sse-multiple-streams": true, "resources-list": true,
		"prompts-list": true, "dns-rebinding-protection": true,
		"caching": true, "http-header-validation": true, "sep-2164-resource-not-found": true,
		"input-required-result-unsupported-methods": true, "input-required-result-missing-input-response": true,
		"input-required-result-ignore-extra-params": true, "input-required-result-validate-input": true,
	}
	fixture := func(name string) bool {
		for _, p := range []string{"tools-call-", "prompts-get-", "elicitation-", "resources-", "input-required-result-", "tasks-", "sep-2640-"} {
			if strings.HasPrefix(name, p) && name != "resources-list" {
				return true
			}
		}
		return name == "json-schema-2020-12" || name == "completion-complete" || name == "server-stateless" ||
			name == "http-custom-header-server-validation"
	}
	for _, suite := range []nodetest.Suite{nodetest.Suite2025, nodetest.Suite2026} {
		t.Run(suite.Package, func(t *testing.T) {
			for name, s := range nodetest.Conformance(t, suite, url) {
				switch {
				case applies[name] && s.Failed > 0:
					t.Errorf("%s: %d checks failed", name, s.Failed)
				case !applies[name] && !fixture(name):
					t.Errorf("%s is a scenario this test does not sort (%+v)", name, s)
				}
			}
		})
	}
}
