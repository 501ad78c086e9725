// Package faultproxy is an in-process TCP proxy that injects network
// faults between two parts of the system under test: latency, connection
// resets, and responses cut after the server produced them.
package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards every connection made to Addr to the target. It is safe for
// concurrent use; faults change while connections run.
type Proxy struct {
	lis    net.Listener
	target string

	latency atomic.Int64 // the most added per chunk, in ns; 0: none
	delay   atomic.Int64 // a fixed delay of each chunk after it arrived, in ns: half a round trip
	// delaySet: SetDelay was called, so connections read through the
	// delaying conveyor and follow later changes of delay.
	delaySet atomic.Bool
	cut      atomic.Uint64          // probability ×2^32 that a response chunk resets the connection
	cutAfter atomic.Pointer[[]byte] // CutAfter's pattern, lower case, until a request holds it

	mu    sync.Mutex
	conns map[*link]struct{}
	path  chan struct{} // while a blackhole: closed when the path returns
	wg    sync.WaitGroup

	// Counters of what the proxy did.
	Resets, Cuts, Delayed atomic.Int64
}

// link is one proxied connection: the client's side and the target's.
type link struct {
	client, server net.Conn
	once           sync.Once
	cutNext        atomic.Bool // CutAfter matched a request: reset at the next answer
}

// New listens on a loopback port and forwards to target.
func New(target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{lis: lis, target: target, conns: map[*link]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the address to connect to instead of the target.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// SetLatency delays each chunk, in each direction, by a uniform random time
// up to limit; 0 turns it off.
func (p *Proxy) SetLatency(limit time.Duration) { p.latency.Store(int64(limit)) }

// SetDelay holds each chunk, in each direction, d after it arrived: a link
// whose round trip is 2d, such as a database a region away.
// Once SetDelay was called, even with 0, the connections opened after
// follow every later change, from their next chunk on.
func (p *Proxy) SetDelay(d time.Duration) { p.delaySet.Store(true); p.delay.Store(int64(d)) }

// SetCutResponses makes each chunk from the target reset the connection
// instead of reaching the client, with probability prob: the server did
// the work, the client never hears of it. 0 turns it off.
func (p *Proxy) SetCutResponses(prob float64) {
	p.cut.Store(uint64(min(max(prob, 0), 1) * (1 << 32)))
}

// ResetAll resets every open connection (TCP RST to both sides) and
// returns how many it reset.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.conns))
	for l := range p.conns {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		p.reset(l)
	}
	p.Resets.Add(int64(len(links)))
	return len(links)
}

// CutAfter arms one lost answer: the next request chunk that holds pattern
// (in any letter case, such as "commit") reaches the target, and the
// target's next answer on that connection resets it instead of reaching
// the client: the target did the work, the client never hears whether.
func (p *Proxy) CutAfter(pattern string) {
	b := bytes.ToLower([]byte(pattern))
	p.cutAfter.Store(&b)
}

// Disarm takes back a CutAfter that no request has matched yet; a cut
// already matched still happens at its answer.
func (p *Proxy) Disarm() { p.cutAfter.Store(nil) }

// SetBlackhole holds every chunk, in each direction and on every
// connection, while on, as a network path that drops every packet does
// (TCP retransmits them when the path returns): nothing passes and no
// connection ends. Off, what was held goes on.
func (p *Proxy) SetBlackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.path == nil:
		p.path = make(chan struct{})
	case !on && p.path != nil:
		close(p.path)
		p.path = nil
	}
}

// waitPath waits while the path is a blackhole.
func (p *Proxy) waitPath() {
	p.mu.Lock()
	path := p.path
	p.mu.Unlock()
	if path != nil {
		<-path
	}
}

// Close stops listening, resets every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.SetBlackhole(false)
	err := p.lis.Close()
	p.ResetAll()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		s, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			abort(c)
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		p.conns[l] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(l, l.client, l.server, false) })
		p.wg.Go(func() { p.pipe(l, l.server, l.client, true) })
	}
}

// pipe copies src to dst chunk by chunk, delaying and cutting as set.
func (p *Proxy) pipe(l *link, src, dst net.Conn, response bool) {
	defer p.close(l)
	if p.delay.Load() > 0 || p.delaySet.Load() {
		var stop func()
		src, stop = delayed(src, func() time.Duration { return time.Duration(p.delay.Load()) })
		defer stop()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.waitPath()
			if !response {
				if pat := p.cutAfter.Load(); pat != nil && bytes.Contains(bytes.ToLower(buf[:n]), *pat) && p.cutAfter.CompareAndSwap(pat, nil) {
					l.cutNext.Store(true)
				}
			} else if l.cutNext.Load() {
				p.Cuts.Add(1)
				p.reset(l)
				return
			}
			if d := p.latency.Load(); d > 0 {
				p.Delayed.Add(1)
				time.Sleep(time.Duration(rand.Int64N(d)))
			}
			if response {
				if c := p.cut.Load(); c > 0 && rand.Uint64N(1<<32) < c {
					p.Cuts.Add(1)
					p.reset(l)
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// Half-close: tell the other side, keep the other direction.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			return
		}
	}
}

func (p *Proxy) reset(l *link) {
	l.once.Do(func() {
		abort(l.client)
		abort(l.server)
	})
	p.forget(l)
}

func (p *Proxy) close(l *link) {
	l.once.Do(func() {
		_ = l.client.Close()
		_ = l.server.Close()
	})
	p.forget(l)
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.conns, l)
	p.mu.Unlock()
}

// abort closes c with a TCP RST rather than a FIN.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// delayed is src with each chunk readable d after it arrived. The chunks
// travel on a conveyor: one that arrives while another is still on its
// way is not held up by it, as on a long link.
func delayed(src net.Conn, d func() time.Duration) (_ net.Conn, stop func()) {
	type chunk struct {
		b       []byte
		err     error
		arrived time.Time
	}
	conveyor, gone := make(chan chunk, 1024), make(chan struct{})
	go func() {
		defer close(conveyor)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			select {
			case conveyor <- chunk{b[:n], err, time.Now()}:
			case <-gone:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return &delayedConn{Conn: src, read: func() ([]byte, error) {
		c, ok := <-conveyor
		if !ok {
			return nil, io.EOF
		}
		time.Sleep(time.Until(c.arrived.Add(d())))
		return c.b, c.err
	}}, func() { close(gone) }
}

// delayedConn reads from a conveyor; the rest is the connection's.
type delayedConn struct {
	net.Conn
	read func() ([]byte, error)
	rest []byte
	err  error
}

func (c *delayedConn) Read(b []byte) (int, error) {
	for len(c.rest) == 0 && c.err == nil {
		c.rest, c.err = c.read()
	}
	n := copy(b, c.rest)
	c.rest = c.rest[n:]
	if len(c.rest) > 0 {
		return n, nil
	}
	return n, c.err
}
