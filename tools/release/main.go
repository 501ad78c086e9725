// Command release cuts a release of every module in the repository: it
// sets each module's requirements on its siblings to the version, drops
// the replace directives that point at them, and tags each module in
// dependency order (v0.1.0, ledger/pebble/v0.1.0, …) on a release commit
// off the current branch. The branch itself is left as it is: development
// goes on through go.work and the replace directives.
//
//	go run ./tools/release -version v0.1.0 [-proxy DIR]
//
// With -proxy it also writes the released modules to DIR as a module
// proxy (GOPROXY=file://DIR) holds them, byte for byte what a public proxy
// builds from the tags. Push the tags it prints to publish.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

// toolsDir holds the repository's tools, which are not released.
const toolsDir = "tools/"

func main() {
	version := flag.String("version", "", "the version to release, vX.Y.Z")
	proxy := flag.String("proxy", "", "also write the released modules here, as a file module proxy")
	flag.Parse()
	repo, err := git(".", "rev-parse", "--show-toplevel")
	if err == nil {
		var tags []string
		tags, err = release(strings.TrimSpace(repo), *version, *proxy)
		if err == nil {
			fmt.Printf("tagged %s\npublish: git push origin %s\n", strings.Join(tags, " "), strings.Join(tags, " "))
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

// mod is one module of the repository.
type mod struct {
	dir  string // relative to the repository, "." for the root
	path string
	deps []string // the paths of the siblings it requires
}

// tag is the module's tag for version.
func (m mod) tag(version string) string {
	if m.dir == "." {
		return version
	}
	return m.dir + "/" + version
}

// release cuts version in repo and returns the tags it made.
func release(repo, version, proxy string) ([]string, error) {
	if !semver.IsValid(version) || semver.Canonical(version) != version || semver.Build(version) != "" {
		return nil, fmt.Errorf("-version %q is not a version vX.Y.Z", version)
	}
	if out, err := git(repo, "status", "--porcelain"); err != nil || out != "" {
		return nil, fmt.Errorf("the work tree is not clean: commit or stash first\n%s%v", out, errOrNil(err))
	}
	mods, err := modules(repo)
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		if out, _ := git(repo, "tag", "--list", m.tag(version)); out != "" {
			return nil, fmt.Errorf("tag %s exists already", m.tag(version))
		}
	}
	tmp, err := os.MkdirTemp("", "release")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// The tree to release: HEAD's files as git archive gives them, which is
	// what a module proxy zips from a tag.
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, err
	}
	if err := sh(repo, fmt.Sprintf("git archive --format=tar HEAD | tar -x -C %q", tree)); err != nil {
		return nil, err
	}
	if proxy == "" {
		proxy = filepath.Join(tmp, "proxy")
	}
	upstream, err := goEnv("GOPROXY")
	if err != nil {
		return nil, err
	}
	cache, err := goEnv("GOMODCACHE")
	if err != nil {
		return nil, err
	}
	when, err := git(repo, "show", "-s", "--format=%cI", "HEAD")
	if err != nil {
		return nil, err
	}
	at, err := time.Parse(time.RFC3339, strings.TrimSpace(when))
	if err != nil {
		return nil, err
	}
	paths, root := map[string]bool{}, ""
	for _, m := range mods {
		paths[m.path] = true
		if m.dir == "." {
			root = m.path
		}
	}
	for _, m := range mods {
		dir := filepath.Join(tree, m.dir)
		if len(m.deps) > 0 {
			if err := pin(filepath.Join(dir, "go.mod"), paths, version); err != nil {
				return nil, err
			}
			// The go.sum entries of the siblings at version, from the
			// modules released so far.
			tidy := exec.Command("go", "mod", "tidy")
			tidy.Dir = dir
			// A module cache of the release's own: this machine's may hold
			// another build of these modules at this version (an earlier
			// release test's), which would win over the proxy. The other
			// modules come from this machine's cache where it has them.
			tidy.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod -modcacherw",
				"GOMODCACHE="+filepath.Join(tmp, "modcache"),
				"GOPROXY=file://"+filepath.ToSlash(proxy)+",file://"+filepath.ToSlash(filepath.Join(cache, "cache", "download"))+","+upstream,
				"GONOSUMDB="+root) // not in the checksum database yet
			if out, err := tidy.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("go mod tidy in %s: %w\n%s", m.dir, err, out)
			}
		}
		if err := publish(proxy, module.Version{Path: m.path, Version: version}, dir, at); err != nil {
			return nil, fmt.Errorf("%s: %w", m.dir, err)
		}
	}
	return commitAndTag(repo, tree, mods, version)
}

