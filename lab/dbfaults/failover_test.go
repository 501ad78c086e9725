package dbfaults

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgertest"
)

// failovers is how many times TestFailover kills the primary: 2 in the
// tests; the lab run passes -failovers 5 (docs/guarantees.md).
var failovers = flag.Int("failovers", 2, "how many times the PostgreSQL primary is killed and its standby promoted")

// backBy bounds how soon after the new primary can commit (its standby
// back, under synchronous replication) a call succeeds again: ledgerd
// finds it by itself through the multi-host URL.
const backBy = 10 * time.Second

// TestFailover runs ledgerd on a PostgreSQL primary with a standby,
// connected by a multi-host URL (target_session_attrs=read-write), under
// a load of claims and completions, and -failovers times kills the primary
// with SIGKILL, promotes the standby, and brings the old primary back as
// the new one's standby. Synchronous: every outcome acknowledged is on the
// last primary; every call in the gaps failed closed, typed and retryable
// within its deadline; ledgerd found each new primary by itself within
// backBy. Asynchronous: the same, except that acknowledged writes in the
// replication lag may be lost, which the test counts and reports.
func TestFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("fails PostgreSQL over -failovers times")
	}
	for _, sync := range []bool{true, false} {
		name := map[bool]string{true: "Synchronous", false: "Asynchronous"}[sync]
		t.Run(name, func(t *testing.T) { failover(t, sync) })
	}
}

func failover(t *testing.T, sync bool) {
	pair, err := pgtest.StartPair(sync)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skipf("cannot start PostgreSQL with a standby: %v", err)
	}
	t.Cleanup(pair.Stop)
	if err := pair.CreateDatabase("ledger"); err != nil {
		t.Fatal(err)
	}
	ld := ledgerdtest.Start(t, "--database-url", pair.URL("ledger"), "--migrate", "--admin-listen", "", "--http-listen", "")
	l := dialLoad(t, ld.GRPC)
	l.start(4)
	var gaps []string
	for i := range *failovers {
		l.await(200) // load on this primary
		killedAt := time.Now()
		if err := pair.Fail(); err != nil {
			t.Fatalf("failover %d: %v", i+1, err)
		}
		promotedAt := time.Now()
		if err := pair.Rejoin(); err != nil {
			t.Fatalf("failover %d: the old primary rejoining: %v", i+1, err)
		}
		rejoinedAt := time.Now()
		// Under synchronous replication the new primary commits once its
		// standby is back; asynchronous, once it is promoted.
		canCommit := rejoinedAt
		if !sync {
			canCommit = promotedAt
		}
		ledgertest.Eventually(t, backBy, func() bool { return l.doneAfter(canCommit) >= 0 }, "failover %d: no call succeeded after the new primary could commit", i+1)
		first := l.doneAfter(canCommit)
		if first < 0 || first > backBy {
			t.Errorf("failover %d: no call succeeded within %s after the new primary could commit (%v)", i+1, backBy, first)
		}
		gaps = append(gaps, fmt.Sprintf("killed→promoted %s, →standby back %s, first call done %s after the primary could commit",
			promotedAt.Sub(killedAt).Round(100*time.Millisecond), rejoinedAt.Sub(killedAt).Round(100*time.Millisecond), first.Round(time.Millisecond)))
	}
	l.await(200) // load on the last primary
	l.finish()
	var lostCodes []errcode.Code
	if !sync {
		// An acknowledged claim the promoted standby never received is
		// lost: its Complete finds no claim of its token (LEASE_LOST, not
		// retryable). What asynchronous replication costs, counted as lost
		// below.
		lostCodes = []errcode.Code{errcode.LeaseLost}
	}
	s := l.check(allowedInFailover, lostCodes...)
	checked, lost, missing := l.replayAcked()
	if sync && lost > 0 {
		t.Errorf("%d acknowledged outcomes lost under synchronous replication: %v", lost, missing)
	}
	t.Logf("%s replication, %d failovers: %d calls (%s); longest call %s; the longest time without a call done %s; "+
		"%d acknowledged outcomes checked on the last primary, %d lost; %s",
		map[bool]string{true: "synchronous", false: "asynchronous"}[sync], *failovers, s.calls, s.codes,
		s.longest.Round(time.Millisecond), s.gap.Round(100*time.Millisecond), checked, lost, strings.Join(gaps, "; "))
}

// allowedInFailover are the answers a call may get while the primary is
// gone: the store is unavailable, or did not answer in time.
var allowedInFailover = []errcode.Code{errcode.Unavailable, errcode.UpstreamTimeout}
