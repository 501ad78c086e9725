package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/anypb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/pgtest"
)

// TestHomes: ledgerd homes apply --migrate renders a homes file into the
// database and a second run does nothing; ledgerd homes print shows a
// tenant's move before homes apply makes it; ledgerd serves with the
// file, its region and follower reads, and counts the replays a follower
// answered; a region the file does not declare is refused.
func TestHomes(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	url := pgtest.NewDatabase(t)
	homes := filepath.Join(t.TempDir(), "homes")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(homes, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) (string, string) {
		t.Helper()
		cmd := exec.Command(binary, append(args, "--database-url", url, "--homes", homes)...)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("ledgerd %q: %v\n%s", args, err, stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	write("region here primary\nregion away\ndefault here\ntenant far away\ntenant moving away\n")
	if _, log := run("homes", "apply", "--migrate"); !strings.Contains(log, `"msg":"homes applied","generation":1`) {
		t.Fatalf("the first apply:\n%s", log)
	}
	if _, log := run("homes", "apply"); !strings.Contains(log, `"msg":"homes applied","generation":1,"statements":0`) {
		t.Fatalf("the same file again:\n%s", log)
	}
	write("region here primary\nregion away\ndefault here\ntenant far away\n")
	sql, _ := run("homes", "print")
	if !strings.Contains(sql, "ADD COLUMN home_region_2 TEXT GENERATED ALWAYS AS (CASE WHEN tenant IN ('far') THEN 'away'::TEXT ELSE 'here'::TEXT END) STORED;") ||
		!strings.Contains(sql, "DROP COLUMN home_region_1;") {
		t.Fatalf("homes print of the move:\n%s", sql)
	}
	if _, log := run("homes", "apply"); !strings.Contains(log, `"msg":"homes applied","generation":2`) {
		t.Fatalf("the move:\n%s", log)
	}

	p := start(t, "--database-url", url, "--homes", homes, "--region", "here", "--follower-reads", "5s")
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	for _, tenant := range []string{"far", "near"} {
		req := begin("k")
		req.Tenant = tenant
		res, err := client.Begin(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: tenant, Key: "k", Token: res.GetClaim().GetToken(),
			Outcome: &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: []byte(tenant)}}}}); err != nil {
			t.Fatal(err)
		}
		if res, err := client.Begin(t.Context(), req); err != nil || res.GetReplay() == nil {
			t.Fatalf("the retry of %s = %v, %v; want a replay", tenant, res, err)
		}
	}
	m := p.metrics(t)
	for _, want := range []string{`idemledger_sql_follower_reads_total{result="served"} 1`, `idemledger_sql_follower_reads_total{result="missed"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s (only the far tenant reads a follower: its new key missed, its retry was served)", want)
		}
	}
	for _, want := range []string{`idemledger_store_seconds_count{home="away",op="claim"} 2`, `idemledger_store_seconds_count{home="here",op="complete"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s: the store's calls by the home region of their tenant", want)
		}
	}
	if !strings.Contains(p.logs(), `"msg":"homes","file"`) {
		t.Errorf("ledgerd did not log the homes it serves with:\n%s", p.logs())
	}

	cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--admin-listen", "", "--http-listen", "", "--database-url", url, "--homes", homes, "--region", "nowhere")
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "nowhere") {
		t.Fatalf("--region nowhere: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	cmd = exec.Command(binary, "--homes", homes)
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("--homes without --database-url: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
}
