package main

// Health: the readiness canary's watch, and the liveness service of the
// health listener.

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// livenessService is the grpc.health.v1 service a liveness probe asks for:
// SERVING unless the store must be reopened by a restart, as /healthz.
const livenessService = "liveness"

// probes is grpc.health.v1 as ledgerd serves it: livenessService answers
// what /healthz answers (a liveness probe on the health listener, which
// the NetworkPolicy opens to the kubelet, needs no admin port), every
// other service what the health server holds (readiness: the canary).
type probes struct {
	*health.Server
	mustRestart func(context.Context) error
}

func (p probes) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.GetService() != livenessService {
		return p.Server.Check(ctx, req)
	}
	status := healthpb.HealthCheckResponse_SERVING
	if p.mustRestart(ctx) != nil { // said as the status, not as the call's error
		status = healthpb.HealthCheckResponse_NOT_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: status}, nil
}

// Watch is Check as a stream: for livenessService the status now, and
// again each time it changes (looked at every second; it changes once at
// most, to NOT_SERVING, when the store must be reopened); for every other
// service the health server's own.
func (p probes) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if req.GetService() != livenessService {
		return p.Server.Watch(req, stream)
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	last := healthpb.HealthCheckResponse_UNKNOWN
	for {
		res, err := p.Check(stream.Context(), req)
		if err != nil {
			return err
		}
		if res.GetStatus() != last {
			if err := stream.Send(res); err != nil {
				return err
			}
			last = res.GetStatus()
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-tick.C:
		}
	}
}

// watchHealth reports SERVING while the store takes a write (the canary),
// checked at once and then every few seconds, and NOT_SERVING otherwise:
// a store that reads but cannot write (a full disk, a read-only database)
// is not ready. While the store refuses writes the checks back off, from
// half a second to the serving pace, so that an idle ledgerd costs a
// failing database a write every few seconds, not a loop of them.
func watchHealth(ctx context.Context, st *lateStore, h *health.Server, log *slog.Logger) {
	const servingPause, firstRetry = 5 * time.Second, 500 * time.Millisecond
	serving := false
	canary := newCanary()
	retry := firstRetry
	opened := st.opened // wakes the watch once, when the store opens
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := st.Ping(pctx)
		if err == nil {
			err = st.canaryWrite(pctx, canary)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		status := healthpb.HealthCheckResponse_SERVING
		if err != nil {
			status = healthpb.HealthCheckResponse_NOT_SERVING
		}
		if (err == nil) != serving {
			serving = err == nil
			h.SetServingStatus("", status)
			h.SetServingStatus(ledgerv1.LedgerService_ServiceDesc.ServiceName, status)
			if err != nil {
				log.WarnContext(ctx, "store not answering: NOT_SERVING", "error", err)
			} else {
				log.InfoContext(ctx, "store answering: SERVING")
			}
		}
		pause := servingPause
		if serving {
			retry = firstRetry
		} else {
			pause, retry = retry, min(2*retry, servingPause)
		}
		select {
		case <-ctx.Done():
			return
		case <-opened:
			opened = nil // closed for good: waiting on it again would not wait
		case <-time.After(pause):
		}
	}
}
