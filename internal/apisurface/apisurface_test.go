// Package apisurface holds the test that keeps what a write service must
// learn small: the exported names of the packages it imports for one
// transport, and the names its example uses.
package apisurface

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/idemledger/idemledger"

// Limits: the packages a write service imports for one transport export
// at most maxImported names in all, and its example uses at most
// maxLearned of them.
// (155: the keys and clients of HTTP added the Stripe route option and
// SEP-3182's capability, Handler and Transport. 158: MCP's 2026-07-28 revision added a
// tool's host call ids, a call's key source, the reason a run gives for
// an unknown outcome, and mcpguard's ServeJSON for a guard outside the
// server's process. 161: the fence added a policy's fence table, a
// call's encoding of what a run hands its fence, and a result's Fenced.
// 166: errcode's named metadata keys (cause, applied) and their two
// predicates, where twelve sites had spelled them as strings.)
const (
	maxImported = 166
	maxLearned  = 60
)

// transports are, for each transport, the packages a write service
// imports (generated code aside) and the example that shows it.
var transports = map[string]struct {
	packages []string
	example  string
}{
	"gRPC": {[]string{"interceptors/guard", "interceptors/grpcguard", "ledger/errcode", "ledger/ledgerclient"}, "examples/invoice"},
	"HTTP": {[]string{"interceptors/guard", "interceptors/httpguard", "ledger/errcode", "ledger/ledgerclient"}, "examples/httpinvoice"},
	"MCP":  {[]string{"interceptors/guard", "interceptors/mcpguard", "ledger/errcode", "ledger/ledgerclient"}, "examples/mcpinvoice"},
}

// TestWriteServiceSurface counts, for each transport, the exported names
// of the packages a write service imports (constants, variables,
// functions, types, their methods and their exported struct fields) and
// the names of those packages its example uses (qualified identifiers and
// the fields named in composite literals of their types).
func TestWriteServiceSurface(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for name, tr := range transports {
		imported := 0
		for _, p := range tr.packages {
			n := exported(t, filepath.Join(root, p))
			t.Logf("%s: %s exports %d names", name, p, n)
			imported += n
		}
		learned := used(t, filepath.Join(root, tr.example), tr.packages)
		t.Logf("%s: %d names in all; the example uses %d: %s", name, imported, len(learned), strings.Join(learned, " "))
		if imported > maxImported {
			t.Errorf("%s: the packages a write service imports export %d names, more than %d", name, imported, maxImported)
		}
		if len(learned) > maxLearned {
			t.Errorf("%s: the example uses %d names, more than %d", name, len(learned), maxLearned)
		}
		if len(learned) == 0 {
			t.Errorf("%s: the example uses none of %v: the count is broken", name, tr.packages)
		}
	}
}

// exported counts the exported names of the package in dir.
func exported(t *testing.T, dir string) int {
	t.Helper()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if name := e.Name(); strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") {
			f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	d, err := doc.NewFromFiles(fset, files, module)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			n += len(v.Names)
		}
	}
	values(d.Consts)
	values(d.Vars)
	n += len(d.Funcs)
	for _, typ := range d.Types {
		n += 1 + len(typ.Funcs) + len(typ.Methods)
		values(typ.Consts)
		values(typ.Vars)
		if st, ok := typ.Decl.Specs[0].(*ast.TypeSpec).Type.(*ast.StructType); ok {
			for _, f := range st.Fields.List {
				for _, fn := range f.Names {
					if fn.IsExported() {
						n++
					}
				}
			}
		}
	}
	return n
}

// used returns the names of packages that the Go files in dir and below
// use (its Example included, its other tests not), sorted.
func used(t *testing.T, dir string, packages []string) []string {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") {
			return err
		}
		if strings.HasSuffix(path, "_test.go") && filepath.Base(path) != "example_test.go" {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ours := map[string]string{} // the file's name of a package → its path
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			rel := strings.TrimPrefix(p, module+"/")
			if !slices.Contains(packages, rel) {
				continue
			}
			local := filepath.Base(rel)
			if imp.Name != nil {
				local = imp.Name.Name
			}
			ours[local] = filepath.Base(rel)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && ours[id.Name] != "" {
					names[ours[id.Name]+"."+n.Sel.Name] = true
				}
			case *ast.CompositeLit:
				sel, ok := n.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				id, ok := sel.X.(*ast.Ident)
				if !ok || ours[id.Name] == "" {
					return true
				}
				for _, elt := range n.Elts {
					if kv, ok := elt.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok {
							names[ours[id.Name]+"."+sel.Sel.Name+"."+k.Name] = true
						}
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}
