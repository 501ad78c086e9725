// Package examples_test keeps the README honest: its snippet is the code of
// an Example function that compiles and runs.
package examples_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeSnippetIsExampleCode finds the README's Go snippet under
// "Protect a method" in examples/invoice's Example, line for line.
func TestReadmeSnippetIsExampleCode(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("invoice/example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	if i := strings.Index(section, "## Protect a method"); i >= 0 {
		section = section[i:]
	}
	m := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("no Go snippet under the README's Protect a method")
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
		t.Fatalf("the README's snippet is not the code of examples/invoice's Example:\n%s", m[1])
	}
}
