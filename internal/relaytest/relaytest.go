// Package relaytest forwards TCP connections to a server, and makes the
// ones it holds go silent without closing, as a connection does whose far
// end is lost without a reset (a node powered off, a route that drops its
// packets), or holds or closes the ones it accepts (a process that hangs,
// a server that is down): for the tests of the ledger clients' pings and
// connection attempts.
package relaytest

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay forwards the connections it accepts on a loopback port to a
// server. Silence makes the ones it holds go silent; what it does with
// the ones it accepts later is their Mode (Forward unless Admit says).
type Relay struct {
	lis      net.Listener
	to       string
	mode     atomic.Int32
	mu       sync.Mutex
	accepted int
	more     chan struct{} // closed at the next accept
	conns    []*relayed
	wg       sync.WaitGroup
}

type relayed struct {
	silent     atomic.Bool
	agent, far net.Conn
}

// New starts a Relay to the server at to; the test's cleanup closes it
// and its connections.
func New(t testing.TB, to string) *Relay {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Relay{lis: lis, to: to, more: make(chan struct{})}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		_ = lis.Close()
		r.Cut()
		r.wg.Wait()
	})
	return r
}

// Addr is the address to dial in the server's place.
func (r *Relay) Addr() string { return r.lis.Addr().String() }

// Accepted is how many connections the relay has accepted.
func (r *Relay) Accepted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted
}

// WaitAccepted waits until the relay has accepted n connections.
func (r *Relay) WaitAccepted(ctx context.Context, n int) error {
	for {
		r.mu.Lock()
		accepted, more := r.accepted, r.more
		r.mu.Unlock()
		if accepted >= n {
			return nil
		}
		select {
		case <-more:
		case <-ctx.Done():
			return fmt.Errorf("relaytest: %d connections accepted, waiting for %d: %w", accepted, n, ctx.Err())
		}
	}
}

// Silence makes the connections the relay holds go silent: what either
// end sends is read and dropped, and neither is closed.
func (r *Relay) Silence() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		c.silent.Store(true)
	}
}

// Cut closes the connections the relay holds (a server that went down).
func (r *Relay) Cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.conns {
		_ = c.agent.Close()
		if c.far != nil {
			_ = c.far.Close()
		}
	}
	r.conns = nil
}

// Mode is what the relay does with a connection it accepts.
type Mode int32

const (
	// Forward relays it to the server.
	Forward Mode = iota
	// Hang holds it and never answers (a process that accepts and hangs):
	// what it sends is read and dropped, and it reaches no server.
	Hang
	// Close closes it at once (a server that is down).
	Close
)

// Admit sets what the relay does with the connections it accepts from now
// on.
func (r *Relay) Admit(m Mode) { r.mode.Store(int32(m)) }

func (r *Relay) accept() {
	for {
		agent, err := r.lis.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		r.accepted++
		close(r.more)
		r.more = make(chan struct{})
		r.mu.Unlock()
		switch Mode(r.mode.Load()) {
		case Close:
			_ = agent.Close()
		case Hang:
			r.hold(&relayed{agent: agent})
			r.wg.Go(func() {
				_, _ = io.Copy(io.Discard, agent)
				_ = agent.Close()
			})
		case Forward:
			far, err := net.Dial("tcp", r.to)
			if err != nil {
				_ = agent.Close()
				continue
			}
			c := &relayed{agent: agent, far: far}
			r.hold(c)
			r.wg.Go(func() { c.pipe(agent, far) })
			r.wg.Go(func() { c.pipe(far, agent) })
		}
	}
}

func (r *Relay) hold(c *relayed) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, c)
}

// pipe copies from src to dst until either fails, dropping what it reads
// once the connection is silent, and then closes both.
func (c *relayed) pipe(src, dst net.Conn) {
	defer func() {
		_ = src.Close()
		_ = dst.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if c.silent.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}
