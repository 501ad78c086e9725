package main_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
)

// TestAuditPageAndFile: the console's audit page shows the admin's
// changes and refusals, its reads (list, get) only when asked, filtered by
// who, action and tenant; --audit-file gets every audit line alone, as
// JSON, and after a rotation and SIGHUP the next ones go to a new file.
func TestAuditPageAndFile(t *testing.T) {
	t.Parallel() // its own process and directory
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("ops-secret")+" _admin ops-alice\n"+server.HashToken("billing-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	auditFile := filepath.Join(dir, "audit.log")
	p := start(t, "--data-dir", filepath.Join(dir, "data"), "--tokens", tokens, "--audit-file", auditFile)
	p.waitServing(t, p.dial(t))
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Jar: jar}
	base := "http://" + p.admin + "/console/"
	get := func(path string) string {
		t.Helper()
		res, err := c.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	// A refused sign-in (a write service's token), then the admin's, and reads.
	for _, token := range []string{"billing-secret", "ops-secret"} {
		res, err := c.PostForm(base+"login", url.Values{"token": {token}})
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
	}
	for range 3 {
		get("records?namespace=billing&tenant=acme")
	}
	page := get("audit")
	if !strings.Contains(page, "console sign-in refused") || !strings.Contains(page, "<td>ops-alice</td><td>console sign-in</td>") || strings.Contains(page, "<td>list</td>") {
		t.Fatalf("the audit page without reads:\n%s", page)
	}
	if page = get("audit?reads=on"); strings.Count(page, "<td>list</td>") != 3 {
		t.Fatalf("the audit page with reads has %d lists:\n%s", strings.Count(page, "<td>list</td>"), page)
	}
	if page = get("audit?who=ops-alice&action=sign-in"); strings.Contains(page, "refused") || !strings.Contains(page, "console sign-in") {
		t.Fatalf("filtered by who and action:\n%s", page)
	}
	if page = get("audit?reads=on&tenant=globex"); strings.Contains(page, "<td>list</td>") {
		t.Fatalf("filtered by another tenant:\n%s", page)
	}

	lines := func(path string) []map[string]any {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var out []map[string]any
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("%s: %q is not JSON", path, sc.Text())
			}
			if m["audit"] != true {
				t.Fatalf("%s has a line that is no audit line: %s", path, sc.Text())
			}
			out = append(out, m)
		}
		return out
	}
	if got := lines(auditFile); len(got) < 5 {
		t.Fatalf("the audit file has %d lines, want the two sign-ins and three lists", len(got))
	}
	// A rotation: move the file aside, SIGHUP, and the next line starts a new one.
	if err := os.Rename(auditFile, auditFile+".1"); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		get("records?namespace=billing&tenant=acme") // an audited read, each try
		_, err := os.Stat(auditFile)
		return err == nil && len(lines(auditFile)) > 0
	}, "after SIGHUP the audit lines did not go to a new file")
}
