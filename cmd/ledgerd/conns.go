package main

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/stats"
)

// connLimit bounds the connections a listener serves at once
// (--max-connections), so that a flood cannot exhaust file descriptors.
// At the bound, a new connection sheds the one idle the longest: no call
// in flight and nothing read for at least shedIdle. So a flood of idle
// connections (held open, sending nothing) cannot lock new clients out:
// each newcomer takes the place of an idle one. With none idle (every
// connection busy), the newcomer waits for a place, as in the kernel's
// backlog before.
//
// A connection's calls are counted by its server: gRPC through the stats
// handler (connLimit is one), HTTP through http.Server.ConnState.
type connLimit struct {
	net.Listener
	max   int
	shed  prometheus.Counter
	mu    sync.Mutex
	conns map[string]*limitedConn // by remote address
	freed chan struct{}           // a place freed up (buffered, 1)
}

// shedIdle is how long a connection must have been idle to be shed.
const shedIdle = time.Second

func newConnLimit(limit int, shed prometheus.Counter) *connLimit {
	return &connLimit{max: limit, shed: shed, conns: map[string]*limitedConn{}, freed: make(chan struct{}, 1)}
}

// listen sets the listener the limit serves.
func (l *connLimit) listen(lis net.Listener) net.Listener {
	l.Listener = lis
	return l
}

// Accept accepts a connection, shedding an idle one at the bound, or
// waiting for a place when none is idle.
func (l *connLimit) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &limitedConn{Conn: c, limit: l}
	lc.touch()
	for {
		victim, added := l.admit(lc)
		if added {
			return lc, nil
		}
		if victim != nil {
			_ = victim.Close()
			l.shed.Inc()
			continue
		}
		select {
		case <-l.freed:
		case <-time.After(shedIdle / 4):
		}
	}
}

// admit adds c if there is a place, or names the connection to shed for
// it (nil when none has been idle long enough).
func (l *connLimit) admit(c *limitedConn) (victim *limitedConn, added bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.conns) < l.max {
		l.conns[c.RemoteAddr().String()] = c
		return nil, true
	}
	idleSince := time.Now().Add(-shedIdle).UnixNano()
	for _, o := range l.conns {
		if o.calls.Load() == 0 && o.last.Load() <= idleSince && (victim == nil || o.last.Load() < victim.last.Load()) {
			victim = o
		}
	}
	return victim, false
}

// forget removes c, and says a place freed up.
func (l *connLimit) forget(c *limitedConn) {
	l.mu.Lock()
	if l.conns[c.RemoteAddr().String()] == c {
		delete(l.conns, c.RemoteAddr().String())
	}
	l.mu.Unlock()
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// lookup is the connection from addr, nil when it is not one of ours.
func (l *connLimit) lookup(addr net.Addr) *limitedConn {
	if addr == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[addr.String()]
}

// limitedConn is a connection under the limit: when it last read, and
// how many calls it has in flight.
type limitedConn struct {
	net.Conn
	limit *connLimit
	last  atomic.Int64 // UnixNano of the last read (or of the accept)
	calls atomic.Int32
	once  sync.Once
}

func (c *limitedConn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *limitedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *limitedConn) Close() error {
	c.once.Do(func() { c.limit.forget(c) })
	return c.Conn.Close()
}

// The gRPC stats handler: it counts each connection's calls in flight.

type connKey struct{}

func (l *connLimit) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	if c := l.lookup(info.RemoteAddr); c != nil {
		return context.WithValue(ctx, connKey{}, c)
	}
	return ctx
}

func (*connLimit) HandleConn(context.Context, stats.ConnStats) {}

func (*connLimit) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (*connLimit) HandleRPC(ctx context.Context, s stats.RPCStats) {
	c, _ := ctx.Value(connKey{}).(*limitedConn)
	if c == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		c.calls.Add(1)
	case *stats.End:
		c.calls.Add(-1)
		c.touch()
	}
}

// connState counts an HTTP connection's request in flight
// (http.Server.ConnState).
func (l *connLimit) connState(nc net.Conn, state http.ConnState) {
	c := l.lookup(nc.RemoteAddr())
	if c == nil {
		return
	}
	switch state {
	case http.StateActive:
		c.calls.Store(1)
	case http.StateIdle:
		c.calls.Store(0)
		c.touch()
	default:
	}
}
