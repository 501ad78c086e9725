package main_test

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemledger/idemledger/server"
)

// TestPprofIsForAdmins: /debug/pprof/ on the admin listener answers an
// admin principal's token, refuses a write service's (403) and no token
// (401), and a refusal is audited.
func TestPprofIsForAdmins(t *testing.T) {
	t.Parallel() // its own process and directory
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ops-secret")+" _admin ops-alice\n"+server.HashToken("billing-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	p.waitServing(t, p.dial(t))
	get := func(path, token string) (int, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+p.admin+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline"} {
		if status, _ := get(path, ""); status != http.StatusUnauthorized {
			t.Errorf("%s without a token: %d, want 401", path, status)
		}
		if status, _ := get(path, "billing-secret"); status != http.StatusForbidden {
			t.Errorf("%s with a write service's token: %d, want 403", path, status)
		}
		if status, body := get(path, "ops-secret"); status != http.StatusOK || body == "" {
			t.Errorf("%s with an admin's token: %d", path, status)
		}
	}
	if status, body := get("/debug/pprof/", "ops-secret"); status != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("the index: %d %q", status, body)
	}
	if logs := p.logs(); !strings.Contains(logs, "admin request refused") || !strings.Contains(logs, "a write service's credentials") {
		t.Fatalf("the refusals are not audited:\n%s", logs)
	}
}
