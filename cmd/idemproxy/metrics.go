package main

import (
	"context"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemledger/idemledger/interceptors/mcpguard"
)

// metrics counts the proxy's tool calls.
type metrics struct {
	calls   *prometheus.CounterVec
	seconds *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemproxy_tool_calls_total",
			Help: "tools/call by tool and result: ran (the upstream ran it), replayed, passthrough (an unguarded tool), jsonrpc_error, or the lowercase code of a ledger or guard error (in_progress, key_reused, unavailable, …).",
		}, []string{"tool", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemproxy_tool_call_seconds",
			Help:    "Latency of tools/call as the proxy answered it, by tool and guarded or not.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"tool", "guarded"}),
	}
	reg.MustRegister(m.calls, m.seconds)
	return m
}

// observe is the outermost receiving middleware: it counts each tools/call
// by what its answer says. Tool names not configured are counted as
// "(other)", so that a caller cannot grow the label set.
func (m *metrics) observe(tools map[string]toolConfig) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return next(ctx, method, req)
			}
			tool, guarded := call.Params.Name, true
			if _, ok := tools[tool]; !ok {
				tool, guarded = "(other)", false
			}
			timer := prometheus.NewTimer(m.seconds.WithLabelValues(tool, map[bool]string{true: "true", false: "false"}[guarded]))
			res, err := next(ctx, method, req)
			timer.ObserveDuration()
			m.calls.WithLabelValues(tool, result(guarded, res, err)).Inc()
			return res, err
		}
	}
}

// passthrough counts a tools/call of a tool the proxy does not guard,
// which it forwards as it is (counted as it starts); done ends its timer.
func (m *metrics) passthrough() (done func()) {
	m.calls.WithLabelValues("(other)", "passthrough").Inc()
	timer := prometheus.NewTimer(m.seconds.WithLabelValues("(other)", "false"))
	return func() { timer.ObserveDuration() }
}

func result(guarded bool, res mcp.Result, err error) string {
	switch {
	case err != nil:
		return "jsonrpc_error"
	case !guarded:
		return "passthrough"
	}
	r, ok := res.(*mcp.CallToolResult)
	if !ok || r == nil {
		return "ran"
	}
	if info, ok := mcpguard.ErrorFromResult(r); ok {
		return strings.ToLower(info.Code)
	}
	if r.Meta[mcpguard.ReplayedMeta] == true {
		return "replayed"
	}
	return "ran"
}
