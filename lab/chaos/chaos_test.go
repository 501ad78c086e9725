package chaos_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/lab/chaos"
)

var ledgerd, ledgerchaos string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "chaos-test")
	if err != nil {
		panic(err)
	}
	ledgerd, ledgerchaos = filepath.Join(dir, "ledgerd"), filepath.Join(dir, "ledgerchaos")
	for bin, pkg := range map[string]string{ledgerd: "../../cmd/ledgerd", ledgerchaos: "../cmd/ledgerchaos"} {
		build := exec.Command("go", "build", "-o", bin, ".")
		build.Dir = pkg // ledgerd: a module of its own
		if out, err := build.CombinedOutput(); err != nil {
			os.Stderr.Write(out)
			panic(err)
		}
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func check(t *testing.T, rep chaos.Report) {
	t.Helper()
	var table strings.Builder
	rep.Table(&table)
	t.Logf("\n%s", table.String())
	if !rep.OK() {
		t.Fatal("a guarantee broke")
	}
	for name, n := range map[string]int64{
		"cut responses": rep.CutResponses, "504s": rep.TimeoutsAfterDone, "429s": rep.RateLimited,
		"resets": rep.Resets, "latency": rep.LatencySpells, "ledgerd kills": rep.LedgerdKills, "replays": rep.Replayed,
	} {
		if n == 0 {
			t.Errorf("no %s happened", name)
		}
	}
}

func TestEmbeddedStoreUnderFaults(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("runs ledgerd under faults for several seconds")
	}
	rep, err := chaos.Run(t.Context(), chaos.Config{Ledgerd: ledgerd, Intents: 300, Agents: 8, Seed: 1, FaultEvery: 250 * time.Millisecond, Pace: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	check(t, rep)
}

// TestLedgerStreamUnderFaults: the same, with the write service calling
// the ledger over a Stream, which the faults cut and ledgerd's kills break.
func TestLedgerStreamUnderFaults(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("runs ledgerd under faults for several seconds")
	}
	rep, err := chaos.Run(t.Context(), chaos.Config{Ledgerd: ledgerd, Intents: 300, Agents: 8, Seed: 3, FaultEvery: 250 * time.Millisecond, Pace: 20 * time.Millisecond, LedgerStream: true})
	if err != nil {
		t.Fatal(err)
	}
	check(t, rep)
}

func TestPostgreSQLUnderFaults(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("runs ledgerd and PostgreSQL under faults for several seconds")
	}
	pg := pgtest.NewCluster(t)
	rep, err := chaos.Run(t.Context(), chaos.Config{Ledgerd: ledgerd, Intents: 300, Agents: 8, Seed: 2, FaultEvery: 250 * time.Millisecond, Pace: 20 * time.Millisecond, DatabaseURL: pg.URL, RestartDatabase: pg.Restart})
	if err != nil {
		t.Fatal(err)
	}
	check(t, rep)
	if rep.DatabaseRestarts == 0 {
		t.Error("PostgreSQL was never restarted")
	}
}

// TestFenceUnderKills is the short run of ledgerchaos -fence: the invoice
// service on PostgreSQL, its processes killed with SIGKILL, killing
// themselves between their commit and Complete, and frozen past a lease;
// with the fence, no intent ends with two invoices or an unknown outcome.
func TestFenceUnderKills(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	if testing.Short() {
		t.Skip("kills service processes for several seconds")
	}
	pg := pgtest.NewCluster(t)
	rep, err := chaos.RunFence(t.Context(), chaos.FenceConfig{Ledgerd: ledgerd, Service: ledgerchaos, DatabaseURL: pg.URL, LedgerOnPostgres: true,
		Intents: 300, Agents: 8, Fence: true, CrashAfterCommit: 0.05, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	rep.Table(&table)
	t.Logf("\n%s%s", table.String(), rep.Line())
	if !rep.OK() {
		t.Fatal("the fence's promise broke")
	}
	if rep.Kills == 0 || rep.Pauses == 0 {
		t.Errorf("%d kills and %d pauses: the faults did not happen", rep.Kills, rep.Pauses)
	}
}

// TestFenceAcrossFailover runs the fence's chaos (service processes killed
// and paused, the fenced invoice service on PostgreSQL) with ledgerd and
// the invoices on a PostgreSQL primary with a synchronous standby, both
// through a multi-host URL, and fails the primary over twice while it
// runs: still no intent invoiced twice and no outcome unknown.
func TestFenceAcrossFailover(t *testing.T) {
	t.Parallel() // its own processes, ports, directories and clusters
	if testing.Short() {
		t.Skip("fails PostgreSQL over under the fence's chaos")
	}
	pair, err := pgtest.StartPair(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pair.Stop)
	if err := pair.CreateDatabase("fence"); err != nil {
		t.Fatal(err)
	}
	type result struct {
		rep chaos.FenceReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := chaos.RunFence(t.Context(), chaos.FenceConfig{Ledgerd: ledgerd, Service: ledgerchaos, DatabaseURL: pair.URL("fence"),
			LedgerOnPostgres: true, Intents: 800, Agents: 8, Fence: true, CrashAfterCommit: 0.05, Seed: 5})
		done <- result{rep, err}
	}()
	failed := 0
	for range 2 {
		select {
		case r := <-done:
			t.Fatalf("the run ended after %d failovers, before the next: %+v, %v", failed, r.rep, r.err)
		case <-time.After(4 * time.Second):
		}
		if err := pair.Fail(); err != nil {
			t.Fatal(err)
		}
		if err := pair.Rejoin(); err != nil {
			t.Fatal(err)
		}
		failed++
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	var table strings.Builder
	r.rep.Table(&table)
	t.Logf("%d failovers during the run\n%s%s", failed, table.String(), r.rep.Line())
	if !r.rep.OK() {
		t.Fatal("the fence's promise broke across a failover")
	}
}
