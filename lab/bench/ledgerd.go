package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

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
	p, err := startLedgerd(ctx, bin, "--data-dir", dir)
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+l.p.admin+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("bench: ledgerd's /metrics answered %s", res.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		return 0, 0, err
	}
	f, ok := families[walSyncs]
	if !ok || len(f.GetMetric()) != 1 {
		return 0, 0, fmt.Errorf("bench: ledgerd's /metrics has no %s", walSyncs)
	}
	h := f.GetMetric()[0].GetHistogram()
	return h.GetSampleCount(), time.Duration(h.GetSampleSum() * float64(time.Second)), nil
}
