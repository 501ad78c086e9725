package main_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestSilentClientIsDropped: a client connection that goes silent without
// closing (its node lost) is pinged after 30 s and closed 10 s later when
// the ping goes unanswered, on the gRPC listener and on the HTTP one: the
// client here sends HTTP/2's preface and its settings, then reads and
// answers nothing. Without the pings the HTTP listener kept it for its
// idle timeout (15 min), and the gRPC listener for 80 s.
func TestSilentClientIsDropped(t *testing.T) {
	t.Parallel()
	p := start(t, "--data-dir", t.TempDir())
	for name, addr := range map[string]string{"grpc": p.grpc, "http": p.http} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// The preface, and an empty SETTINGS frame: the client's settings.
			if _, err := io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
				t.Fatal(err)
			}
			opened := time.Now()
			if err := conn.SetReadDeadline(opened.Add(55 * time.Second)); err != nil {
				t.Fatal(err)
			}
			_, err = io.Copy(io.Discard, conn)
			if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("the silent connection was open after %s; want it closed after about 40 s", time.Since(opened).Round(time.Second))
			}
			if held := time.Since(opened); held < 30*time.Second {
				t.Fatalf("the connection was closed after %s (%v), before a ping could go unanswered", held.Round(time.Millisecond), err)
			}
		})
	}
}
