package main

import (
	"slices"
	"testing"
)

// TestDecisionRate: a minute's decisions are the counter's growth since
// the sample before; the hour keeps the latest 60 minutes.
func TestDecisionRate(t *testing.T) {
	var r decisionRate
	r.sample(100) // the first sample is the baseline
	if got := r.lastHour(); len(got) != 60 || slices.Max(got) != 0 {
		t.Fatalf("before a minute: %v", got)
	}
	r.sample(105)
	r.sample(112)
	got := r.lastHour()
	if got[58] != 5 || got[59] != 7 {
		t.Fatalf("the last two minutes: %v", got[58:])
	}
	for i := range 70 {
		r.sample(float64(200 + i))
	}
	if got := r.lastHour(); got[0] != 1 || got[59] != 1 || len(got) != 60 {
		t.Fatalf("after 72 minutes: %v", got)
	}
}
