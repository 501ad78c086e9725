package main

import (
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/guard"
	"github.com/idemledger/idemledger/interceptors/httpguard"
)

// The headers a protected request reaches the upstream with: its claim,
// so that an upstream that can fence its own writes may do so.
const (
	ClaimTokenHeader   = "Idempotency-Token"
	ClaimAttemptHeader = "Idempotency-Attempt"
)

// httpHandler is the HTTP mode: a reverse proxy to the upstream API, with
// the routes the file names protected by httpguard. A protected request
// reaches the upstream with its claim in ClaimTokenHeader and
// ClaimAttemptHeader. An upstream that fails after the request may have
// reached it leaves the claim to run out (503 with Retry-After); one that
// could not be reached answers 502, which releases the key.
func httpHandler(cfg *httpConfig, ledger ledgerv1.LedgerServiceClient, reg prometheus.Registerer, log *slog.Logger) (http.Handler, error) {
	target, err := url.Parse(cfg.Upstream)
	if err != nil {
		return nil, err
	}
	rp := &httputil.ReverseProxy{
		Transport:  upstreamTransport(),
		BufferPool: copyBuffers{},
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Header.Del(ClaimTokenHeader)
			pr.Out.Header.Del(ClaimAttemptHeader)
			if c, ok := guard.ClaimFromContext(pr.In.Context()); ok {
				pr.Out.Header.Set(ClaimTokenHeader, strconv.FormatUint(c.Token, 10))
				pr.Out.Header.Set(ClaimAttemptHeader, strconv.FormatUint(uint64(c.Attempt), 10))
			}
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if !notSent(err) {
				httpguard.MarkOutcomeUnknown(r)
			}
			log.WarnContext(r.Context(), "upstream request failed", "method", r.Method, "path", r.URL.Path, "error", err)
			w.WriteHeader(http.StatusBadGateway)
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	var opts []httpguard.Option
	switch {
	case cfg.Tenant.Header != "":
		opts = append(opts, httpguard.WithTenant(httpguard.TenantFromHeader(cfg.Tenant.Header)))
	default:
		opts = append(opts, httpguard.WithTenant(httpguard.Tenant(cfg.Tenant.Static)))
	}
	if cfg.MaxResponseBytes > 0 {
		opts = append(opts, httpguard.WithMaxResponseBytes(cfg.MaxResponseBytes))
	}
	if cfg.MaxBodyBytes > 0 {
		opts = append(opts, httpguard.WithMaxBodyBytes(cfg.MaxBodyBytes))
	}
	for _, pattern := range slices.Sorted(maps.Keys(cfg.Routes)) {
		rc := cfg.Routes[pattern]
		route, err := rc.route(time.Duration(cfg.RunTimeout), cfg.Stripe)
		if err != nil {
			return nil, err
		}
		if method, _, ok := strings.Cut(pattern, " "); (!ok || method == "") && len(rc.Methods) == 0 {
			log.Warn("a protected route names no method: only POST and PATCH are guarded, every other method passes to the upstream unguarded; name the method in the pattern (\"POST /v1/invoices\") or list methods",
				"route", pattern)
		}
		opts = append(opts, httpguard.WithRoute(pattern, route))
	}
	gd, err := guard.New(ledger, guard.WithLogger(log))
	if err != nil {
		return nil, err
	}
	g, err := httpguard.New(gd, opts...)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	for pattern := range cfg.Routes {
		mux.Handle(pattern, g.Middleware(rp))
	}
	mux.Handle("/", rp)
	return observeHTTP(reg, cfg.Routes, mux), nil
}

// notSent reports whether an upstream failure happened before the
// request was sent: the connection could not be made.
func notSent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// observeHTTP counts the requests by route, status and whether they were
// replayed. Patterns not configured count as "(other)".
func observeHTTP(reg prometheus.Registerer, routes map[string]routeConfig, mux *http.ServeMux) http.Handler {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemproxy_http_requests_total",
		Help: "HTTP requests by protected route, status and replayed (true: the stored response was replayed).",
	}, []string{"route", "status", "replayed"})
	seconds := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idemproxy_http_request_seconds",
		Help:    "Latency of HTTP requests as the proxy answered them, by protected route ((other): the rest) and replayed.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	}, []string{"route", "replayed"})
	reg.MustRegister(requests, seconds)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		mux.ServeHTTP(sw, r)
		route := r.Pattern
		if _, ok := routes[route]; !ok {
			route = "(other)"
		}
		replayed := strconv.FormatBool(sw.Header().Get(httpguard.ReplayedHeader) == "true")
		requests.WithLabelValues(route, strconv.Itoa(sw.status), replayed).Inc()
		seconds.WithLabelValues(route, replayed).Observe(time.Since(start).Seconds())
	})
}

// statusWriter remembers the status written.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (s *statusWriter) WriteHeader(status int) {
	if !s.wrote {
		s.status, s.wrote = status, true
	}
	s.ResponseWriter.WriteHeader(status)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes of
// passed-through streams).
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
