package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemledger/idemledger/lab/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves lines back, and counts the lines it served.
func echo(t *testing.T) (addr string, served chan string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served = make(chan string, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					served <- line
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { lis.Close(); <-done })
	return lis.Addr().String(), served
}

func proxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// dial connects to the proxy p; the connection closes when the test ends.
func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func roundTrip(c net.Conn, line string) (string, error) {
	if _, err := c.Write([]byte(line)); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	return bufio.NewReader(c).ReadString('\n')
}

func TestForwards(t *testing.T) {
	addr, _ := echo(t)
	p := proxy(t, addr)
	c := dial(t, p)
	if got, err := roundTrip(c, "hello\n"); err != nil || got != "hello\n" {
		t.Fatalf("round trip = %q, %v", got, err)
	}
}

// TestCutResponses: the server handles the request, the client's
// connection is reset before the answer arrives.
func TestCutResponses(t *testing.T) {
	addr, served := echo(t)
	p := proxy(t, addr)
	p.SetCutResponses(1)
	c := dial(t, p)
	_, err := roundTrip(c, "charge\n")
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("read after a cut = %v, want a reset", err)
	}
	if got := <-served; got != "charge\n" || p.Cuts.Load() != 1 {
		t.Fatalf("server saw %q, %d cuts", got, p.Cuts.Load())
	}
}

// TestCutAfter: a request holding the pattern reaches the server and its
// answer is cut; the requests before it pass, and a disarmed pattern cuts
// nothing.
func TestCutAfter(t *testing.T) {
	addr, served := echo(t)
	p := proxy(t, addr)
	p.CutAfter("CHARGE")
	c := dial(t, p)
	if got, err := roundTrip(c, "refund\n"); err != nil || got != "refund\n" {
		t.Fatalf("round trip before the pattern = %q, %v", got, err)
	}
	<-served
	_, err := roundTrip(c, "a charge\n")
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Fatalf("read after the pattern = %v, want a reset", err)
	}
	if got := <-served; got != "a charge\n" || p.Cuts.Load() != 1 {
		t.Fatalf("server saw %q, %d cuts", got, p.Cuts.Load())
	}

	p.CutAfter("charge")
	p.Disarm()
	d := dial(t, p)
	if got, err := roundTrip(d, "charge\n"); err != nil || got != "charge\n" {
		t.Fatalf("round trip after Disarm = %q, %v", got, err)
	}
	if n := p.Cuts.Load(); n != 1 {
		t.Fatalf("%d cuts after Disarm, want 1", n)
	}
}

func TestResetAllAndLatency(t *testing.T) {
	addr, _ := echo(t)
	p := proxy(t, addr)
	p.SetLatency(30 * time.Millisecond)
	c := dial(t, p)
	if _, err := roundTrip(c, "a\n"); err != nil {
		t.Fatal(err)
	}
	if p.Delayed.Load() == 0 {
		t.Fatal("no chunk was delayed")
	}
	if n := p.ResetAll(); n != 1 {
		t.Fatalf("ResetAll reset %d connections, want 1", n)
	}
	if _, err := roundTrip(c, "b\n"); err == nil {
		t.Fatal("a reset connection still answers")
	}
}

// TestDelay: each chunk reaches the other side the delay after it was
// sent, each way, and chunks sent close together stay close together:
// the link is long, not slow.
func TestDelay(t *testing.T) {
	addr, _ := echo(t)
	p := proxy(t, addr)
	const d = 50 * time.Millisecond
	p.SetDelay(d)
	c := dial(t, p)
	start := time.Now()
	if _, err := roundTrip(c, "a\n"); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Fatalf("a round trip took %v, want at least %v", rtt, 2*d)
	}
	if _, err := c.Write([]byte("b\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // the proxy's delay is real time: the subject of the test
	if _, err := c.Write([]byte("c\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var at [2]time.Time
	for i := range at {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		at[i] = time.Now()
	}
	if gap := at[1].Sub(at[0]); gap > d*7/10 {
		t.Fatalf("two lines sent 5ms apart came back %v apart: the second waited for the first", gap)
	}
}
