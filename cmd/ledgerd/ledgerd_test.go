package main_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/pgtest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/pebble"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// binary is ledgerd, built once by TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "ledgerd-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "ledgerd")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := pgtest.Run(m)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running ledgerd.
type proc struct {
	cmd                       *exec.Cmd
	grpc, admin, health, http string
	mu                        sync.Mutex
	log                       bytes.Buffer
	exited                    chan struct{}
}

// start runs ledgerd with args on loopback ports of its own choosing and
// waits until it says where it listens. It is killed when the test ends.
func start(t testing.TB, args ...string) *proc {
	t.Helper()
	return startEnv(t, nil, args...)
}

// startEnv is start with env added to ledgerd's environment.
func startEnv(t testing.TB, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{exited: make(chan struct{})}
	p.cmd = exec.Command(binary, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--drain-timeout", "10s"}, args...)...)
	p.cmd.Env = append(append(os.Environ(), "LEDGER_LOG_LEVEL=debug"), env...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			t.Logf("ledgerd log:\n%s", p.logs())
		}
	})
	ready := make(chan struct{})
	go func() {
		defer close(p.exited)
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			p.mu.Lock()
			p.log.Write(append(lines.Bytes(), '\n'))
			p.mu.Unlock()
			var line struct{ Msg, GRPC, Admin, Health, HTTP string }
			if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "ledgerd listening" {
				p.grpc, p.admin, p.health, p.http = line.GRPC, line.Admin, line.Health, line.HTTP
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = p.cmd.Wait()
	}()
	select {
	case <-ready:
	case <-p.exited:
		t.Fatalf("ledgerd exited before it listened:\n%s", p.logs())
	case <-time.After(20 * time.Second):
		t.Fatalf("ledgerd did not listen within 20s:\n%s", p.logs())
	}
	return p
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("ledgerd did not exit within 20s:\n%s", p.logs())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// waitServing waits for gRPC health to say SERVING.
func (p *proc) waitServing(t testing.TB, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: ledgerv1.LedgerService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := res.Recv()
		if err != nil {
			t.Fatalf("health never said SERVING: %v", err)
		}
		if msg.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
	}
}

// logBarrier has ledgerd log a line of its own (a Lookup it refuses as
// the caller's mistake, at info) and waits for it: every line ledgerd
// wrote before is in p.logs() then, where a test asserts that no more
// came.
func (p *proc) logBarrier(ctx context.Context, t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	_, err := ledgerv1.NewLedgerServiceClient(conn).Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme"})
	ledgertest.WantStatus(t, err, errcode.KeyMissing)
	ledgertest.Eventually(t, 10*time.Second, func() bool {
		for line := range strings.Lines(p.logs()) {
			if strings.Contains(line, `"grpc.method":"Lookup"`) && strings.Contains(line, `"grpc.code":"InvalidArgument"`) {
				return true
			}
		}
		return false
	}, "ledgerd logs the refused Lookup")
}

func (p *proc) metrics(t testing.TB) string {
	t.Helper()
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var invoice = &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{
	TypeUrl: "type.googleapis.com/billing.v1.Invoice", Value: []byte("\x0a\x07inv_001\x10\xe8\x07"),
}}}

func begin(key string) *ledgerv1.BeginRequest {
	return &ledgerv1.BeginRequest{Tenant: "acme", Key: key, Fingerprint: ledgertest.Fingerprint("p"), Method: ledgertest.Method}
}

