package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/ledger/memory"
)

// fullDisk is a store that reads but, while full is set, writes nothing:
// the embedded store on a full disk.
type fullDisk struct {
	*memory.Store
	full atomic.Bool
}

var errNoSpace = ledger.Unavailable(errors.New("pebble: write: no space left on device"))

func (s *fullDisk) Claim(ctx context.Context, p ledger.ClaimParams) (ledger.ClaimResult, error) {
	if s.full.Load() {
		return ledger.ClaimResult{}, errNoSpace
	}
	return s.Store.Claim(ctx, p)
}

func (s *fullDisk) Ping(context.Context) error { return nil }

// TestReadinessNeedsAWrite: the health watcher turns NOT_SERVING when the
// store's pings (reads) work but its writes fail, and SERVING again when
// they work.
func TestReadinessNeedsAWrite(t *testing.T) {
	st := newLateStore(config{}, slog.New(slog.DiscardHandler))
	fd := &fullDisk{Store: memory.New(memory.Config{})}
	var s store = fd
	st.s.Store(&s)
	close(st.opened)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING) // as ledgerd starts
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { watchHealth(ctx, st, h, slog.New(slog.DiscardHandler)); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want healthpb.HealthCheckResponse_ServingStatus, within time.Duration) {
		t.Helper()
		// The health watch runs on its own goroutine: poll its answer.
		ledgertest.Eventually(t, within, func() bool {
			res, err := h.Check(t.Context(), &healthpb.HealthCheckRequest{})
			return err == nil && res.GetStatus() == want
		}, "health is %s", want)
	}
	waitFor(healthpb.HealthCheckResponse_SERVING, 2*time.Second)
	fd.full.Store(true)
	waitFor(healthpb.HealthCheckResponse_NOT_SERVING, 8*time.Second)
	fd.full.Store(false)
	waitFor(healthpb.HealthCheckResponse_SERVING, 2*time.Second)
}

func (s *fullDisk) Run(ctx context.Context, _ func(error)) error { <-ctx.Done(); return nil }

// failed is a store that failed for good: its Ping says it must be
// reopened (the embedded store after a failed write of its log).
type failed struct{ fullDisk }

func (*failed) Ping(context.Context) error {
	return ledger.Unavailable(fmt.Errorf("%w: pebble: fatal commit error: no space left on device", ledger.ErrMustRestart))
}

// TestLivenessAsksForARestart: /healthz is 200 while the store works or
// is merely full, and 503 once the store says only a restart mends it, so
// that the supervisor restarts ledgerd; the health listener's "liveness"
// service (the Kubernetes liveness probe's) says the same.
func TestLivenessAsksForARestart(t *testing.T) {
	st := newLateStore(config{}, slog.New(slog.DiscardHandler))
	h := health.NewServer()
	con, err := console.New(console.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := startAdmin("127.0.0.1:0", nil, prometheus.NewRegistry(), h, st.mustRestart, con, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	p := probes{Server: h, mustRestart: st.mustRestart}
	live := func() int {
		t.Helper()
		r, err := http.Get("http://" + srv.Addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		res, err := p.Check(t.Context(), &healthpb.HealthCheckRequest{Service: livenessService})
		if err != nil {
			t.Fatal(err)
		}
		if grpcLive := res.GetStatus() == healthpb.HealthCheckResponse_SERVING; grpcLive != (r.StatusCode == http.StatusOK) {
			t.Fatalf("/healthz answers %d, the liveness service %v", r.StatusCode, res.GetStatus())
		}
		return r.StatusCode
	}
	if got := live(); got != http.StatusOK {
		t.Fatalf("/healthz before the store opens = %d, want 200", got)
	}
	var s store = &fullDisk{Store: memory.New(memory.Config{})}
	s.(*fullDisk).full.Store(true)
	st.s.Store(&s)
	if got := live(); got != http.StatusOK {
		t.Fatalf("/healthz with a full disk = %d, want 200", got)
	}
	// Watch says the same as Check, and says the change.
	watch := watchLiveness(t, p)
	if res, err := watch.Recv(); err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Watch(liveness) = %v, %v; want SERVING", res, err)
	}
	s = &failed{fullDisk{Store: memory.New(memory.Config{})}}
	st.s.Store(&s)
	if got := live(); got != http.StatusServiceUnavailable {
		t.Fatalf("/healthz with a failed store = %d, want 503", got)
	}
	if res, err := watch.Recv(); err != nil || res.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch(liveness) after the store failed = %v, %v; want NOT_SERVING", res, err)
	}
}

// watchLiveness serves p on loopback and watches its liveness service.
func watchLiveness(t *testing.T, p probes) healthpb.Health_WatchClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, p)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	watch, err := healthpb.NewHealthClient(conn).Watch(t.Context(), &healthpb.HealthCheckRequest{Service: livenessService})
	if err != nil {
		t.Fatal(err)
	}
	return watch
}
