package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/ledgerdtest"
	"github.com/idemledger/idemledger/internal/syncbuf"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
)

func TestMain(m *testing.M) { os.Exit(ledgerdtest.Main(m)) }

// startLedgerd runs ledgerd on its embedded store with a write service
// (billing, token billing-secret) and an admin (ops-alice, token
// ops-secret), and returns its gRPC address and its log.
func startLedgerd(t *testing.T) (string, *syncbuf.Buffer) {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("billing-secret")+" billing acme,globex\n"+
		server.HashToken("ops-secret")+" _admin ops-alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := ledgerdtest.Start(t, "--admin-listen", "", "--http-listen", "", "--data-dir", filepath.Join(dir, "data"), "--tokens", tokens)
	return p.GRPC, p.Log
}

// idemctl runs the command and returns its status and output.
func idemctl(t *testing.T, addr, token string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), append([]string{"--addr", addr, "--token", token}, args...), strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestAgainstLedgerd: an operator lists a namespace, finds a key whose
// outcome is unknown, reads it, settles it, and erases a key and a tenant,
// with idemctl against a real ledgerd; the write service's retry then
// replays the settled outcome.
func TestAgainstLedgerd(t *testing.T) {
	addr, log := startLedgerd(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	billing := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer billing-secret")
	client := ledgerv1.NewLedgerServiceClient(conn)
	begin := func(tenant, key string, hold bool) *ledgerv1.BeginResponse {
		req := &ledgerv1.BeginRequest{Tenant: tenant, Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: "mcp:tools/charge_card", KeySource: "meta"}
		if hold {
			req.OnLeaseExpiry, req.Lease = ledgerv1.OnLeaseExpiry_ON_LEASE_EXPIRY_HOLD, durationpb.New(time.Second)
		}
		res, err := client.Begin(billing, req, grpc.WaitForReady(true)) // ledgerd may be opening its store
		if err != nil {
			t.Fatalf("Begin %s: %v", key, err)
		}
		return res
	}
	out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/google.protobuf.StringValue", Value: []byte("\x0a\x04ch_1")}}}
	for _, k := range []string{"k-1", "k-2", "k-3"} {
		res := begin("acme", k, false)
		if _, err := client.Complete(billing, &ledgerv1.CompleteRequest{Tenant: "acme", Key: k, Token: res.GetClaim().GetToken(), Outcome: out}); err != nil {
			t.Fatal(err)
		}
	}
	begin("acme", "charge-7", true)
	g1 := begin("globex", "g-1", false)
	if _, err := client.Complete(billing, &ledgerv1.CompleteRequest{Tenant: "globex", Key: "g-1", Token: g1.GetClaim().GetToken(), Outcome: out}); err != nil {
		t.Fatal(err)
	}
	// lapsed: a TAKEOVER attempt whose lease runs out with nobody completing it.
	if _, err := client.Begin(billing, &ledgerv1.BeginRequest{Tenant: "acme", Key: "lapsed", Fingerprint: ledgertest.Fingerprint("p"),
		Method: "mcp:tools/charge_card", Lease: durationpb.New(time.Second)}); err != nil {
		t.Fatal(err)
	}
	begin("acme", "running", false)
	time.Sleep(1100 * time.Millisecond) // ledgerd (another process) keeps the wall clock: charge-7's and lapsed's 1 s leases run out (unknown, lease_expired)

	// The runbook: find the unknown keys.
	code, stdout, stderr := idemctl(t, addr, "ops-secret", "list", "--namespace", "billing", "--state", "outcome_unknown")
	if code != 0 || !strings.Contains(stdout, "charge-7") || !strings.Contains(stdout, "outcome_unknown") || strings.Contains(stdout, "k-1") || strings.Contains(stdout, "lapsed") {
		t.Fatalf("list --state outcome_unknown: %d\n%s%s", code, stdout, stderr)
	}
	// A lease that ran out with nobody completing it reads lease_expired,
	// in the table, in the JSON and in a search; in_progress is the rest.
	code, stdout, stderr = idemctl(t, addr, "ops-secret", "list", "--namespace", "billing", "--state", "lease_expired")
	if code != 0 || !regexp.MustCompile(`(?m)^billing +acme +lapsed +lease_expired `).MatchString(stdout) || strings.Contains(stdout, "running") {
		t.Fatalf("list --state lease_expired: %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, stderr = idemctl(t, addr, "ops-secret", "list", "--namespace", "billing", "--state", "in_progress")
	if code != 0 || !regexp.MustCompile(`(?m)^billing +acme +running +in_progress `).MatchString(stdout) || strings.Contains(stdout, "lapsed") {
		t.Fatalf("list --state in_progress: %d\n%s%s", code, stdout, stderr)
	}
	code, stdout, _ = idemctl(t, addr, "ops-secret", "-o", "json", "get", "--namespace", "billing", "--tenant", "acme", "--key", "lapsed")
	var one struct {
		Record struct{ State string } `json:"record"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &one) != nil || one.Record.State != "lease_expired" {
		t.Fatalf("get -o json of a lapsed lease: %d\n%s", code, stdout)
	}
	code, stdout, _ = idemctl(t, addr, "ops-secret", "-o", "json", "list", "--namespace", "billing", "--tenant", "acme", "--page-size", "2", "--all")
	var listed struct {
		Records []struct{ Key string } `json:"records"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &listed) != nil || len(listed.Records) != 6 {
		t.Fatalf("list --all -o json: %d\n%s", code, stdout)
	}
	code, stdout, _ = idemctl(t, addr, "ops-secret", "get", "--namespace", "billing", "--tenant", "acme", "--key", "charge-7")
	if code != 0 || !strings.Contains(stdout, "state") || !strings.Contains(stdout, "HOLD") || !strings.Contains(stdout, "token") ||
		!regexp.MustCompile(`(?m)^key from +meta$`).MatchString(stdout) {
		t.Fatalf("get: %d\n%s", code, stdout)
	}
	// Settle it: the charge went through at the provider.
	code, stdout, stderr = idemctl(t, addr, "ops-secret", "resolve", "--namespace", "billing", "--tenant", "acme", "--key", "charge-7",
		"--applied", `{"response":{"@type":"type.googleapis.com/google.protobuf.StringValue","value":"ch_7"}}`)
	if code != 0 || !strings.Contains(stdout, "completed") {
		t.Fatalf("resolve: %d\n%s%s", code, stdout, stderr)
	}
	if res := begin("acme", "charge-7", true); res.GetReplay() == nil {
		t.Fatalf("the write service's retry after the resolution: %v", res)
	}
	// Erase one key, then tenant globex.
	if code, stdout, _ = idemctl(t, addr, "ops-secret", "purge", "--namespace", "billing", "--tenant", "acme", "--key", "k-1"); code != 0 || !strings.Contains(stdout, "purged: true") {
		t.Fatalf("purge --key: %d\n%s", code, stdout)
	}
	if code, stdout, _ = idemctl(t, addr, "ops-secret", "purge", "--namespace", "billing", "--tenant", "globex", "--all-records", "--yes"); code != 0 || !strings.Contains(stdout, "purged 1 records") {
		t.Fatalf("purge --all-records: %d\n%s", code, stdout)
	}
	code, stdout, _ = idemctl(t, addr, "ops-secret", "list", "--namespace", "billing")
	if code != 0 || strings.Contains(stdout, "k-1") || strings.Contains(stdout, "g-1") || !strings.Contains(stdout, "k-2") {
		t.Fatalf("after the purges: %d\n%s", code, stdout)
	}

	// Clear errors: a write service's token, no token, usage mistakes.
	if code, _, stderr = idemctl(t, addr, "billing-secret", "list", "--namespace", "billing"); code != 1 || !strings.Contains(stderr, "PERMISSION_DENIED") || !strings.Contains(stderr, "_admin") {
		t.Fatalf("a write service's token: %d %s", code, stderr)
	}
	if code, _, stderr = idemctl(t, addr, "", "list", "--namespace", "billing"); code != 1 || !strings.Contains(stderr, "UNAUTHENTICATED") {
		t.Fatalf("no token: %d %s", code, stderr)
	}
	for _, args := range [][]string{
		{"list"},
		{"list", "--namespace", "billing", "--state", "sleeping"},
		{"get", "--namespace", "billing", "--tenant", "acme"},
		{"resolve", "--namespace", "billing", "--tenant", "acme", "--key", "k", "--applied", "{", "--not-applied"},
		{"resolve", "--namespace", "billing", "--tenant", "acme", "--key", "k", "--applied", "not json"},
		{"purge", "--namespace", "billing", "--tenant", "acme"},
		{"frobnicate"},
	} {
		if code, _, stderr := idemctl(t, addr, "ops-secret", args...); code != 2 || stderr == "" {
			t.Errorf("%v: exit %d, %q; want a usage error", args, code, stderr)
		}
	}
	for _, want := range []string{`"msg":"audit: record resolved"`, `"principal":"ops-alice"`, `"msg":"audit: key purged"`, `"msg":"audit: tenant purged"`} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("ledgerd's log has no %s", want)
		}
	}
}

// TestHashToken: the token-file entries idemctl makes are the ones
// ledgerd reads.
func TestHashToken(t *testing.T) {
	for args, want := range map[string]string{
		"":                                     server.HashToken("s3cret") + "\n",
		"--namespace billing --tenants acme,x": server.HashToken("s3cret") + " billing acme,x\n",
		"--admin ops-alice":                    server.HashToken("s3cret") + " _admin ops-alice\n",
	} {
		var stdout, stderr bytes.Buffer
		code := run(t.Context(), append([]string{"hash-token"}, strings.Fields(args)...), strings.NewReader("s3cret\n"), &stdout, &stderr)
		if code != 0 || stdout.String() != want {
			t.Errorf("hash-token %s: %d %q %q", args, code, stdout.String(), stderr.String())
		}
		if _, err := server.ParseTokens(strings.NewReader(stdout.String())); args != "" && err != nil {
			t.Errorf("hash-token %s made an entry ledgerd refuses: %v", args, err)
		}
	}
	var stderr bytes.Buffer
	if code := run(t.Context(), []string{"hash-token"}, strings.NewReader(""), &bytes.Buffer{}, &stderr); code != 2 {
		t.Fatalf("no token on standard input: exit %d", code)
	}
}

// TestVersionFlag: idemctl --version prints its build and exits 0.
func TestVersionFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"--version"}, strings.NewReader(""), &stdout, &stderr); code != 0 || !strings.HasPrefix(stdout.String(), "idemctl ") || !strings.Contains(stdout.String(), " go1.") {
		t.Fatalf("idemctl --version: exit %d, %q %q", code, stdout.String(), stderr.String())
	}
}

