package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

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

// perMinute counts events in the minutes of the last hour, without a
// lock: a bucket a minute, taken over by the minute an hour later.
type perMinute struct {
	now     func() time.Time
	buckets [60]struct{ minute, n atomic.Int64 }
}

func (p *perMinute) add() {
	m := p.now().Unix() / 60
	b := &p.buckets[m%60]
	if b.minute.Load() != m && b.minute.Swap(m) != m {
		b.n.Store(0)
	}
	b.n.Add(1)
}

// lastHour is the counts of the last 60 minutes, oldest first, the minute
// now last.
func (p *perMinute) lastHour() []int {
	now := p.now().Unix() / 60
	out := make([]int, 60)
	for i := range out {
		m := now - 59 + int64(i)
		if b := &p.buckets[((m%60)+60)%60]; b.minute.Load() == m {
			out[i] = int(b.n.Load())
		}
	}
	return out
}

// latestCensus is the census's last count, for the console.
type latestCensus struct {
	mu     sync.Mutex
	counts map[string]map[string]int
	at     time.Time
}

func (c *latestCensus) set(counts ledger.Census, at time.Time) {
	out := map[string]map[string]int{}
	for ns, m := range counts {
		out[ns] = map[string]int{}
		for st, n := range m {
			out[ns][censusStates[st]] = n
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts, c.at = out, at
}

func (c *latestCensus) get() (map[string]map[string]int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts, c.at
}