// TestEndToEndSurvivesKill9 drives ledgerd on its embedded store through
// a real client: claim, complete, replay; then kills it with SIGKILL,
// starts it again on the same data directory and finds the record intact.
func TestEndToEndSurvivesKill9(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	dir := t.TempDir()
	p := start(t, "--data-dir", dir)
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)

	res, err := client.Begin(t.Context(), begin("inv-1"))
	if err != nil || res.GetClaim() == nil {
		t.Fatalf("Begin = %v, %v; want a claim", res, err)
	}
	if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "inv-1", Token: res.GetClaim().GetToken(), Outcome: invoice}); err != nil {
		t.Fatal(err)
	}
	replay, err := client.Begin(t.Context(), begin("inv-1"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(invoice, replay.GetReplay().GetOutcome(), protocmp.Transform()); d != "" {
		t.Fatalf("replay (-want +got):\n%s", d)
	}
	running, err := client.Begin(t.Context(), begin("inv-2"))
	if err != nil || running.GetClaim() == nil {
		t.Fatalf("Begin inv-2 = %v, %v", running, err)
	}

	// Reflection lists the service, and the metrics count the decisions.
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	listed, err := refl.Recv()
	if err != nil || !strings.Contains(listed.String(), ledgerv1.LedgerService_ServiceDesc.ServiceName) {
		t.Fatalf("reflection ListServices = %v, %v", listed, err)
	}
	m := p.metrics(t)
	for _, want := range []string{
		`idemledger_decisions_total{decision="claimed",ledger_namespace="dev"} 2`,
		`idemledger_decisions_total{decision="replayed",ledger_namespace="dev"} 1`,
		`idemledger_decisions_total{decision="completed",ledger_namespace="dev"} 1`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Begin",grpc_service="idemledger.v1.LedgerService",grpc_type="unary"} 3`,
		`grpc_server_handling_seconds_bucket{`,
		"idemledger_pebble_write_stalls_total 0",
		"idemledger_pebble_write_stall_seconds_total 0",
		`idemledger_pebble_wal_sync_seconds_bucket{le="0.0001"} `,
		`idemledger_pebble_wal_sync_seconds_bucket{le="10"} `,
		`go_sched_latencies_seconds_bucket{le=`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(m, "idemledger_sql_") {
		t.Error("the embedded store's ledgerd exports SQL batch metrics")
	}
	// Three claims and a completion, each acknowledged after a sync.
	if syncs := metricValue(t, m, "idemledger_pebble_wal_sync_seconds_count"); syncs < 4 {
		t.Errorf("%v log syncs counted after four writes", syncs)
	}

	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.wait(t)

	p = start(t, "--data-dir", dir)
	conn = p.dial(t)
	p.waitServing(t, conn)
	client = ledgerv1.NewLedgerServiceClient(conn)
	replay, err = client.Begin(t.Context(), begin("inv-1"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(invoice, replay.GetReplay().GetOutcome(), protocmp.Transform()); d != "" {
		t.Fatalf("replay after kill -9 (-want +got):\n%s", d)
	}
	look, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "inv-2"})
	if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_IN_PROGRESS {
		t.Fatalf("the claim in flight at kill -9: %v, %v; want IN_PROGRESS", look, err)
	}
	_, err = client.Begin(t.Context(), begin("inv-2"))
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.InProgress {
		t.Fatalf("Begin of the key in flight = %v, want IN_PROGRESS", err)
	}
}

// TestSIGTERMDrainsInFlightCalls: a Lookup waiting on an IN_PROGRESS key
// when SIGTERM arrives is answered at once, UNAVAILABLE with a retry
// hint (its caller retries on another instance), and then ledgerd exits
// 0, well within --drain-timeout; on a Stream too, which ledgerd drains
// rather than waiting out --drain-timeout for it.
func TestSIGTERMDrainsInFlightCalls(t *testing.T) {
	t.Run("Unary", func(t *testing.T) { sigtermDrains(t, false) })
	t.Run("Stream", func(t *testing.T) { sigtermDrains(t, true) })
}

func sigtermDrains(t *testing.T, stream bool) {
	p := start(t, "--data-dir", t.TempDir())
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	if stream {
		sc := ledgerclient.New(client)
		defer sc.Close()
		client = sc
	}
	if _, err := client.Begin(t.Context(), begin("slow")); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res *ledgerv1.LookupResponse
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "slow", Wait: durationpb.New(30 * time.Second)})
		done <- answer{res, err}
	}()
	ledgertest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(p.metrics(t), "idemledger_lookup_waiters 1") }, "the Lookup never waited")
	signaled := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The waiting Lookup is answered at once, UNAVAILABLE with a hint,
	// not held to the drain timeout and cut.
	got := <-done
	if le := ledgertest.WantStatus(t, got.err, errcode.Unavailable); !le.Retryable() || le.RetryAfter <= 0 {
		t.Fatalf("the Lookup waiting at SIGTERM = %+v; want a retryable UNAVAILABLE with a hint", le)
	}
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if d := time.Since(signaled); d > 6*time.Second {
		t.Fatalf("ledgerd took %s to drain, want little (the Lookup's wait is 30 s, the test's --drain-timeout 10 s)", d)
	}
	if !strings.Contains(p.logs(), "ledgerd draining") {
		t.Fatal("ledgerd did not say it was draining")
	}
}