// TestCommandHelp: idemctl <command> --help (or -h) and idemctl help
// <command> print that command's flags to standard output and exit 0,
// reaching no ledger; help of an unknown command is a usage error.
func TestCommandHelp(t *testing.T) {
	for cmd, flag := range map[string]string{"list": "-state", "get": "-key", "resolve": "-not-applied", "purge": "-all-records", "hash-token": "-admin"} {
		for _, args := range [][]string{{cmd, "--help"}, {cmd, "-h"}, {"help", cmd}, {"--addr", "127.0.0.1:1", cmd, "--help"}} {
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), args, strings.NewReader(""), &stdout, &stderr)
			if code != 0 || !strings.Contains(stdout.String(), "usage: idemctl [flags] "+cmd+" [flags]") || !strings.Contains(stdout.String(), flag) || stderr.Len() != 0 {
				t.Errorf("idemctl %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, stdout.String(), stderr.String())
			}
		}
	}
	var stdout bytes.Buffer
	if code := run(t.Context(), []string{"help"}, strings.NewReader(""), &stdout, &bytes.Buffer{}); code != 0 || !strings.Contains(stdout.String(), "hash-token") {
		t.Errorf("idemctl help: exit %d, %q", code, stdout.String())
	}
	if code := run(t.Context(), []string{"help", "nope"}, strings.NewReader(""), &bytes.Buffer{}, &bytes.Buffer{}); code != 2 {
		t.Errorf("idemctl help nope: exit %d, want 2", code)
	}
}

