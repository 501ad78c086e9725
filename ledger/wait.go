package ledger

import (
	"context"
	"sync"
	"time"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// Defaults of the waiters (Config).
const (
	DefaultMaxWaiters      = 10000
	DefaultMaxWaitersTotal = 20000
	DefaultPollInterval    = 250 * time.Millisecond
	// pollChunk is the most scopes one GetMany reads.
	pollChunk = 10000
)

// watch is one Lookup waiting for its scope's record to change. It holds
// no goroutine while it waits: a timer for its wait, a hook on its
// context, and its place among its scope's watches. Whichever comes first
// (the record changes, the wait runs out, the context ends) finishes it,
// once.
type watch struct {
	l     *Ledger
	ctx   context.Context //nolint:containedctx // the waiting call's context, held while it waits
	scope Scope
	done  func(Record, error)

	mu       sync.Mutex
	finished bool
	timer    *time.Timer
	stopCtx  func() bool
}

// finish answers the Lookup, once, and forgets the watch.
func (w *watch) finish(rec Record, err error) {
	w.mu.Lock()
	if w.finished {
		w.mu.Unlock()
		return
	}
	w.finished = true
	timer, stopCtx := w.timer, w.stopCtx
	w.mu.Unlock()
	w.l.waiters.remove(w)
	timer.Stop()
	stopCtx()
	w.done(rec, err)
}

func (w *watch) isFinished() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.finished
}

// check reads the record: a record no longer in progress, or a failed
// read, finishes the watch; otherwise it keeps waiting.
func (w *watch) check() {
	rec, err := w.l.get(w.ctx, w.scope)
	if err != nil || rec.State != StateInProgress {
		w.finish(rec, err)
	}
}

// waiters are the watches of a Ledger, by scope. They are woken by the
// Complete or Release of this Ledger that changes their record, or by one
// shared poller that reads every watched scope each PollInterval (for
// changes made by other ledger instances, and records that expire).
type waiters struct {
	mu      sync.Mutex
	scopes  map[Scope]map[*watch]struct{}
	perNS   map[string]int
	n       int
	polling bool
}

// add registers w, and returns false when its namespace holds perNS
// watches already, or every namespace together total.
func (ws *waiters) add(w *watch, perNS, total int) bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.scopes == nil {
		ws.scopes, ws.perNS = map[Scope]map[*watch]struct{}{}, map[string]int{}
	}
	if ws.perNS[w.scope.Namespace] >= perNS || ws.n >= total {
		return false
	}
	g := ws.scopes[w.scope]
	if g == nil {
		g = map[*watch]struct{}{}
		ws.scopes[w.scope] = g
	}
	g[w] = struct{}{}
	ws.perNS[w.scope.Namespace]++
	ws.n++
	return true
}

// remove unregisters w, if it is registered.
func (ws *waiters) remove(w *watch) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	g := ws.scopes[w.scope]
	if _, ok := g[w]; !ok {
		return
	}
	delete(g, w)
	if len(g) == 0 {
		delete(ws.scopes, w.scope)
	}
	if ws.perNS[w.scope.Namespace]--; ws.perNS[w.scope.Namespace] <= 0 {
		delete(ws.perNS, w.scope.Namespace)
	}
	ws.n--
}

// notify has the watches of s read their record again.
func (ws *waiters) notify(s Scope) {
	ws.mu.Lock()
	g := ws.scopes[s]
	woken := make([]*watch, 0, len(g))
	for w := range g {
		woken = append(woken, w)
	}
	ws.mu.Unlock()
	for _, w := range woken {
		go w.check()
	}
}

// all returns every watch.
func (ws *waiters) all() []*watch {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	all := make([]*watch, 0, ws.n)
	for _, g := range ws.scopes {
		for w := range g {
			all = append(all, w)
		}
	}
	return all
}

// count returns how many watches there are.
func (ws *waiters) count() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	return ws.n
}

// startPolling reports whether the caller must start the poller: there
// are watches and none runs.
func (ws *waiters) startPolling() bool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.polling || len(ws.scopes) == 0 {
		return false
	}
	ws.polling = true
	return true
}

// watchedScopes returns the scopes watched now, or stops the poller
// (false) when there are none.
func (ws *waiters) watchedScopes() ([]Scope, bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if len(ws.scopes) == 0 {
		ws.polling = false
		return nil, false
	}
	scopes := make([]Scope, 0, len(ws.scopes))
	for s := range ws.scopes {
		scopes = append(scopes, s)
	}
	return scopes, true
}

