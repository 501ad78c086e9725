// Package examples_test keeps the README honest: its snippet is the code of
// an Example function that compiles and runs.
package examples_test

import (
	"os"
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
