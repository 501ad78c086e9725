package main

// The admin listener: /metrics, /debug/pprof/, /healthz, /readyz and the
// console.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/internal/buildinfo"
)

// startAdmin serves /metrics, /healthz (the process is up, and its store
// needs no restart: mustRestart), /readyz (the store answers) and the
// operator's console (/console/) over HTTP, or HTTPS with tc.
func startAdmin(addr string, tc *tls.Config, reg *prometheus.Registry, h *health.Server, mustRestart func(context.Context) error, con *console.Console, log *slog.Logger) (*http.Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle(console.Prefix, con)
	// The profiles show what the process holds: admin principals only.
	mux.Handle("/debug/pprof/", con.AdminOnly(http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/cmdline", con.AdminOnly(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("/debug/pprof/profile", con.AdminOnly(http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", con.AdminOnly(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", con.AdminOnly(http.HandlerFunc(pprof.Trace)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := mustRestart(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		res, err := h.Check(r.Context(), &healthpb.HealthCheckRequest{})
		if err != nil || res.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			http.Error(w, "not serving", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	srv.Addr = lis.Addr().String()
	serve := func() error { return srv.Serve(lis) }
	if tc != nil {
		srv.TLSConfig = tc
		serve = func() error { return srv.ServeTLS(lis, "", "") }
	}
	go func() {
		if err := serve(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server failed", "error", err)
		}
	}()
	return srv, nil
}

func adminAddr(s *http.Server) string {
	if s == nil {
		return ""
	}
	return s.Addr
}

// buildInfoGauge is idemledger_build_info{version, revision, goversion}, 1:
// which build a process runs, for dashboards and alerts across a rollout.
func buildInfoGauge() prometheus.Collector {
	bi := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "idemledger", Name: "build_info",
		Help:        "The build of this process: its version, VCS revision and Go version, as labels; always 1.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion}})
	g.Set(1)
	return g
}
