package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/ledger"
)

// What the console reads of ledgerd besides AdminService: the recent
// audit lines, the decisions a minute, and the latest census.

// auditRing keeps the last auditKept audit lines AdminService wrote, for
// the console's audit page; the log keeps every one.
type auditRing struct {
	mu      sync.Mutex
	entries []console.AuditEntry // oldest first
}

const auditKept = 500

// handler is h, with every audit line (attribute audit=true) kept.
func (a *auditRing) handler(h slog.Handler) slog.Handler { return auditHandler{Handler: h, ring: a} }

// recent is the lines kept, newest first.
func (a *auditRing) recent() []console.AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]console.AuditEntry, len(a.entries))
	for i, e := range a.entries {
		out[len(a.entries)-1-i] = e
	}
	return out
}

func (a *auditRing) add(e console.AuditEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.entries) == auditKept {
		a.entries = append(a.entries[:0], a.entries[1:]...)
	}
	a.entries = append(a.entries, e)
}

type auditHandler struct {
	slog.Handler
	ring  *auditRing
	attrs []slog.Attr
}

func (h auditHandler) Handle(ctx context.Context, r slog.Record) error {
	audit := false
	var attrs []string
	add := func(a slog.Attr) bool {
		if a.Key == "audit" {
			audit = a.Value.Bool()
		} else {
			attrs = append(attrs, fmt.Sprintf("%s=%v", a.Key, a.Value))
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if audit {
		h.ring.add(console.AuditEntry{Time: r.Time, Action: r.Message, Attrs: attrs})
	}
	return h.Handler.Handle(ctx, r)
}

func (h auditHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return auditHandler{Handler: h.Handler.WithAttrs(attrs), ring: h.ring, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h auditHandler) WithGroup(name string) slog.Handler {
	return auditHandler{Handler: h.Handler.WithGroup(name), ring: h.ring, attrs: h.attrs}
}

// decisionRate is the ledger's decisions a minute over the last hour,
// sampled from idemledger_decisions_total once a minute: nothing is added
// to a call's path.
type decisionRate struct {
	mu      sync.Mutex
	last    float64
	sampled bool
	minutes []int // oldest first, at most 60
}

// sample takes the counter's total now.
func (r *decisionRate) sample(total float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sampled {
		r.minutes = append(r.minutes, int(total-r.last))
		if len(r.minutes) > 60 {
			r.minutes = r.minutes[1:]
		}
	}
	r.last, r.sampled = total, true
}

// lastHour is the decisions of each of the last 60 minutes, oldest first
// (zero before ledgerd had run that long).
func (r *decisionRate) lastHour() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, 60)
	copy(out[60-len(r.minutes):], r.minutes)
	return out
}

// run samples the decisions counter of reg every minute
// until ctx ends.
func (r *decisionRate) run(ctx context.Context, reg prometheus.Gatherer) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		mfs, err := reg.Gather()
		if err == nil {
			var total float64
			for _, mf := range mfs {
				if mf.GetName() == "idemledger_decisions_total" {
					for _, m := range mf.GetMetric() {
						total += m.GetCounter().GetValue()
					}
				}
			}
			r.sample(total)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// latestCensus is the census's last count, for the console.
type latestCensus struct {
	mu     sync.Mutex
	counts ledger.Census
	at     time.Time
}

func (c *latestCensus) set(counts ledger.Census, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts, c.at = counts, at
}

func (c *latestCensus) get() (ledger.Census, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts, c.at
}
