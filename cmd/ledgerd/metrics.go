package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/ledger/crdb"
	"github.com/idemledger/idemledger/ledger/pebble"
	"github.com/idemledger/idemledger/server"
)

// decisionCounter counts the server's decisions (server.Config.Observe) as
// idemledger_decisions_total{ledger_namespace, decision}. The label is not
// "namespace": the Prometheus operator's target label of that name would
// rename it exported_namespace.
func decisionCounter() (*prometheus.CounterVec, func(namespace string, d server.Decision)) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "idemledger",
		Name:      "decisions_total",
		Help:      "Ledger decisions by the caller's namespace: claimed, taken_over, replayed, in_progress, key_reused, too_late, key_expired, outcome_unknown, completed, released, extended, lease_lost, resolved, rate_limited.",
	}, []string{"ledger_namespace", "decision"})
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
	gauge := func(name, help string, value func(crdb.BatchStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "idemledger", Subsystem: "sql", Name: name, Help: help},
			func() float64 { return value(l.batchStats()) })
	}
	return []prometheus.Collector{
		counter("batches_total", "Batches of Begins and Completes sent to the database, lone calls' included.",
			func(b crdb.BatchStats) float64 { return float64(b.Batches) }),
		counter("batched_calls_total", "Calls the batches carried: over batches_total, the mean batch size.",
			func(b crdb.BatchStats) float64 { return float64(b.Calls) }),
		counter("batch_busy_seconds_total", "Time spent running batches: its rate is the mean number of batches in flight.",
			func(b crdb.BatchStats) float64 { return b.Busy.Seconds() }),
		gauge("batch_limit", "Batches allowed in flight at once, set from the round trip to the database unless fixed.",
			func(b crdb.BatchStats) float64 { return float64(b.Limit) }),
		gauge("round_trip_seconds", "Round trip to the database, the least of the last minute's pings, that batch_limit is set from.",
			func(b crdb.BatchStats) float64 { return b.RoundTrip.Seconds() }),
	}
}

// stallMetrics are the embedded store's write stalls:
// idemledger_pebble_write_stalls_total and
// idemledger_pebble_write_stall_seconds_total. Zero until it is open;
// registered for the embedded store only.
func (l *lateStore) stallMetrics() []prometheus.Collector {
	stalls := func() pebble.WriteStalls {
		if s, err := l.get(); err == nil {
			if p, ok := s.(*pebble.Store); ok {
				return p.WriteStalls()
			}
		}
		return pebble.WriteStalls{}
	}
	counter := func(name, help string, value func(pebble.WriteStalls) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "idemledger", Subsystem: "pebble", Name: name, Help: help},
			func() float64 { return value(stalls()) })
	}
	return []prometheus.Collector{
		counter("write_stalls_total", "Times the embedded store held writes back: its memtables waiting to be flushed, or level 0 to be compacted, behind the writes.",
			func(w pebble.WriteStalls) float64 { return float64(w.Count) }),
		counter("write_stall_seconds_total", "Time the embedded store's writes waited in write stalls.",
			func(w pebble.WriteStalls) float64 { return w.Waited.Seconds() }),
	}
}

// walSyncs is the embedded store's log syncs as the histogram
// idemledger_pebble_wal_sync_seconds, read from the store at each
// scrape. Empty until it is open; registered for the embedded store only.
type walSyncs struct {
	l    *lateStore
	desc *prometheus.Desc
}

func (l *lateStore) walSyncMetric() prometheus.Collector {
	return walSyncs{l: l, desc: prometheus.NewDesc("idemledger_pebble_wal_sync_seconds",
		"The embedded store's log syncs: each fdatasync of its write-ahead log, which every write waits for before it is acknowledged.", nil, nil)}
}

func (w walSyncs) Describe(ch chan<- *prometheus.Desc) { ch <- w.desc }

func (w walSyncs) Collect(ch chan<- prometheus.Metric) {
	var syncs pebble.WALSyncs
	if s, err := w.l.get(); err == nil {
		if p, ok := s.(*pebble.Store); ok {
			syncs = p.WALSyncs()
		}
	}
	buckets := make(map[float64]uint64, len(syncs.Buckets))
	for _, b := range syncs.Buckets {
		buckets[b.Le.Seconds()] = b.Count
	}
	ch <- prometheus.MustNewConstHistogram(w.desc, syncs.Count, syncs.Sum.Seconds(), buckets)
}

// followerMetrics count the claims that read a follower first:
// idemledger_sql_follower_reads_total{result="served"} were replays
// answered without the leaseholder, "missed" went on to it.
func (l *lateStore) followerMetrics() []prometheus.Collector {
	stats := func() crdb.FollowerReadStats {
		if s, err := l.get(); err == nil {
			if f, ok := s.(interface{ FollowerReadStats() crdb.FollowerReadStats }); ok {
				return f.FollowerReadStats()
			}
		}
		return crdb.FollowerReadStats{}
	}
	counter := func(result string, value func(crdb.FollowerReadStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "idemledger", Subsystem: "sql", Name: "follower_reads_total",
			Help:        "Claims that read the nearest replica first (--follower-reads): served were replays answered from it, missed went on to the leaseholder.",
			ConstLabels: prometheus.Labels{"result": result}},
			func() float64 { return float64(value(stats())) })
	}
	return []prometheus.Collector{
		counter("served", func(f crdb.FollowerReadStats) uint64 { return f.Served }),
		counter("missed", func(f crdb.FollowerReadStats) uint64 { return f.Missed }),
	}
}

// storeMetrics times the store's calls, sizes the outcomes stored and
// holds the records-by-state census.
type storeMetrics struct {
	ops     *prometheus.HistogramVec
	outcome prometheus.Histogram
	records *prometheus.GaugeVec
}

func newStoreMetrics(reg prometheus.Registerer) *storeMetrics {
	m := &storeMetrics{
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "idemledger", Name: "store_seconds",
			Help:    "Latency of the store's calls by operation (claim, complete, release, extend, resolve, get, get_many, list, purge, census; canary: the readiness check's claim and release of a key of its own) and by the home region of the call's tenant (with --homes; empty otherwise).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18), // 100 µs to 13 s
		}, []string{"op", "home"}),
		outcome: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "idemledger", Name: "outcome_bytes",
			Help:    "Size of the outcomes stored (Complete, Resolve as applied), in bytes.",
			Buckets: prometheus.ExponentialBuckets(64, 4, 9), // 64 B to 4 MiB
		}),
		records: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "idemledger", Name: "records",
			Help: "Live records by the state they read in, counted every --census-interval.",
		}, []string{"state"}),
	}
	reg.MustRegister(m.ops, m.outcome, m.records)
	return m
}

// bind has st report to m.
func (m *storeMetrics) bind(st *lateStore) {
	st.onOp = func(op, home string, d time.Duration) { m.ops.WithLabelValues(op, home).Observe(d.Seconds()) }
	st.onOutcome = func(n int) { m.outcome.Observe(float64(n)) }
}

// census counts the store's records by state every interval until ctx
// ends, the first time as soon as the store is open.
func (m *storeMetrics) census(ctx context.Context, st *lateStore, interval time.Duration, latest *latestCensus, log *slog.Logger) {
	select {
	case <-st.opened:
	case <-ctx.Done():
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, max(interval/2, 10*time.Second))
		counts, err := st.CountByState(cctx)
		cancel()
		if err != nil {
			log.WarnContext(ctx, "record census failed", "error", err)
		} else {
			latest.set(counts, time.Now())
			byState := counts.ByState()
			for state, label := range console.CensusLabel {
				m.records.WithLabelValues(label).Set(float64(byState[state]))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
