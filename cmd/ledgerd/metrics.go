package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/server"
)

// decisionCounter counts the server's decisions (server.Config.Observe) as
// idemledger_decisions_total{namespace, decision}.
func decisionCounter() (*prometheus.CounterVec, func(namespace string, d server.Decision)) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "idemledger",
		Name:      "decisions_total",
		Help:      "Ledger decisions by namespace: claimed, taken_over, replayed, in_progress, key_reused, too_late, completed, released, extended, lease_lost, rate_limited.",
	}, []string{"namespace", "decision"})
	return c, func(namespace string, d server.Decision) { c.WithLabelValues(namespace, string(d)).Inc() }
}

// batchStats are the SQL store's batch counters: zero until it is open, and
// for a store that does not batch.
func (l *lateStore) batchStats() crdb.BatchStats {
	s, err := l.get()
	if err != nil {
		return crdb.BatchStats{}
	}
	if b, ok := s.(interface{ BatchStats() crdb.BatchStats }); ok {
		return b.BatchStats()
	}
	return crdb.BatchStats{}
}

// batchMetrics are the Prometheus counters of the SQL store's batches.
func (l *lateStore) batchMetrics() []prometheus.Collector {
	counter := func(name, help string, value func(crdb.BatchStats) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "idemledger", Subsystem: "sql", Name: name, Help: help},
			func() float64 { return value(l.batchStats()) })
	}
	return []prometheus.Collector{
		counter("batches_total", "Batches of Begins and Completes sent to the database, lone calls' included.",
			func(b crdb.BatchStats) float64 { return float64(b.Batches) }),
		counter("batched_calls_total", "Calls the batches carried: over batches_total, the mean batch size.",
			func(b crdb.BatchStats) float64 { return float64(b.Calls) }),
		counter("batch_busy_seconds_total", "Time spent running batches: its rate is the share of time a batch is in flight.",
			func(b crdb.BatchStats) float64 { return b.Busy.Seconds() }),
	}
}
