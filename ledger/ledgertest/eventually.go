package ledgertest

import (
	"testing"
	"time"
)

// Eventually polls cond every 10 ms until it holds, and fails the test
// with what (fmt-style with args) if it does not within d. It is the one
// poll of the tests that watch another process (ledgerd's metrics, logs,
// readiness) or a load running beside them, where nothing can be awaited
// directly; a test of code in its own process awaits a signal or uses a
// clock instead.
func Eventually(t testing.TB, d time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: "+what, append([]any{d}, args...)...)
		}
		time.Sleep(10 * time.Millisecond) // the other process moves on its own
	}
}
