package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemledger/idemledger/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestRegionBench runs the benchmark small, with round trips short enough
// to be quick and long enough to tell apart: every scenario's row is
// there, the far tenant's replays come from the follower, and each
// operation pays the round trips its model says, within slack.
func TestRegionBench(t *testing.T) {
	var out strings.Builder
	cfg := config{samples: 5, local: time.Millisecond, neighbour: 20 * time.Millisecond, far: 60 * time.Millisecond,
		followerReads: 10 * time.Second, databaseURL: pgtest.NewDatabase(t)}
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	for _, sc := range scenarios(cfg) {
		if !strings.Contains(out.String(), "| "+sc.Name+" |") {
			t.Errorf("no row for %s", sc.Name)
		}
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Split(line, " | "); len(f) == 5 {
			rows[strings.TrimPrefix(f[0], "| ")] = f
		}
	}
	p50 := func(cell string) float64 {
		var v float64
		if _, err := fmtSscan(cell, &v); err != nil {
			t.Fatalf("cell %q: %v", cell, err)
		}
		return v
	}
	// Relative checks, which a loaded machine (every package's tests at
	// once) does not upset: the far tenant's replay from a follower is a
	// local round trip, from the leaseholder a far one; under REGION
	// survival a local write pays the neighbour, a replay does not.
	follower, leaseholder := rows["homed far, ZONE"], rows["homed far, ZONE, no follower reads"]
	if follower == nil || leaseholder == nil || follower[4] != "follower |" || p50(follower[3]) > p50(leaseholder[3])/2 {
		t.Errorf("far tenant's replays: from the follower %q, from the leaseholder %q", follower, leaseholder)
	}
	if r := rows["homed here, REGION"]; r == nil || p50(r[1]) < 15 || p50(r[3]) > p50(r[1])/2 {
		t.Errorf("local tenant under REGION survival (neighbour 20 ms): %q", r)
	}
}

// fmtSscan reads the p50 of a "p50 / p99" cell.
func fmtSscan(cell string, v *float64) (int, error) {
	return fmt.Sscan(strings.TrimSpace(strings.Split(cell, "/")[0]), v)
}