// TestBearerTokensEndToEnd starts ledgerd with a token file: no token is
// UNAUTHENTICATED, a token acts in its namespace and tenants only.
func TestBearerTokensEndToEnd(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(server.HashToken("billing-secret")+" billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens, "--rate-limit", "1000")
	if strings.Contains(p.logs(), "DEV MODE") {
		t.Fatal("dev mode with a token file")
	}
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	_, err := client.Begin(t.Context(), begin("k"))
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer billing-secret")
	if _, err := client.Begin(ctx, begin("k")); err != nil {
		t.Fatalf("with the token: %v", err)
	}
	other := begin("k")
	other.Tenant = "globex"
	_, err = client.Begin(ctx, other)
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.PermissionDenied {
		t.Fatalf("another tenant: %v", err)
	}
	if reflects(t, conn) {
		t.Fatal("reflection is on with credentials; it is off unless --reflection says otherwise")
	}
}

// TestReflectionFlag: reflection is on in dev mode and off with --reflection=false.
func TestReflectionFlag(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	for flag, want := range map[string]bool{"--reflection=true": true, "--reflection=false": false} {
		p := start(t, "--data-dir", t.TempDir(), flag)
		conn := p.dial(t)
		p.waitServing(t, conn)
		if got := reflects(t, conn); got != want {
			t.Fatalf("%s: reflection served = %v", flag, got)
		}
	}
}

// reflects reports whether the server at conn serves gRPC reflection.
func reflects(t *testing.T, conn *grpc.ClientConn) bool {
	t.Helper()
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// A server without reflection may end the stream before the request
	// is sent: Send then says io.EOF, and Recv has the status.
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	_, err = refl.Recv()
	_ = refl.CloseSend()
	if err != nil && status.Code(err) != codes.Unimplemented {
		t.Fatal(err)
	}
	return err == nil
}

// TestRefusesBadConfiguration: usage errors exit 2 before anything listens.
func TestRefusesBadConfiguration(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	for name, args := range map[string][]string{
		"DevModeOffLoopback":  {"--listen", "0.0.0.0:0"},
		"DevModeAllAddresses": {"--listen", ":0"},
		"HalfTLS":             {"--tls-cert", "x.pem"},
		"AdminTLSWithoutCert": {"--admin-tls"},
		"MigrateWithoutSQL":   {"--migrate"},
		"UnknownFlag":         {"--no-such-flag"},
		"NegativeRateLimit":   {"--rate-limit", "-1"},
		"RecvUnderStreamed":   {"--max-outcome-bytes", "1024", "--max-recv-bytes", "2048"},
		"DevModeAdminOpen":    {"--admin-listen", "0.0.0.0:0"},
		"DevModeHealthOpen":   {"--health-listen", ":0"},
		"NegativeTombstones":  {"--tombstone-retention", "-1h"},
		"TombstonesOverMax":   {"--tombstone-retention", "100h", "--max-tombstone-retention", "10h"},
		"SweepShareZero":      {"--sweep-share", "0"},
		"SweepShareOverOne":   {"--sweep-share", "1.5"},
		"SweepShareNaN":       {"--sweep-share", "NaN"},
		"SweepShareWithSQL":   {"--sweep-share", "0.1", "--database-url", "postgres://ledger@127.0.0.1:1/ledger"},
		"ProcsNumber":         {"--procs", "2"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(binary, append([]string{"--data-dir", t.TempDir()}, args...)...)
			out, err := cmd.CombinedOutput()
			if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 {
				t.Fatalf("exit %v, want 2; output:\n%s", err, out)
			}
		})
	}
	t.Run("Environment", func(t *testing.T) {
		cmd := exec.Command(binary, "--data-dir", t.TempDir())
		cmd.Env = append(os.Environ(), "LEDGER_LISTEN=0.0.0.0:0")
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "loopback") {
			t.Fatalf("LEDGER_LISTEN off loopback in dev mode: exit %d, output:\n%s", cmd.ProcessState.ExitCode(), out)
		}
	})
}

// TestTombstoneRetentionFlag: past its retention a completed key is a
// tombstone (KEY_EXPIRED) by default, and free again with
// --tombstone-retention 0.
func TestTombstoneRetentionFlag(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	for name, tt := range map[string]struct {
		args []string
		want errcode.Code // of the Begin after the retention; 0: a claim
	}{
		"Default": {want: errcode.KeyExpired},
		"Off":     {args: []string{"--tombstone-retention", "0"}},
	} {
		t.Run(name, func(t *testing.T) {
			p := start(t, append([]string{"--data-dir", t.TempDir()}, tt.args...)...)
			conn := p.dial(t)
			p.waitServing(t, conn)
			client := ledgerv1.NewLedgerServiceClient(conn)
			req := begin("k")
			req.Lease, req.Retention = durationpb.New(time.Second), durationpb.New(time.Second)
			res, err := client.Begin(t.Context(), req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: res.GetClaim().GetToken(), Outcome: invoice}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1100 * time.Millisecond) // ledgerd (another process) keeps the wall clock: the 1 s retention must pass
			res, err = client.Begin(t.Context(), req)
			if tt.want == 0 {
				if err != nil || res.GetClaim() == nil {
					t.Fatalf("after the retention without tombstones: %v, %v; want a claim", res, err)
				}
				return
			}
			ledgertest.WantStatus(t, err, tt.want)
		})
	}
}

// TestSweepShareFlag: the embedded store sweeps at the share --sweep-share
// gives, 0.25 without it, and says so as it opens.
func TestSweepShareFlag(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	for _, tt := range []struct {
		args []string
		want string
	}{{nil, `"sweep_share":0.25`}, {[]string{"--sweep-share", "0.05"}, `"sweep_share":0.05`}} {
		p := start(t, append([]string{"--data-dir", t.TempDir()}, tt.args...)...)
		p.waitServing(t, p.dial(t))
		if logs := p.logs(); !strings.Contains(logs, "created a new embedded ledger") || !strings.Contains(logs, tt.want) {
			t.Errorf("with %q, no %s as the store opened:\n%s", tt.args, tt.want, logs)
		}
	}
}

