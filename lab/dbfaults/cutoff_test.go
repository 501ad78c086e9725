package dbfaults

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// cutoff is how long TestCutOffFromTheDatabase drops every packet between
// ledgerd and its database: 10 s in the tests; the lab run passes
// -cutoff 30s (docs/guarantees.md).
var cutoff = flag.Duration("cutoff", 10*time.Second, "how long the path between ledgerd and PostgreSQL drops every packet")

// The readiness bounds of a cut.
const (
	notReadyBy = 8 * time.Second // after the cut: a readiness check every 5 s, each bounded by 2 s
	servingBy  = 8 * time.Second // after the path returns: the checks back off up to 5 s
)

// TestCutOffFromTheDatabase runs ledgerd on PostgreSQL through a fault
// proxy, under a load of claims and completions, and drops every packet
// between them for -cutoff: every call fails closed and typed (a
// retryable UNAVAILABLE or UPSTREAM_TIMEOUT, never an untyped error)
// within its caller's deadline; readiness turns NOT_SERVING within
// notReadyBy of the cut, and SERVING again within servingBy of the path's
// return, when calls succeed again by themselves; and every outcome
// acknowledged, before or during the run, replays afterwards.
func TestCutOffFromTheDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("a cut of -cutoff")
	}
	_, viaProxy, p := proxied(t)
	ld := ledgerdtest.Start(t, "--database-url", viaProxy, "--migrate", "--admin-listen", "", "--http-listen", "")
	l := dialLoad(t, ld.GRPC)
	for i := range 20 {
		l.write(fmt.Sprintf("before-%02d", i))
	}
	l.start(4)
	l.await(100) // load before the cut
	cutAt := time.Now()
	p.SetBlackhole(true)
	time.Sleep(*cutoff) // the cut lasts -cutoff of real time: the subject of the test
	backAt := time.Now()
	p.SetBlackhole(false)
	ledgertest.Eventually(t, 60*time.Second, func() bool {
		_, serving := l.readiness(backAt)
		return !serving.IsZero() && time.Since(serving) > 2*time.Second // and two seconds of load after
	}, "ledgerd did not serve again after the path returned")
	l.finish()

	s := l.check([]errcode.Code{errcode.Unavailable, errcode.UpstreamTimeout})
	notServing, _ := l.readiness(cutAt)
	_, servingBack := l.readiness(backAt)
	switch {
	case notServing.IsZero() || notServing.Sub(cutAt) > notReadyBy:
		t.Errorf("readiness did not turn NOT_SERVING within %s of the cut (at %v)", notReadyBy, notServing.Sub(cutAt))
	case servingBack.IsZero() || servingBack.Sub(backAt) > servingBy:
		t.Errorf("readiness did not turn SERVING within %s of the path's return (at %v)", servingBy, servingBack.Sub(backAt))
	}
	first := s.firstDoneAfter(backAt)
	if first < 0 {
		t.Error("no call succeeded after the path returned")
	}
	checked, lost, missing := l.replayAcked()
	if lost > 0 {
		t.Errorf("%d acknowledged outcomes lost: %v", lost, missing)
	}
	t.Logf("cut %s: %d calls (%s); longest call %s; NOT_SERVING %s after the cut, SERVING %s after the path returned; "+
		"the longest time without a call done %s, the first done %s after the path returned; %d acknowledged outcomes checked, %d lost",
		*cutoff, s.calls, s.codes, s.longest.Round(time.Millisecond), notServing.Sub(cutAt).Round(100*time.Millisecond),
		servingBack.Sub(backAt).Round(100*time.Millisecond), s.gap.Round(100*time.Millisecond), first.Round(time.Millisecond), checked, lost)
}
