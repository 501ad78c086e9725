// Package examples_test keeps the README honest: its snippet is the code of
// an Example function that compiles and runs.
package examples_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSnippetIsExampleCode finds each of the README's Go snippets
// in the Example it shows, line for line.
func TestReadmeSnippetIsExampleCode(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for heading, file := range map[string]string{
		"## Protect a method":      "invoice/example_test.go",
		"## Protect an MCP tool":   "mcpinvoice/example_test.go",
		"## Protect an HTTP route": "httpinvoice/example_test.go",
	} {
		example, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		section := string(readme)
		i := strings.Index(section, heading)
		if i < 0 {
			t.Fatalf("the README has no %q", heading)
		}
		section = section[i:]
		m := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
		if m == nil {
			t.Fatalf("no Go snippet under the README's %q", heading)
		}
		// The example's body is indented by one tab.
		var body []string
		for _, line := range strings.Split(strings.TrimRight(m[1], "\n"), "\n") {
			if line == "" {
				body = append(body, "")
				continue
			}
			body = append(body, "\t"+line)
		}
		if !strings.Contains(string(example), strings.Join(body, "\n")+"\n") {
			t.Errorf("the README's snippet under %q is not the code of %s's Example:\n%s", heading, file, m[1])
		}
	}
}

// TestReadmeSnippetsCompileTogether puts every Go snippet of the README,
// in its order, into the one main function of one program, with what they
// take from the program around them, and builds it: a reader who pastes
// them one after another gets a program that compiles.
func TestReadmeSnippetsCompileTogether(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	snippets := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(snippets) < 4 {
		t.Fatalf("%d Go snippets in the README; want the gRPC, client, MCP and HTTP ones", len(snippets))
	}
	var main strings.Builder
	main.WriteString(`package main

import (
	"context"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	invoicev1 "github.com/idemledger/idemledger/examples/gen/invoice/v1"
	"github.com/idemledger/idemledger/examples/invoice"
	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/fence/fencepgx"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
	"github.com/idemledger/idemledger/interceptors/mcpguard"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// What the snippets take from the program around them.
var (
	addr                 = "127.0.0.1:8080"
	req                  = &invoicev1.CreateInvoiceRequest{}
	createInvoiceHandler = http.NotFoundHandler()
	pool                 *pgxpool.Pool
	inv                  = &invoicev1.Invoice{}
	resp                 = &invoicev1.CreateInvoiceResponse{}
)

func insertInvoice(context.Context, pgx.Tx, *invoicev1.Invoice) error { return nil }

type invoiceArgs struct {
	Customer string ` + "`json:\"customer\"`" + `
}

func createInvoiceTool(context.Context, *mcp.CallToolRequest, invoiceArgs) (*mcp.CallToolResult, map[string]any, error) {
	return nil, nil, nil
}

func main() {
	ctx := context.Background()
`)
	for _, s := range snippets {
		main.WriteString(s[1])
	}
	main.WriteString("\t_, _, _, _ = srv, server, mux, policy\n}\n")
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte(main.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// The program is built as a package of this module, where the imports
	// resolve, through an overlay: nothing is written into the tree.
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	overlay, err := json.Marshal(map[string]map[string]string{"Replace": {filepath.Join(here, "readmesnippets", "main.go"): src}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "overlay.json"), overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-overlay", filepath.Join(dir, "overlay.json"), "-o", os.DevNull, "./readmesnippets")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("the README's snippets, one after another in one main, do not compile: %v\n%s\n%s", err, out, main.String())
	}
}