// TestProcsFlag: an idle ledgerd on two Ps (GOMAXPROCS=2) goes down to
// one by itself (on PostgreSQL too: TestPostgreSQLStore), says so at
// debug, and goes back to two while its embedded store sweeps; with
// --procs max it stays on two.
func TestProcsFlag(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	env := []string{"GOMAXPROCS=2"}
	pinned := startEnv(t, env, "--data-dir", t.TempDir(), "--procs", "max")
	auto := startEnv(t, env, "--data-dir", t.TempDir(), "--sweep-interval", "2s")
	procs := func(p *proc) float64 { return metricValue(t, p.metrics(t), "go_sched_gomaxprocs_threads") }
	ledgertest.Eventually(t, 30*time.Second, func() bool { return procs(auto) == 1 }, "an idle ledgerd goes down to one P")
	// ledgerd logs the change after it makes it, and its log reaches the
	// test through a pipe: the line may come after the metric says one P.
	ledgertest.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(auto.logs(), `"msg":"GOMAXPROCS set","procs":1`)
	}, "a debug line for the change to one P")
	// A sweep, every two seconds, holds every P while it runs.
	ledgertest.Eventually(t, 30*time.Second, func() bool {
		return strings.Contains(auto.logs(), `"msg":"GOMAXPROCS set","procs":2,"cores_used":0,"waits":0,"slow_waits":0,"held":true`)
	}, "a sweep puts ledgerd back on two Ps")
	if procs(pinned) != 2 || strings.Contains(pinned.logs(), "GOMAXPROCS set") {
		t.Errorf("--procs max changed its Ps, after the other went down to one:\n%s", pinned.logs())
	}
}

// TestNotServingUntilTheDatabaseAnswers: with a database that is not there,
// ledgerd listens, health says NOT_SERVING, and calls are UNAVAILABLE with
// a retry-after; nothing runs a write.
func TestNotServingUntilTheDatabaseAnswers(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p := start(t, "--database-url", "postgres://ledger@127.0.0.1:1/ledger?connect_timeout=1")
	conn := p.dial(t)
	res, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health = %v, %v; want NOT_SERVING", res, err)
	}
	_, err = ledgerv1.NewLedgerServiceClient(conn).Begin(t.Context(), begin("k"))
	le := ledgerstatus.FromError(err)
	if le == nil || le.Code != errcode.Unavailable || !le.Retryable() || le.RetryAfter <= 0 {
		t.Fatalf("Begin without a database = %v, want UNAVAILABLE with a retry-after", err)
	}
	for _, secret := range []string{"127.0.0.1", ":1", "postgres", "ledger@", "dial", "connect"} {
		if strings.Contains(err.Error(), secret) {
			t.Fatalf("the error %q tells the caller about the database (%q)", err, secret)
		}
	}
	r, err := http.Get("http://" + p.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d, want 503", r.StatusCode)
	}
}

// TestPostgreSQLStore runs ledgerd on PostgreSQL with --migrate: it becomes
// SERVING, sizes its Ps to its load, and a completed key replays from a
// second ledgerd on the same database.
func TestPostgreSQLStore(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	url := pgtest.NewDatabase(t)
	p := startEnv(t, []string{"GOMAXPROCS=2"}, "--database-url", url, "--migrate")
	conn := p.dial(t)
	p.waitServing(t, conn)
	// Without --procs, ledgerd on a SQL store sizes its Ps to its load:
	// idle, one.
	ledgertest.Eventually(t, 30*time.Second, func() bool { return metricValue(t, p.metrics(t), "go_sched_gomaxprocs_threads") == 1 }, "an idle ledgerd on PostgreSQL goes down to one P")
	client := ledgerv1.NewLedgerServiceClient(conn)
	calls := func() float64 { return metricValue(t, p.metrics(t), "idemledger_sql_batched_calls_total") }
	before := calls()
	res, err := client.Begin(t.Context(), begin("k"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "k", Token: res.GetClaim().GetToken(), Outcome: invoice}); err != nil {
		t.Fatal(err)
	}
	// Batching is on by default: both calls went through batches (the
	// readiness canary's claims may share the counters).
	if got := calls() - before; got < 2 {
		t.Errorf("batched calls grew by %v, want at least 2", got)
	}
	m := p.metrics(t)
	for _, want := range []string{"idemledger_sql_batches_total ", "idemledger_sql_batch_busy_seconds_total ", "idemledger_sql_batch_limit ", "idemledger_sql_round_trip_seconds "} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(m, "idemledger_pebble_") {
		t.Error("ledgerd on a SQL store exports the embedded store's metrics")
	}

	q := start(t, "--database-url", url)
	conn = q.dial(t)
	q.waitServing(t, conn)
	replay, err := ledgerv1.NewLedgerServiceClient(conn).Begin(t.Context(), begin("k"))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(invoice, replay.GetReplay().GetOutcome(), protocmp.Transform()); d != "" {
		t.Fatalf("replay from the second ledgerd (-want +got):\n%s", d)
	}
	r, err := http.Get("http://" + q.admin + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("/readyz = %d, want 200", r.StatusCode)
	}
}

