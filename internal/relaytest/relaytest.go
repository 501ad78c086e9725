// Package relaytest forwards TCP connections to a server, and makes the
// ones it holds go silent without closing, as a connection does whose far
// end is lost without a reset (a node powered off, a route that drops its
// packets): for the tests of the ledger clients' pings.
package relaytest

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Relay forwards the connections it accepts on a loopback port to a
// server. Silence makes the ones it holds go silent; the ones it accepts
// later are forwarded, unless SilenceNew holds them.
type Relay struct {
	lis       net.Listener
	to        string
	silentNew atomic.Bool
	mu        sync.Mutex
	conns     []*relayed
	wg        sync.WaitGroup
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
	r := &Relay{lis: lis, to: to}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		_ = lis.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.agent.Close()
			if c.far != nil {
				_ = c.far.Close()
			}
		}
		r.mu.Unlock()
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
	return len(r.conns)
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

// SilenceNew makes the connections the relay accepts from now on, until
// SilenceNew(false), be held and never answered (a process that accepts
// and hangs): what they send is read and dropped, and they reach no
// server.
func (r *Relay) SilenceNew(on bool) { r.silentNew.Store(on) }

func (r *Relay) accept() {
	for {
		agent, err := r.lis.Accept()
		if err != nil {
			return
		}
		if r.silentNew.Load() {
			r.mu.Lock()
			r.conns = append(r.conns, &relayed{agent: agent})
			r.mu.Unlock()
			r.wg.Go(func() {
				_, _ = io.Copy(io.Discard, agent)
				_ = agent.Close()
			})
			continue
		}
		far, err := net.Dial("tcp", r.to)
		if err != nil {
			_ = agent.Close()
			continue
		}
		c := &relayed{agent: agent, far: far}
		r.mu.Lock()
		r.conns = append(r.conns, c)
		r.mu.Unlock()
		r.wg.Go(func() { c.pipe(agent, far) })
		r.wg.Go(func() { c.pipe(far, agent) })
	}
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
