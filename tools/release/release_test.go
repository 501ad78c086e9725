package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReleaseServesAConsumer runs the README's Install section as a user
// would, in a clone of the repository: the first block installs the
// commands from the clone; the second cuts v0.1.0 with make release,
// offline, pushing nothing, into a file module proxy, and a fresh write
// service's module (no replace directive) gets the gRPC, HTTP, MCP and
// connect-go adapters, idemclient and the fence at v0.1.0 from it, builds
// a program that uses them, and go install installs ledgerd, idemproxy and
// idemctl at v0.1.0, whose --version says so. The clone's own branch is
// left as it was.
func TestReleaseServesAConsumer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the commands from a module proxy")
	}
	top, err := git(".", "rev-parse", "--show-toplevel")
	if err != nil {
		t.Fatal(err)
	}
	fromClone, fromRelease := installBlocks(t, filepath.Join(strings.TrimSpace(top), "README.md"))
	tmp := t.TempDir()
	clone := filepath.Join(tmp, "idemledger")
	if _, err := git(tmp, "clone", "-q", strings.TrimSpace(top), clone); err != nil {
		t.Fatal(err)
	}
	before, err := git(clone, "rev-parse", "HEAD")
	if err != nil {
		t.Fatal(err)
	}
	upstream, err := goEnv("GOPROXY")
	if err != nil {
		t.Fatal(err)
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		t.Fatal(err)
	}
	buildCache, err := goEnv("GOCACHE")
	if err != nil {
		t.Fatal(err)
	}
	sh := func(dir, script string, env []string) string {
		t.Helper()
		cmd := exec.Command("bash", "-c", "set -euo pipefail\n"+script)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s\n%v\n%s", script, err, out)
		}
		return string(out)
	}

	// From a clone: in the clone's workspace, as a user's shell would be.
	cloneBin := filepath.Join(tmp, "clone-bin")
	sh(clone, fromClone, append(os.Environ(), "GOBIN="+cloneBin, "GOFLAGS=-modcacherw", "GOWORK="))
	for _, cmd := range []string{"ledgerd", "idemproxy", "idemctl"} {
		if _, err := os.Stat(filepath.Join(cloneBin, cmd)); err != nil {
			t.Errorf("the README's install from a clone: %v", err)
		}
	}

	// From a release.
	consumer := filepath.Join(tmp, "my-service")
	if err := os.MkdirAll(consumer, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"go.mod": "module example.com/consumer\n\ngo 1.26.0\n",
		"main.go": `package main

import (
	"fmt"

	"github.com/idemledger/idemledger/interceptors/connectguard"
	"github.com/idemledger/idemledger/interceptors/fence"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/interceptors/idemclient"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

func main() {
	fmt.Println(grpcguard.UnaryServerInterceptor != nil, httpguard.New != nil, mcpguard.New != nil, connectguard.New != nil, idemclient.WithKey != nil, fence.New != nil)
}
`,
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(consumer, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(tmp, "bin")
	env := append(os.Environ(), "HOME="+tmp, "GOCACHE="+buildCache, "GOWORK=off", "GOFLAGS=-modcacherw", "GOBIN="+bin,
		// A module cache of the consumer's own, so that every idemledger
		// module comes from the release's proxy; the others come from
		// this machine's cache where it has them.
		"GOMODCACHE="+filepath.Join(tmp, "modcache"),
		"GOPROXY=file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download"))+","+upstream)
	sh(tmp, fromRelease, env)

	tags, err := git(clone, "tag", "--list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"v0.1.0", "interceptors/mcpguard/v0.1.0", "interceptors/connectguard/v0.1.0", "interceptors/fence/v0.1.0", "ledger/pebble/v0.1.0", "cmd/ledgerd/v0.1.0"} {
		if !contains(strings.Fields(tags), want) {
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
	if out := sh(consumer, "go run .", env); strings.TrimSpace(out) != "true true true true true true" {
		t.Fatalf("the consumer printed %q", out)
	}
	if mf, err := os.ReadFile(filepath.Join(consumer, "go.mod")); err != nil || strings.Contains(string(mf), "replace") {
		t.Fatalf("the consumer's go.mod:\n%s%v", mf, err)
	}
	for _, cmd := range []string{"ledgerd", "idemproxy", "idemctl"} {
		if out := sh(tmp, filepath.Join(bin, cmd)+" --version", env); !strings.Contains(out, "v0.1.0") {
			t.Errorf("%s --version from go install @v0.1.0 printed %q", cmd, out)
		}
	}
}

// installBlocks returns the two sh blocks of the README's Install section:
// from a clone, and from a release.
func installBlocks(t *testing.T, readme string) (fromClone, fromRelease string) {
	t.Helper()
	b, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	section := string(b)
	if i := strings.Index(section, "\n## Install\n"); i >= 0 {
		section = section[i+1:]
	}
	if i := strings.Index(section[1:], "\n## "); i >= 0 {
		section = section[:i+1]
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 2 {
		t.Fatalf("the README's Install has %d sh blocks, want 2: from a clone, from a release", len(blocks))
	}
	return blocks[0][1], blocks[1][1]
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