// TestMutualTLSEndToEnd starts ledgerd with TLS, a client CA and a table
// of certificate principals: a client certificate that names a principal
// acts for its tenants, and a client without one is refused at the
// handshake.
func TestMutualTLSEndToEnd(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	dir := t.TempDir()
	ca := servertest.NewCA(t)
	certFile, keyFile := servertest.WriteFiles(t, dir, "server", ca.Issue(t, servertest.Leaf{CommonName: "ledgerd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true}))
	caFile, certsFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "certs")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certsFile, []byte("uri:spiffe://platform.test/billing billing acme\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, "--data-dir", filepath.Join(dir, "data"), "--tls-cert", certFile, "--tls-key", keyFile, "--client-ca", caFile, "--certs", certsFile,
		"--health-listen", "127.0.0.1:0")
	// Kubelet's gRPC probes speak plaintext: the health port answers them.
	probe, err := grpc.NewClient(p.health, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	p.waitServing(t, probe)
	if _, err := ledgerv1.NewLedgerServiceClient(probe).Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("the health port serves the ledger: %v", err)
	}
	call := func(certs ...tls.Certificate) error {
		conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = ledgerv1.NewLedgerServiceClient(conn).Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
		return err
	}
	err = call(ca.Issue(t, servertest.Leaf{URIs: []string{"spiffe://platform.test/billing"}}))
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.NotFound {
		t.Fatalf("with the billing certificate: %v, want NOT_FOUND", err)
	}
	err = call(ca.Issue(t, servertest.Leaf{URIs: []string{"spiffe://platform.test/other"}}))
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.Unauthenticated {
		t.Fatalf("with an unknown certificate: %v, want UNAUTHENTICATED", err)
	}
	if err := call(); status.Code(err) != codes.Unavailable {
		t.Fatalf("without a certificate: %v, want the handshake refused", err)
	}
}

// TestMessageSizeLimit: a request above --max-recv-bytes is refused by gRPC
// (RESOURCE_EXHAUSTED) and stores nothing.
func TestMessageSizeLimit(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p := start(t, "--data-dir", t.TempDir(), "--max-outcome-bytes", "1024", "--max-recv-bytes", "70000")
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	res, err := client.Begin(t.Context(), begin("big"))
	if err != nil {
		t.Fatal(err)
	}
	// Over the outcome limit, the ledger refuses it typed; over the
	// receive limit gRPC refuses it before the ledger sees it, and the
	// client's decoder types that refusal: both are OUTCOME_TOO_LARGE,
	// permanent, never a retryable RESOURCE_EXHAUSTED.
	for _, size := range []int{4096, 80000} {
		big := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: make([]byte, size)}}}
		_, err = client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "big", Token: res.GetClaim().GetToken(), Outcome: big})
		if le := ledgerstatus.FromError(err); le.Code != errcode.OutcomeTooLarge || le.Retryable() {
			t.Fatalf("a %d-byte outcome over the limits = %v (%+v), want a permanent OUTCOME_TOO_LARGE", size, err, le)
		}
	}
	look, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "big"})
	if err != nil || look.GetRecord().GetState() != ledgerv1.State_STATE_IN_PROGRESS {
		t.Fatalf("the record after the refused Complete = %v, %v", look, err)
	}

	// By default the receive limit leaves room for four times the outcome
	// limit: the ledger itself refuses such an outcome, typed on the wire
	// (an ErrorDetail any client reads), not gRPC's bare RESOURCE_EXHAUSTED.
	q := start(t, "--data-dir", t.TempDir(), "--max-outcome-bytes", "65536")
	qconn := q.dial(t)
	q.waitServing(t, qconn)
	qc := ledgerv1.NewLedgerServiceClient(qconn)
	res, err = qc.Begin(t.Context(), begin("big"))
	if err != nil {
		t.Fatal(err)
	}
	big := &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{TypeUrl: "type.googleapis.com/x.Y", Value: make([]byte, 4*65536)}}}
	_, err = qc.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "big", Token: res.GetClaim().GetToken(), Outcome: big})
	if le := ledgerstatus.FromError(err); !ledgerstatus.IsTyped(err) || le.Code != errcode.OutcomeTooLarge || le.Retryable() {
		t.Fatalf("an outcome four times the limit = %v; want OUTCOME_TOO_LARGE typed by the ledger, permanent", err)
	}
}

// TestMigrateJob: ledgerd migrate applies the schema and exits 0, and
// again (a Job that runs twice) changes nothing and exits 0; homes without
// apply or print is a usage error.
func TestMigrateJob(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	url := pgtest.NewDatabase(t)
	for i := range 2 {
		out, err := exec.Command(binary, "migrate", "--database-url", url).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "schema migrated") {
			t.Fatalf("run %d: %v\n%s", i, err, out)
		}
		if i == 1 && !strings.Contains(string(out), `"applied":null`) && !strings.Contains(string(out), `"applied":[]`) {
			t.Fatalf("the second run applied something:\n%s", out)
		}
	}
	cmd := exec.Command(binary, "homes", "--database-url", url)
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "homes takes apply or print") {
		t.Fatalf("ledgerd homes: exit %d\n%s", cmd.ProcessState.ExitCode(), out)
	}
	p := start(t, "--database-url", url)
	p.waitServing(t, p.dial(t))
}

