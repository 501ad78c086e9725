package main

import (
	"encoding/json"
	"strings"

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

// observe times and counts one tools/call of tool, which run answers, by
// what its answer says. Tool names not configured are counted as
// "(other)", so that a caller cannot grow the label set.
func (m *metrics) observe(tool string, run func() (json.RawMessage, error)) (json.RawMessage, error) {
	timer := prometheus.NewTimer(m.seconds.WithLabelValues(tool, "true"))
	res, err := run()
	timer.ObserveDuration()
	m.calls.WithLabelValues(tool, result(res, err)).Inc()
	return res, err
}

// passthrough counts a tools/call of a tool the proxy does not guard,
// which it forwards as it is (counted as it starts); done ends its timer.
func (m *metrics) passthrough() (done func()) {
	m.calls.WithLabelValues("(other)", "passthrough").Inc()
	timer := prometheus.NewTimer(m.seconds.WithLabelValues("(other)", "false"))
	return func() { timer.ObserveDuration() }
}

// result is the label of a guarded call's answer.
func result(res json.RawMessage, err error) string {
	if err != nil {
		return "jsonrpc_error"
	}
	var r struct {
		Meta struct {
			Error    *mcpguard.ErrorInfo `json:"io.idemledger/error"`
			Replayed bool                `json:"io.idemledger/replayed"`
		} `json:"_meta"`
	}
	switch {
	case !mayHold(res, "io.idemledger/"):
		return "ran" // the common answer, not decoded
	case !readObject(res, &r):
		return "ran"
	case r.Meta.Error != nil && r.Meta.Error.Code != "":
		return strings.ToLower(r.Meta.Error.Code)
	case r.Meta.Replayed:
		return "replayed"
	}
	return "ran"
}
