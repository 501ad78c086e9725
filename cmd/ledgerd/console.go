package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemledger/idemledger/cmd/ledgerd/internal/console"
	"github.com/idemledger/idemledger/ledger"
)

// What the console reads of ledgerd besides AdminService: the recent
// audit lines, the decisions a minute, and the latest census.

// auditRing keeps the last auditKept audit lines of changes and refusals,
// and apart from them the last auditKept reads (list, get), for the
// console's audit page, so that reads never push a change out; the log
// keeps every one, and --audit-file too.
type auditRing struct {
	mu             sync.Mutex
	changes, reads []console.AuditEntry // oldest first
	file           *auditFile           // nil without --audit-file
}

const auditKept = 500

// handler is h, with every audit line (attribute audit=true) kept.
func (a *auditRing) handler(h slog.Handler) slog.Handler { return auditHandler{Handler: h, ring: a} }

// recent is the lines kept, newest first: the changes and refusals, and
// with reads the reads too.
func (a *auditRing) recent(reads bool) []console.AuditEntry {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := append([]console.AuditEntry(nil), a.changes...)
	if reads {
		out = append(out, a.reads...)
	}
	slices.SortStableFunc(out, func(x, y console.AuditEntry) int { return y.Time.Compare(x.Time) })
	return out
}

func (a *auditRing) add(e console.AuditEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	kept := &a.changes
	if e.Read {
		kept = &a.reads
	}
	if len(*kept) == auditKept {
		*kept = append((*kept)[:0], (*kept)[1:]...)
	}
	*kept = append(*kept, e)
}

type auditHandler struct {
	slog.Handler
	ring  *auditRing
	attrs []slog.Attr
}

func (h auditHandler) Handle(ctx context.Context, r slog.Record) error {
	audit := false
	e := console.AuditEntry{Time: r.Time, Action: strings.TrimPrefix(r.Message, "audit: ")}
	add := func(a slog.Attr) bool {
		switch a.Key {
		case "audit":
			audit = a.Value.Bool()
		case "read":
			e.Read = a.Value.Bool()
		default:
			switch a.Key {
			case "principal":
				e.Who = a.Value.String()
			case "tenant":
				e.Tenant = a.Value.String()
			}
			e.Attrs = append(e.Attrs, fmt.Sprintf("%s=%v", a.Key, a.Value))
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	if audit {
		h.ring.add(e)
		if h.ring.file != nil {
			h.ring.file.write(ctx, r, h.attrs)
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h auditHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return auditHandler{Handler: h.Handler.WithAttrs(attrs), ring: h.ring, attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h auditHandler) WithGroup(name string) slog.Handler {
	return auditHandler{Handler: h.Handler.WithGroup(name), ring: h.ring, attrs: h.attrs}
}

// auditFile is --audit-file: the audit lines alone, as JSON, appended to a
// file of their own (for the audit store's shipper), reopened on SIGHUP so
// that a rotation moves it aside.
type auditFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
	h    slog.Handler
}

func openAuditFile(path string) (*auditFile, error) {
	a := &auditFile{path: path}
	return a, a.reopen()
}

// reopen opens the path again (after a rotation moved the file).
func (a *auditFile) reopen() error {
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("--audit-file: %w", err)
	}
	a.mu.Lock()
	old := a.f
	a.f, a.h = f, slog.NewJSONHandler(f, nil)
	a.mu.Unlock()
	if old != nil {
		return old.Close()
	}
	return nil
}

func (a *auditFile) write(ctx context.Context, r slog.Record, attrs []slog.Attr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	_ = a.h.WithAttrs(attrs).Handle(ctx, r) // the main log has the line too
}

func (a *auditFile) close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.f.Close()
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
