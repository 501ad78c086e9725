package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Decision is what the ledger decided for a call: the label of the
// decision counter.
type Decision string

// The decisions, named as in the SPEC's flow.
const (
	DecisionClaimed     Decision = "claimed"      // Begin: a fresh claim, attempt 1
	DecisionTakenOver   Decision = "taken_over"   // Begin: a claim over an expired lease
	DecisionReplayed    Decision = "replayed"     // Begin: the stored outcome came back
	DecisionInProgress  Decision = "in_progress"  // Begin: another attempt holds the lease
	DecisionKeyReused   Decision = "key_reused"   // Begin: the key came with another payload
	DecisionTooLate     Decision = "too_late"     // Begin: the first attempt is older than retention
	DecisionCompleted   Decision = "completed"    // Complete stored the outcome
	DecisionReleased    Decision = "released"     // Release turned the claim into a tombstone
	DecisionExtended    Decision = "extended"     // Extend renewed the lease
	DecisionLeaseLost   Decision = "lease_lost"   // Complete, Release or Extend without the current token
	DecisionRateLimited Decision = "rate_limited" // the namespace was over its rate limit
)

// Metrics counts decisions per namespace for Prometheus as
// idemledger_decisions_total{namespace, decision}. It is a
// prometheus.Collector: register it. It is safe for concurrent use.
type Metrics struct {
	decisions *prometheus.CounterVec
}

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns Metrics with every counter at zero.
func NewMetrics() *Metrics {
	return &Metrics{decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "idemledger",
		Name:      "decisions_total",
		Help:      "Ledger decisions by namespace: claimed, taken_over, replayed, in_progress, key_reused, too_late, completed, released, extended, lease_lost, rate_limited.",
	}, []string{"namespace", "decision"})}
}

// Observe counts one decision for namespace.
func (m *Metrics) Observe(namespace string, d Decision) {
	m.decisions.WithLabelValues(namespace, string(d)).Inc()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) { m.decisions.Describe(ch) }

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) { m.decisions.Collect(ch) }