// TestRefusesAnEmptiedEmbeddedStore: ledgerd on a data directory whose
// store was removed (or replaced by an empty one) exits 1 with a clear
// message instead of serving an empty ledger; a first start on an empty
// directory just works.
func TestRefusesAnEmptiedEmbeddedStore(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	dir := t.TempDir()
	p := start(t, "--data-dir", dir)
	p.waitServing(t, p.dial(t))
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("first start: exit %d", code)
	}
	if err := os.RemoveAll(filepath.Join(dir, pebble.DirName)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "--listen", "127.0.0.1:0", "--admin-listen", "", "--http-listen", "", "--data-dir", dir)
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "holds no ledger") {
		t.Fatalf("on an emptied store: exit %d, output:\n%s", cmd.ProcessState.ExitCode(), out)
	}
}

// TestSIGHUPReloadsCredentials: a token file rewritten and signalled with
// SIGHUP takes effect without a restart: the old token is refused and the
// new one accepted; a reload that fails (a file others may write) keeps
// the tokens in force. A file others may write is refused at start too.
func TestSIGHUPReloadsCredentials(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	tokens := filepath.Join(t.TempDir(), "tokens")
	write := func(token string, mode os.FileMode) {
		t.Helper()
		if err := os.WriteFile(tokens, []byte(server.HashToken(token)+" billing acme\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(tokens, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("old-secret", 0o666)
	cmd := exec.Command(binary, "--listen", "127.0.0.1:0", "--admin-listen", "", "--http-listen", "", "--data-dir", t.TempDir(), "--tokens", tokens)
	if out, _ := cmd.CombinedOutput(); cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "writable") {
		t.Fatalf("a token file others may write: exit %d, output:\n%s", cmd.ProcessState.ExitCode(), out)
	}
	write("old-secret", 0o600)
	p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens)
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	lookup := func(token string) errcode.Code {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer "+token)
		_, err := client.Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
		return ledgerstatus.FromError(err).Code
	}
	if lookup("old-secret") != errcode.NotFound || lookup("new-secret") != errcode.Unauthenticated {
		t.Fatal("before the reload: want the old token accepted and the new one refused")
	}
	hup := func(want string) {
		t.Helper()
		before := strings.Count(p.logs(), want)
		if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		ledgertest.Eventually(t, 10*time.Second, func() bool { return strings.Count(p.logs(), want) > before }, "no %q in the log after SIGHUP", want)
	}
	write("new-secret", 0o600)
	hup("credentials reloaded")
	if lookup("old-secret") != errcode.Unauthenticated || lookup("new-secret") != errcode.NotFound {
		t.Fatal("after the reload: want the new token accepted and the old one refused")
	}
	write("third-secret", 0o622)
	hup("credentials not reloaded")
	if lookup("new-secret") != errcode.NotFound || lookup("third-secret") != errcode.Unauthenticated {
		t.Fatal("after a failed reload: want the tokens in force kept")
	}
}

// metricValue reads a sample without labels from a text exposition.
func metricValue(t testing.TB, exposition, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(exposition, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in the metrics", name)
	return 0
}

// TestReadinessFollowsWrites: a database that still answers reads but
// refuses every write (here a trigger that raises SQLSTATE 53100, disk
// full) turns /readyz to 503 and gRPC health to NOT_SERVING, and back
// when writes work again. A ping alone (a read) stayed green.
func TestReadinessFollowsWrites(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	url := pgtest.NewDatabase(t)
	p := start(t, "--database-url", url, "--migrate")
	conn := p.dial(t)
	p.waitServing(t, conn)
	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.WithoutCancel(t.Context())) })
	for _, q := range []string{
		`CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = '53100'; END $$`,
		`CREATE TRIGGER disk_full BEFORE INSERT OR UPDATE ON idempotency_records FOR EACH ROW EXECUTE FUNCTION disk_full()`,
	} {
		if _, err := db.Exec(t.Context(), q); err != nil {
			t.Fatal(err)
		}
	}
	ready := func() int {
		r, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	waitFor := func(want int) {
		t.Helper()
		ledgertest.Eventually(t, 20*time.Second, func() bool { return ready() == want }, "/readyz did not turn %d", want)
	}
	waitFor(http.StatusServiceUnavailable)
	res, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("gRPC health with writes failing = %v, %v; want NOT_SERVING", res, err)
	}
	if _, err := db.Exec(t.Context(), `DROP TRIGGER disk_full ON idempotency_records`); err != nil {
		t.Fatal(err)
	}
	waitFor(http.StatusOK)
}

