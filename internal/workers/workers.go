// Package workers runs functions on goroutines that wait for the next
// function once one returns, so that most functions start on a stack an
// earlier one grew. A function that runs deep (a guarded call through
// the guard, the ledger's client, gRPC and protobuf; a ledger call
// through the server, the ledger and the store) grew a new goroutine's
// stack two or three times on the way, each growth a copy of the stack:
// 14% of a ledger Stream's pair in process.
package workers

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// DefaultMaxIdle is the MaxIdle of a Pool that sets none.
const DefaultMaxIdle = 64

// Pool runs functions on its workers. Its zero value is ready.
type Pool struct {
	// IdleFor ends a worker that has waited this long for a next
	// function; 0: it waits until Close.
	IdleFor time.Duration
	// MaxIdle bounds the workers that wait for a next function, a little
	// stack each (the runtime shrinks an idle goroutine's stack at its
	// collections); 0: DefaultMaxIdle. A worker whose function returns
	// past it ends, and the next function past it starts on a new
	// goroutine's stack.
	MaxIdle int

	mu     sync.Mutex
	idle   []chan func() // each idle worker's: the last to go idle is the first given work
	closed bool
	live   sync.WaitGroup // every worker, busy or idle
}

// Go runs f on an idle worker, or on a new one when none is idle. f must
// not panic.
func (p *Pool) Go(f func()) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		next := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		next <- f // its buffer's one place: never waits
		return
	}
	p.mu.Unlock()
	next := make(chan func(), 1)
	p.live.Go(func() { p.serve(f, next) })
}

// serve runs f, then each function sent on next while the worker is
// idle; it ends once idle workers are not wanted (too many, or closed),
// or when it has been idle for IdleFor.
func (p *Pool) serve(f func(), next chan func()) {
	var idle *time.Timer
	if p.IdleFor > 0 {
		idle = time.NewTimer(p.IdleFor)
		defer idle.Stop()
	}
	for ok := true; ok; {
		f()
		p.mu.Lock()
		if p.closed || len(p.idle) >= cmp.Or(p.MaxIdle, DefaultMaxIdle) {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, next)
		p.mu.Unlock()
		if idle == nil {
			f, ok = <-next
			continue
		}
		idle.Reset(p.IdleFor)
		select {
		case f, ok = <-next:
		case <-idle.C:
			if p.leave(next) {
				return
			}
			f, ok = <-next // Go took this worker as its wait ran out: the function is on its way
		}
	}
}

// leave takes the idle worker of next off the idle list, and reports
// whether it was on it.
func (p *Pool) leave(next chan func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.idle, next)
	if i < 0 {
		return false
	}
	p.idle = slices.Delete(p.idle, i, i+1)
	return true
}

// Close ends the idle workers, and each busy one once its function
// returns; Go still runs functions, each on a goroutine of its own.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, next := range p.idle {
		close(next)
	}
	p.idle = nil
}
