package chaos_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/idemledger/idemledger/lab/chaos"
)

// TestDemoHasNoDuplicates runs the agent through every fault: each fault
// happens, every intent gets one invoice, and no intent has two.
func TestDemoHasNoDuplicates(t *testing.T) {
	defer goleak.VerifyNone(t)
	rep, err := chaos.Demo(t.Context(), chaos.DemoConfig{Intents: 150, Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Duplicates != 0 || rep.Mismatched != 0 || rep.Answered != rep.Intents || rep.Invoices != rep.Intents {
		t.Fatalf("report %+v: want every intent answered with one invoice", rep)
	}
	for name, n := range map[string]int64{
		"lost responses": rep.LostResponses, "429s": rep.RateLimited, "504s": rep.TimeoutsAfterCommit,
		"parallel duplicates": rep.ParallelDuplicates, "crashes before write": rep.CrashesBeforeWrite,
		"crashes after write": rep.CrashesAfterWrite, "replays": rep.Replays, "takeovers": rep.Takeovers,
	} {
		if n == 0 {
			t.Errorf("no %s happened: the demo did not test them (%+v)", name, rep)
		}
	}
}

// TestDemoCountsDuplicates: without the store's fence, a crash between the
// write and Complete makes the takeover write again, and the demo sees it.
func TestDemoCountsDuplicates(t *testing.T) {
	defer goleak.VerifyNone(t)
	rep, err := chaos.Demo(t.Context(), chaos.DemoConfig{Intents: 100, Seed: 7, Crash: 0.4, Unfenced: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.CrashesAfterWrite == 0 || rep.Duplicates == 0 {
		t.Fatalf("report %+v: want duplicates from the crashes after the write", rep)
	}
}