// LookupFunc is Lookup for a caller that does not want to be held while
// the Lookup waits (the server's Stream): it calls done, once, with what
// Lookup would return, from another goroutine when it had to wait. A
// waiting Lookup costs a timer and a few small values, no goroutine.
func (l *Ledger) LookupFunc(ctx context.Context, s Scope, wait time.Duration, done func(Record, error)) {
	if err := ValidateScope(s, l.cfg.MaxKeyBytes); err != nil {
		done(Record{}, err)
		return
	}
	if wait < 0 || wait > l.cfg.MaxLookupWait {
		done(Record{}, errcode.Errorf(errcode.ValidationFailed, "wait %s is outside 0 to %s", wait, l.cfg.MaxLookupWait))
		return
	}
	rec, err := l.get(ctx, s)
	if err != nil || wait == 0 || rec.State != StateInProgress {
		done(rec, err)
		return
	}
	if l.ending.Load() {
		done(Record{}, errEnding)
		return
	}
	w := &watch{l: l, ctx: ctx, scope: s, done: done}
	w.mu.Lock() // the callbacks finish the watch only once it is set up
	w.timer = time.AfterFunc(wait, func() {
		rec, err := l.get(ctx, s)
		w.finish(rec, err)
	})
	w.stopCtx = context.AfterFunc(ctx, func() {
		w.finish(Record{}, errcode.Wrap(errcode.UpstreamTimeout, ctx.Err(), "lookup wait ended with the call"))
	})
	w.mu.Unlock()
	if !l.waiters.add(w, l.cfg.MaxWaiters, l.cfg.MaxWaitersTotal) {
		w.finish(Record{}, &errcode.Error{Code: errcode.RateLimited, Message: "the ledger has too many Lookups waiting (for the namespace, or in all)", RetryAfter: time.Second})
		return
	}
	if w.isFinished() { // it finished before it was registered
		l.waiters.remove(w)
		return
	}
	if l.ending.Load() { // EndWaits ran while it registered
		w.finish(Record{}, errEnding)
		return
	}
	if l.waiters.startPolling() {
		go l.poll() //nolint:contextcheck // the poller serves every waiter, not this call
	}
	// Read again now that the watch is registered, so that a change
	// between the first read and the registration is not missed.
	w.check()
}

// errEnding is what a waiting Lookup gets once EndWaits ran.
var errEnding = &errcode.Error{Code: errcode.Unavailable, Message: "this ledger instance is shutting down: retry the call, another instance will answer it", RetryAfter: time.Second,
	Metadata: map[string]string{errcode.MetaCause: errcode.CauseShutdown}}

// EndWaits answers every Lookup waiting now, and every later one that
// would wait, at once: UNAVAILABLE, retryable after a second, so that a
// ledger that is shutting down does not hold its waiters for its drain
// timeout and then cut them with no answer. Lookups that need no wait
// are answered as before. It is safe to call more than once.
func (l *Ledger) EndWaits() {
	l.ending.Store(true)
	for _, w := range l.waiters.all() {
		w.finish(Record{}, errEnding)
	}
}

// poll reads every watched scope each PollInterval, in chunks, and has
// the watches of each one whose record is no longer in progress read it
// again. It runs while there are watches, and is started by the first.
func (l *Ledger) poll() {
	t := time.NewTicker(l.cfg.PollInterval)
	defer t.Stop()
	for range t.C {
		scopes, ok := l.waiters.watchedScopes()
		if !ok {
			return
		}
		for len(scopes) > 0 {
			chunk := scopes[:min(len(scopes), pollChunk)]
			scopes = scopes[len(chunk):]
			recs, err := l.getMany(chunk)
			if err != nil {
				continue // the watches read for themselves when their wait ends
			}
			for i, rec := range recs {
				if rec.State != StateInProgress {
					l.waiters.notify(chunk[i])
				}
			}
		}
	}
}

// getMany reads scopes with the store's GetMany, bounded by StoreTimeout.
func (l *Ledger) getMany(scopes []Scope) ([]Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.StoreTimeout)
	defer cancel()
	return l.store.GetMany(ctx, scopes)
}

// Waiters returns how many Lookups wait now.
func (l *Ledger) Waiters() int { return l.waiters.count() }