// TestPreAuthenticationBounds: what a caller can make ledgerd spend before
// it is authenticated is bounded. A call with more metadata than
// server.MaxHeaderListBytes is refused before it is read into a call;
// past --max-connections new connections wait in the backlog while
// /metrics still answers; and every line ledgerd writes, gRPC's own
// included (a client that speaks no HTTP/2), is one JSON object.
func TestPreAuthenticationBounds(t *testing.T) {
	p := start(t, "--data-dir", t.TempDir(), "--max-connections", "2")
	conn := p.dial(t)
	p.waitServing(t, conn) // one connection
	client := ledgerv1.NewLedgerServiceClient(conn)

	big := metadata.AppendToOutgoingContext(t.Context(), "x-padding", strings.Repeat("x", 256<<10))
	if _, err := client.Lookup(big, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); err == nil {
		t.Fatal("a call with 256 KiB of metadata was served")
	}
	if _, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); ledgerstatus.FromError(err).Code != errcode.NotFound {
		t.Fatalf("after the refused call: %v", err)
	}

	// A client that speaks no HTTP/2: gRPC logs its greeting (as JSON,
	// below) and closes the connection.
	raw, err := net.Dial("tcp", p.grpc)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_, _ = raw.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	ledgertest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(p.logs(), "bogus greeting") }, "gRPC logs the greeting it cannot read")
	// A client that says nothing takes the second place; a third
	// connection, queued after it in the listener's backlog, waits: its
	// call runs out of time.
	silent, err := net.Dial("tcp", p.grpc)
	if err != nil {
		t.Fatal(err)
	}
	third, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := ledgerv1.NewLedgerServiceClient(third).Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a connection past --max-connections: %v, want its call to wait past its deadline", err)
	}
	if m := p.metrics(t); !strings.Contains(m, "idemledger_decisions_total") && !strings.Contains(m, "grpc_server_handled_total") {
		t.Fatal("/metrics did not answer past the connection limit")
	}
	_ = silent.Close() // a place frees up: the waiting connection is served
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := ledgerv1.NewLedgerServiceClient(third).Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}, grpc.WaitForReady(true)); ledgerstatus.FromError(err).Code != errcode.NotFound {
		t.Fatalf("once a connection closed: %v", err)
	}
	if !strings.Contains(p.logs(), `"logger":"grpc"`) {
		t.Errorf("gRPC logged nothing of the client that spoke no HTTP/2:\n%s", p.logs())
	}
	for _, line := range strings.Split(strings.TrimSpace(p.logs()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a log line is not JSON: %q", line)
		}
	}
}