// TestBackupAndRestore: idemctl backup takes an online backup of a
// serving ledgerd's embedded store into its --backup-dir; a copy of it,
// opened by a new ledgerd as its data directory (the runbook's restore),
// is the same ledger and replays every outcome written before the backup,
// while a key written after it is claimed afresh. A name taken, or one
// that is not a plain name, is refused, typed.
func TestBackupAndRestore(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("billing-secret")+" billing acme\n"+server.HashToken("ops-secret")+" _admin ops-alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	backups := filepath.Join(dir, "backups")
	p := ledgerdtest.Start(t, "--admin-listen", "", "--http-listen", "", "--data-dir", filepath.Join(dir, "data"), "--backup-dir", backups, "--tokens", tokens)
	billing := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer billing-secret")
	write := func(addr, key string) *ledgerv1.BeginResponse {
		t.Helper()
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		client := ledgerv1.NewLedgerServiceClient(conn)
		req := &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: "/billing.v1.Invoices/Create"}
		res, err := client.Begin(billing, req, grpc.WaitForReady(true)) // ledgerd may be opening its store
		if err != nil {
			t.Fatalf("Begin %s: %v", key, err)
		}
		if c := res.GetClaim(); c != nil {
			out := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte("inv-" + key)}}}
			if _, err := client.Complete(billing, &ledgerv1.CompleteRequest{Tenant: "acme", Key: key, Token: c.GetToken(), Outcome: out}); err != nil {
				t.Fatal(err)
			}
		}
		return res
	}
	for i := range 40 {
		write(p.GRPC, fmt.Sprintf("k-%02d", i))
	}
	code, stdout, stderr := idemctl(t, p.GRPC, "ops-secret", "backup", "--name", "nightly-1")
	want := filepath.Join(backups, "nightly-1")
	if code != 0 || !strings.Contains(stdout, "backup: "+want+" (") {
		t.Fatalf("idemctl backup: %d %s%s", code, stdout, stderr)
	}
	for _, name := range []string{"nightly-1", "../data", ".hidden"} {
		if code, _, stderr := idemctl(t, p.GRPC, "ops-secret", "backup", "--name", name); code != 1 || !strings.Contains(stderr, "VALIDATION_FAILED") {
			t.Errorf("backup --name %s: %d %s", name, code, stderr)
		}
	}
	if code, _, stderr := idemctl(t, p.GRPC, "billing-secret", "backup"); code != 1 || !strings.Contains(stderr, "PERMISSION_DENIED") {
		t.Errorf("a write service's backup: %d %s", code, stderr)
	}
	write(p.GRPC, "after")

	// The restore: the backup, copied into a data directory of its own.
	restored := filepath.Join(dir, "restored")
	if out, err := exec.Command("cp", "-a", want, restored).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	q := ledgerdtest.Start(t, "--admin-listen", "", "--http-listen", "", "--data-dir", restored, "--tokens", tokens)
	for i := range 40 {
		key := fmt.Sprintf("k-%02d", i)
		res := write(q.GRPC, key)
		if got := res.GetReplay().GetOutcome().GetResponse(); string(got.GetValue()) != "inv-"+key {
			t.Fatalf("%s from the restored ledger: %v", key, res)
		}
	}
	if res := write(q.GRPC, "after"); res.GetClaim() == nil {
		t.Fatalf("a key written after the backup: %v, want a fresh claim", res)
	}
	if strings.Contains(q.Log.String(), "created a new embedded ledger") {
		t.Fatalf("the restored ledger started as a new one:\n%s", q.Log.String())
	}
}