// modules lists the repository's modules, tools excepted, each after the
// siblings it requires.
func modules(repo string) ([]mod, error) {
	out, err := git(repo, "ls-files", "*go.mod")
	if err != nil {
		return nil, err
	}
	byPath := map[string]*mod{}
	for _, f := range strings.Fields(out) {
		dir := filepath.Dir(f)
		if strings.HasPrefix(f, toolsDir) || filepath.Base(f) != "go.mod" {
			continue
		}
		data, err := os.ReadFile(filepath.Join(repo, f))
		if err != nil {
			return nil, err
		}
		mf, err := modfile.ParseLax(f, data, nil)
		if err != nil {
			return nil, err
		}
		byPath[mf.Module.Mod.Path] = &mod{dir: dir, path: mf.Module.Mod.Path}
		for _, r := range mf.Require {
			byPath[mf.Module.Mod.Path].deps = append(byPath[mf.Module.Mod.Path].deps, r.Mod.Path)
		}
	}
	for _, m := range byPath {
		var deps []string
		for _, d := range m.deps {
			if byPath[d] != nil {
				deps = append(deps, d)
			}
		}
		m.deps = deps
	}
	// Dependency order; among the ready, by path.
	var order []mod
	done := map[string]bool{}
	for len(order) < len(byPath) {
		var ready []string
		for p, m := range byPath {
			if done[p] {
				continue
			}
			ok := true
			for _, d := range m.deps {
				ok = ok && done[d]
			}
			if ok {
				ready = append(ready, p)
			}
		}
		if len(ready) == 0 {
			return nil, errors.New("the modules require each other in a cycle")
		}
		sort.Strings(ready)
		for _, p := range ready {
			done[p] = true
			order = append(order, *byPath[p])
		}
	}
	return order, nil
}

// pin sets the go.mod's requirements on the siblings to version and drops
// the replace directives that point at them.
func pin(path string, siblings map[string]bool, version string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	mf, err := modfile.Parse(path, data, nil)
	if err != nil {
		return err
	}
	for _, r := range mf.Require {
		if siblings[r.Mod.Path] {
			if err := mf.AddRequire(r.Mod.Path, version); err != nil {
				return err
			}
		}
	}
	for _, r := range mf.Replace {
		if siblings[r.Old.Path] {
			if err := mf.DropReplace(r.Old.Path, r.Old.Version); err != nil {
				return err
			}
		}
	}
	mf.Cleanup()
	out, err := mf.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// publish writes module m, from dir, to the file proxy: its .info, .mod
// and .zip, and its version in the list.
func publish(proxy string, m module.Version, dir string, at time.Time) error {
	escaped, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	v := filepath.Join(proxy, escaped, "@v")
	if err := os.MkdirAll(v, 0o755); err != nil {
		return err
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`+"\n", m.Version, at.UTC().Format(time.RFC3339))
	if err := os.WriteFile(filepath.Join(v, m.Version+".info"), []byte(info), 0o644); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(v, m.Version+".mod"), gomod, 0o644); err != nil {
		return err
	}
	z, err := os.Create(filepath.Join(v, m.Version+".zip"))
	if err != nil {
		return err
	}
	if err := errors.Join(zip.CreateFromDir(z, m, dir), z.Close()); err != nil {
		return err
	}
	list, err := os.OpenFile(filepath.Join(v, "list"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(list, m.Version)
	return errors.Join(err, list.Close())
}

// commitAndTag commits the released go.mod and go.sum files on a commit
// off HEAD, in a worktree of its own, and tags it for each module.
func commitAndTag(repo, tree string, mods []mod, version string) ([]string, error) {
	wt, err := os.MkdirTemp("", "release-worktree")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(wt)
	if _, err := git(repo, "worktree", "add", "--detach", wt, "HEAD"); err != nil {
		return nil, err
	}
	defer func() { _, _ = git(repo, "worktree", "remove", "--force", wt) }()
	for _, m := range mods {
		for _, f := range []string{"go.mod", "go.sum"} {
			b, err := os.ReadFile(filepath.Join(tree, m.dir, f))
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(wt, m.dir, f), b, 0o644); err != nil {
				return nil, err
			}
		}
	}
	if _, err := git(wt, "add", "-A"); err != nil {
		return nil, err
	}
	msg := "Release " + version + ": every module requires its siblings at " + version
	if _, err := git(wt, "-c", "user.name=idemledger release", "-c", "user.email=release@idemledger.invalid", "commit", "-q", "--allow-empty", "-m", msg); err != nil {
		return nil, err
	}
	var tags []string
	for _, m := range mods {
		t := m.tag(version)
		if _, err := git(wt, "-c", "user.name=idemledger release", "-c", "user.email=release@idemledger.invalid", "tag", "-a", t, "-m", m.path+" "+version); err != nil {
			return nil, err
		}
		tags = append(tags, t)
	}
	return tags, nil
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return string(out), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return string(out), fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

func sh(dir, script string) error {
	cmd := exec.Command("sh", "-c", script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", script, err, out)
	}
	return nil
}

func goEnv(name string) (string, error) {
	out, err := exec.Command("go", "env", name).Output()
	return strings.TrimSpace(string(out)), err
}

func errOrNil(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
