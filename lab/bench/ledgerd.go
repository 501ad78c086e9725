package bench

import (
	"bufio"
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
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
)

// Ledgerd is a ledgerd process on its embedded store, started as the
// README starts it (its defaults, dev mode, on loopback): the store as its
// users run it, through every interceptor of the daemon, in a process of
// its own beside its clients' as a Redis is.
type Ledgerd struct {
	p *ledgerdProc
	// Conn reaches its gRPC listener with ledgerclient's dial options.
	Conn *grpc.ClientConn
}

// StartLedgerd starts bin with its data in dir and waits until it serves.
func StartLedgerd(ctx context.Context, bin, dir string) (*Ledgerd, error) {
	p, err := startLedgerd(ctx, bin, dir)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(p.grpc, append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		p.stop()
		return nil, err
	}
	if err := waitServing(ctx, conn); err != nil {
		_ = conn.Close()
		p.stop()
		return nil, err
	}
	return &Ledgerd{p: p, Conn: conn}, nil
}

// Pid is the process's id.
func (l *Ledgerd) Pid() int { return l.p.cmd.Process.Pid }

// Stop closes the connection and kills the process.
func (l *Ledgerd) Stop() {
	_ = l.Conn.Close()
	l.p.stop()
}

// walSyncs is the metric of the embedded store's log syncs.
const walSyncs = "idemledger_pebble_wal_sync_seconds"

// WALSyncs reads the log's syncs since the process started, and the time
// they took, from its metrics (what pebble.Store.WALSyncs gives in
// process).
func (l *Ledgerd) WALSyncs() (uint64, time.Duration, error) {
	m, err := l.p.metric(context.Background(), walSyncs)
	if err != nil {
		return 0, 0, err
	}
	h := m.GetHistogram()
	return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second)), nil
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

// startLedgerd runs bin on its embedded store in dir, on loopback ports
// of its own choosing, and waits until it says where it listens.
func startLedgerd(ctx context.Context, bin, dir string) (*ledgerdProc, error) {
	cmd := exec.CommandContext(ctx, bin, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--http-listen", "", "--data-dir", dir)
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

// metric reads the metric without labels that ledgerd exports as name.
func (p *ledgerdProc) metric(ctx context.Context, name string) (*dto.Metric, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: ledgerd's /metrics answered %s", res.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return nil, err
	}
	if f := families[name]; f != nil && len(f.GetMetric()) == 1 {
		return f.GetMetric()[0], nil
	}
	return nil, fmt.Errorf("bench: no %s in ledgerd's metrics", name)
}
