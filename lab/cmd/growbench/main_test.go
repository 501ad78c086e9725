package main

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestGrowthSteps: a small run writes every step's row, the sweep handles
// the first half's records, and the store reopens.
func TestGrowthSteps(t *testing.T) {
	var out strings.Builder
	cfg := config{records: 2000, writers: 2, fillers: 8, outcome: 100, measure: 100 * time.Millisecond}
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	rows := out.String()
	for _, step := range []string{"empty", "first half written", "second half written", "during the sweep", "after the sweep", "reopened in"} {
		if !strings.Contains(rows, "| "+step) {
			t.Errorf("no %q row:\n%s", step, rows)
		}
	}
	// Each of the first half's 1,000 records is shrunk, then deleted: at
	// least 1,000 steps.
	m := regexp.MustCompile(`during the sweep \((\d+) steps`).FindStringSubmatch(rows)
	if m == nil || len(m[1]) < 4 {
		t.Errorf("the sweep handled too little:\n%s", rows)
	}
}