// TestLogsDoNotAmplify: a call that fails UNAVAILABLE is logged once (it
// was logged by the server and again by the logging interceptor), with
// the cause callers are not told; and a hundred calls without valid
// credentials make one INFO line, not a hundred.
func TestLogsDoNotAmplify(t *testing.T) {
	t.Run("Unavailable", func(t *testing.T) {
		url := pgtest.NewDatabase(t)
		p := start(t, "--database-url", url, "--migrate", "--log-level", "info")
		conn := p.dial(t)
		p.waitServing(t, conn)
		db, err := pgx.Connect(t.Context(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close(context.WithoutCancel(t.Context())) })
		if _, err := db.Exec(t.Context(), `CREATE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'; END $$;
			CREATE TRIGGER disk_full BEFORE INSERT OR UPDATE ON idempotency_records FOR EACH ROW EXECUTE FUNCTION disk_full()`); err != nil {
			t.Fatal(err)
		}
		_, err = ledgerv1.NewLedgerServiceClient(conn).Begin(t.Context(), begin("once"))
		ledgertest.WantStatus(t, err, errcode.Unavailable)
		p.logBarrier(t.Context(), t, conn)
		var lines []string
		for _, line := range strings.Split(p.logs(), "\n") {
			if strings.Contains(line, `"grpc.method":"Begin"`) || strings.Contains(line, "ledger call failed") {
				lines = append(lines, line)
			}
		}
		if len(lines) != 1 || !strings.Contains(lines[0], `"error.cause"`) || !strings.Contains(lines[0], "53100") {
			t.Fatalf("the failed Begin is logged %d times, want once with its cause:\n%s", len(lines), strings.Join(lines, "\n"))
		}
	})
	t.Run("NoCredentials", func(t *testing.T) {
		tokens := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(tokens, []byte(server.HashToken("s3cret")+" billing acme\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		p := start(t, "--data-dir", t.TempDir(), "--tokens", tokens, "--log-level", "info")
		conn := p.dial(t)
		client := ledgerv1.NewLedgerServiceClient(conn)
		for range 100 {
			_, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"})
			ledgertest.WantStatus(t, err, errcode.Unauthenticated)
		}
		p.logBarrier(metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer s3cret"), t, conn)
		n := 0
		for _, line := range strings.Split(p.logs(), "\n") {
			if strings.Contains(line, `"Unauthenticated"`) || strings.Contains(line, "code = Unauthenticated") || strings.Contains(line, "refused for their credentials") {
				n++
			}
		}
		if n > 1 {
			t.Fatalf("100 unauthenticated calls made %d log lines:\n%s", n, p.logs())
		}
		if !strings.Contains(p.logs(), "calls refused for their credentials") {
			t.Fatal("no summary of the refused calls")
		}
	})
}

// TestStreamCallsAreCounted: a call carried on a Stream (ledgerclient, as
// write services call) is counted in grpc_server_* under its unary
// method, as the unary call would be; a client that goes away ends its
// Stream CANCELED, logged below ERROR.
func TestStreamCallsAreCounted(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	p := start(t, "--data-dir", t.TempDir(), "--log-level", "debug")
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
	res, err := client.Begin(t.Context(), begin("k-stream"))
	if err != nil || res.GetClaim() == nil {
		t.Fatalf("Begin on a Stream = %v, %v", res, err)
	}
	_, err = client.Begin(t.Context(), begin("k-stream"))
	ledgertest.WantStatus(t, err, errcode.InProgress)
	m := p.metrics(t)
	for _, want := range []string{
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Begin",grpc_service="idemledger.v1.LedgerService",grpc_type="unary"} 1`,
		`grpc_server_handled_total{grpc_code="Aborted",grpc_method="Begin",grpc_service="idemledger.v1.LedgerService",grpc_type="unary"} 1`,
		`grpc_server_handling_seconds_count{grpc_method="Begin",grpc_service="idemledger.v1.LedgerService",grpc_type="unary"} 2`,
		`idemledger_build_info{goversion="go`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	_ = client.Close()
	_ = conn.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, line := range strings.Split(p.logs(), "\n") {
		if strings.Contains(line, "Stream") && (strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"Unknown"`)) {
			t.Errorf("the Stream's end was logged as a failure: %s", line)
		}
	}
}

// TestIdleOnAReadOnlyDatabase: an idle ledgerd whose database refuses
// writes (default_transaction_read_only) reports NOT_SERVING, and its
// readiness canary backs off: over a few seconds it costs the database a
// handful of transactions, not hundreds a second.
func TestIdleOnAReadOnlyDatabase(t *testing.T) {
	t.Parallel() // shares nothing with the other tests: its own processes, ports, directories and database
	url := pgtest.NewDatabase(t)
	p := start(t, "--database-url", url, "--migrate")
	p.waitServing(t, p.dial(t))
	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close(context.WithoutCancel(t.Context())) })
	var name string
	if err := db.QueryRow(t.Context(), `SELECT current_database()`).Scan(&name); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(t.Context(), `ALTER DATABASE `+name+` SET default_transaction_read_only = on`); err != nil {
		t.Fatal(err)
	}
	// Sessions read the setting when they start: end ledgerd's.
	if _, err := db.Exec(t.Context(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, name); err != nil {
		t.Fatal(err)
	}
	ledgertest.Eventually(t, 20*time.Second, func() bool { return metricValue(t, p.metrics(t), "idemledger_ready") == 0 }, "ledgerd stayed ready on a read-only database")
	xacts := func() int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(t.Context(), `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	_, _ = db.Exec(t.Context(), `SELECT pg_stat_clear_snapshot()`)
	before := xacts()
	time.Sleep(4 * time.Second) // count the idle ledgerd's transactions over 4 s of real time: the subject of the test
	_, _ = db.Exec(t.Context(), `SELECT pg_stat_clear_snapshot()`)
	after := xacts()
	t.Logf("%d transactions in 4 s", after-before)
	if after-before > 40 {
		t.Fatalf("an idle ledgerd on a read-only database made %d transactions in 4 s; want its canary to back off", after-before)
	}
}

// TestConnectionFloodLeavesRoom: 200 idle TCP connections, held open and
// sending nothing, on each of the gRPC and HTTP listeners of a ledgerd
// with --max-connections 50. A new client is served within its 5 s
// deadline all the same: it takes the place of an idle connection, which
// is shed and counted. A connection with a call in flight (a Lookup
// waiting on a running key, which sends nothing meanwhile) is not shed.
func TestConnectionFloodLeavesRoom(t *testing.T) {
	p := start(t, "--data-dir", t.TempDir(), "--max-connections", "50")
	conn := p.dial(t)
	p.waitServing(t, conn)
	client := ledgerv1.NewLedgerServiceClient(conn)
	claim, err := client.Begin(t.Context(), begin("running"))
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		res, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "running", Wait: durationpb.New(20 * time.Second)})
		if err == nil && res.GetRecord().GetState() != ledgerv1.State_STATE_COMPLETED {
			err = fmt.Errorf("the waiting Lookup answered %v", res)
		}
		waited <- err
	}()
	ledgertest.Eventually(t, 10*time.Second, func() bool { return strings.Contains(p.metrics(t), "idemledger_lookup_waiters 1") }, "the Lookup never waited")
	for _, addr := range []string{p.grpc, p.http} {
		for range 200 {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}
	fresh, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := ledgerv1.NewLedgerServiceClient(fresh).Lookup(ctx, &ledgerv1.LookupRequest{Tenant: "acme", Key: "k"}); ledgerstatus.FromError(err).Code != errcode.NotFound {
		t.Fatalf("a new gRPC client under a flood of idle connections: %v; want its answer (NOT_FOUND) within 5 s", err)
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	res, err := hc.Post("http://"+p.http+"/idemledger.v1.LedgerService/Lookup", "application/json", strings.NewReader(`{"tenant":"acme","key":"k"}`))
	if err != nil {
		t.Fatalf("a new HTTP client under a flood of idle connections: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		t.Fatalf("a new HTTP client under a flood: %d, want 404 (no record)", res.StatusCode)
	}
	if _, err := client.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: "running", Token: claim.GetClaim().GetToken(), Outcome: invoice}); err != nil {
		t.Fatalf("Complete on the busy connection after the flood: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the Lookup waiting through the flood: %v", err)
	}
	m := p.metrics(t)
	for _, l := range []string{"grpc", "http"} {
		if n := metricValue(t, m, `idemledger_connections_shed_total{listener="`+l+`"}`); n < 1 {
			t.Errorf("%s: %v idle connections shed; want some", l, n)
		}
	}
}
