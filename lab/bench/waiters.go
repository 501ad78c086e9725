package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// WaitersWorkload is the workload of Waiters' results.
const WaitersWorkload = "lookup-wait"

// WaitersTarget names the result of Waiters over api.
func WaitersTarget(api string) string { return "ledgerd/embedded waiters (" + api + ")" }

// Waiters starts the ledgerd binary bin on its embedded store in a
// temporary directory, holds n keys in progress, and sends n Lookups that
// wait for them from this process: through ledgerclient, messages on one
// Stream, as a write service's guard sends them (api "stream"), or as
// unary calls, 250 a connection, under ledgerd's MaxConcurrentStreams of
// 256 (api "unary"). Once ledgerd counts every waiter, it reads what they
// added to its resident memory (VmRSS): the result's RSSAboveIdleMB, with
// WaitersTarget(api), WaitersWorkload, n clients, and the time the
// waiters took to register as its Seconds.
func Waiters(ctx context.Context, bin string, n int, api string) (Result, error) {
	if api != "stream" && api != "unary" {
		return Result{}, fmt.Errorf("bench: waiters over %q: stream or unary", api)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir, err := os.MkdirTemp("", "ledgerbench-waiters-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(dir)
	p, err := startLedgerd(ctx, bin, "--data-dir", dir)
	if err != nil {
		return Result{}, err
	}
	defer p.stop()
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return Result{}, err
	}
	defer conn.Close()
	if err := waitServing(ctx, conn); err != nil {
		return Result{}, err
	}
	if err := holdKeys(ctx, ledgerv1.NewLedgerServiceClient(conn), n); err != nil {
		return Result{}, err
	}
	idle, err := p.rss()
	if err != nil {
		return Result{}, err
	}

	wait, stopWaiting := context.WithCancel(ctx)
	var calls sync.WaitGroup
	defer func() { stopWaiting(); calls.Wait() }()
	failed := make(chan error, 1) // the first Lookup that ended before the waits were ended
	lookup := func(client ledgerv1.LedgerServiceClient, i int) {
		calls.Go(func() {
			_, err := client.Lookup(wait, &ledgerv1.LookupRequest{Tenant: "acme", Key: heldKey(i), Wait: durationpb.New(time.Minute)})
			if wait.Err() == nil {
				err = cmp.Or(err, errors.New("it answered without waiting"))
				select {
				case failed <- fmt.Errorf("bench: a Lookup of %s ended while its key was held: %w", heldKey(i), err):
				default:
				}
			}
		})
	}
	start := time.Now()
	if api == "stream" {
		client := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
		defer client.Close()
		for i := range n {
			lookup(client, i)
		}
	} else {
		var conns []*grpc.ClientConn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for first := 0; first < n; first += 250 {
			c, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return Result{}, err
			}
			conns = append(conns, c)
			client := ledgerv1.NewLedgerServiceClient(c)
			for i := first; i < min(first+250, n); i++ {
				lookup(client, i)
			}
		}
	}
	// ledgerd's gauge says when every waiter is registered.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(time.Minute); ; {
		v, err := p.metric("idemledger_lookup_waiters")
		if err != nil {
			return Result{}, err
		}
		if v >= float64(n) {
			break
		}
		if time.Now().After(deadline) {
			return Result{}, fmt.Errorf("bench: %v of %d waiters registered within a minute", v, n)
		}
		select {
		case <-tick.C:
		case err := <-failed:
			return Result{}, err
		case <-ctx.Done():
			return Result{}, ctx.Err()
		}
	}
	took := time.Since(start).Seconds()
	used, err := p.rss()
	if err != nil {
		return Result{}, err
	}
	return Result{Target: WaitersTarget(api), Workload: WaitersWorkload, Clients: n, Ops: int64(n), Seconds: took,
		PerSecond: float64(n) / took, RSSAboveIdleMB: float64(used-idle) / (1 << 20)}, nil
}

// heldKey is the i-th key holdKeys holds.
func heldKey(i int) string { return "held-" + strconv.Itoa(i) }

// holdKeys claims n keys, heldKey(0) … heldKey(n-1), and leaves them in
// progress.
func holdKeys(ctx context.Context, client ledgerv1.LedgerServiceClient, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for w := range 64 {
		wg.Go(func() {
			for i := w; i < n; i += 64 {
				if _, err := client.Begin(ctx, &ledgerv1.BeginRequest{Tenant: "acme", Key: heldKey(i), Fingerprint: fingerprint, Method: method}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// waitServing waits for ledgerd's gRPC health to say SERVING.
func waitServing(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: ledgerv1.LedgerService_ServiceDesc.ServiceName})
	if err != nil {
		return err
	}
	for {
		msg, err := res.Recv()
		if err != nil {
			return fmt.Errorf("bench: ledgerd's health never said SERVING: %w", err)
		}
		if msg.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// ledgerdProc is a ledgerd the benchmark started.
type ledgerdProc struct {
	cmd         *exec.Cmd
	grpc, admin string
	exited      chan struct{}
}

// startLedgerd runs bin with args on loopback ports of its own choosing
// and waits until it says where it listens.
func startLedgerd(ctx context.Context, bin string, args ...string) (*ledgerdProc, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", ""}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &ledgerdProc{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan struct{})
	var last string // ledgerd's last line, to say why it ended
	go func() {
		defer close(p.exited)
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			last = lines.Text()
			var line struct{ Msg, GRPC, Admin string }
			if json.Unmarshal(lines.Bytes(), &line) == nil && line.Msg == "ledgerd listening" {
				p.grpc, p.admin = line.GRPC, line.Admin
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	select {
	case <-ready:
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("bench: ledgerd exited before it listened: %s", last)
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, errors.New("bench: ledgerd did not listen within 30 s")
	}
}

// stop kills ledgerd and waits for it.
func (p *ledgerdProc) stop() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// RSS is the resident memory (VmRSS) of process pid ("self": this one),
// in bytes.
func RSS(pid string) (int64, error) {
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("bench: no VmRSS in /proc/%s/status", pid)
}

// rss is ledgerd's resident memory in bytes.
func (p *ledgerdProc) rss() (int64, error) { return RSS(strconv.Itoa(p.cmd.Process.Pid)) }

// metric is the value of a metric without labels that ledgerd exports.
func (p *ledgerdProc) metric(name string) (float64, error) {
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("bench: no %s in ledgerd's metrics", name)
}
