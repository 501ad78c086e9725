package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseServesAConsumer cuts v0.1.0 in a clone of the repository,
// offline, pushing nothing, and serves the tagged modules from a file
// module proxy. A fresh consumer module, with no replace directive, gets
// the gRPC, HTTP and MCP adapters and idemclient at v0.1.0 and builds a
// program that uses them; go install installs ledgerd, idemproxy and
// idemctl at v0.1.0, and ledgerd --version says v0.1.0. The clone's own
// branch is left as it was.
func TestReleaseServesAConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands from a module proxy")
	}
	top, err := git(".", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	clone := filepath.Join(tmp, "clone")
	if _, err := git(tmp, "clone", "-q", strings.TrimSpace(top), clone); err != nil {
		t.Fatal(err)
	}
	before, err := git(clone, "rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	proxy := filepath.Join(tmp, "proxy")
	tags, err := release(clone, "v0.1.0", proxy)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"v0.1.0", "interceptors/mcpguard/v0.1.0", "interceptors/connectguard/v0.1.0", "ledger/pebble/v0.1.0", "cmd/ledgerd/v0.1.0"} {
		if !contains(tags, want) {
			t.Errorf("no tag %s among %v", want, tags)
		}
	}
	if after, _ := git(clone, "rev-parse", "HEAD"); after != before {
		t.Fatalf("the release moved the branch: %s, then %s", before, after)
	}
	if out, _ := git(clone, "status", "--porcelain"); out != "" {
		t.Fatalf("the release left the work tree changed:\n%s", out)
	}
	if mf, _ := git(clone, "show", "cmd/ledgerd/v0.1.0:cmd/ledgerd/go.mod"); strings.Contains(mf, "replace github.com/idemledger") || !strings.Contains(mf, "github.com/idemledger/idemledger v0.1.0") {
		t.Fatalf("cmd/ledgerd's go.mod at its tag:\n%s", mf)
	}

	upstream, err := goEnv("GOPROXY")
	if err != nil {
		t.Fatal(err)
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(tmp, "bin")
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -modcacherw", "GOBIN="+bin,
		// A module cache of the consumer's own, so that every idemledger
		// module comes from the proxy; the others come from this machine's
		// cache where it has them.
		"GOMODCACHE="+filepath.Join(tmp, "modcache"),
		"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download"))+","+upstream,
		"GONOSUMDB=github.com/idemledger/idemledger")
	run := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	consumer := filepath.Join(tmp, "consumer")
	if err := os.MkdirAll(consumer, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod": "module example.com/consumer\n\ngo 1.26.0\n",
		"main.go": `package main

import (
	"fmt"

	"github.com/idemledger/idemledger/interceptors/connectguard"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

func main() {
	fmt.Println(grpcguard.UnaryServerInterceptor != nil, httpguard.New != nil, mcpguard.New != nil, connectguard.New != nil, idemclient.WithKey != nil)
}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(consumer, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(consumer, "go", "get",
		"github.com/idemledger/idemledger/interceptors/grpcguard@v0.1.0",
		"github.com/idemledger/idemledger/interceptors/httpguard@v0.1.0",
		"github.com/idemledger/idemledger/interceptors/mcpguard@v0.1.0",
		"github.com/idemledger/idemledger/interceptors/connectguard@v0.1.0",
		"github.com/idemledger/idemledger/interceptors/idemclient@v0.1.0")
	if out := run(consumer, "go", "run", "."); strings.TrimSpace(out) != "true true true true true" {
		t.Fatalf("the consumer printed %q", out)
	}
	if mf, err := os.ReadFile(filepath.Join(consumer, "go.mod")); err != nil || strings.Contains(string(mf), "replace") {
		t.Fatalf("the consumer's go.mod:\n%s%v", mf, err)
	}
	for _, cmd := range []string{"ledgerd", "idemproxy", "idemctl"} {
		run(tmp, "go", "install", "github.com/idemledger/idemledger/cmd/"+cmd+"@v0.1.0")
		if out := run(tmp, filepath.Join(bin, cmd), "--version"); !strings.Contains(out, "v0.1.0") {
			t.Errorf("%s --version from go install @v0.1.0 printed %q", cmd, out)
		}
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
