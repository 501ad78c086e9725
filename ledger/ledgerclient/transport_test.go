package ledgerclient_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/relaytest"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server"
	"github.com/idemledger/idemledger/server/servertest"
)

// TestOutcomesByteForByte: over ledgerd's transport settings on both ends
// (server.TransportOptions, DialOptions), whose codecs encode into
// buffers that are not cleared, outcomes of many sizes, on the stream and
// as unary calls, are stored and replayed byte for byte, many at once:
// no buffer lends one message's bytes to another.
func TestOutcomesByteForByte(t *testing.T) {
	t.Parallel()
	_, addr, _ := start(t, "", server.TransportOptions()...)
	c := dial(t, addr, ledgerclient.DialOptions()...)

	// Longer outcomes first, so that shorter ones get buffers used before.
	sizes := []int{1000 << 10, 700 << 10, 300 << 10, 200 << 10, 129 << 10, 70 << 10, 60 << 10, 2 << 10, 900, 1}
	outcome := func(i int) *ledgerv1.Outcome {
		return &ledgerv1.Outcome{Result: &ledgerv1.Outcome_Response{Response: &anypb.Any{
			TypeUrl: "type.googleapis.com/x.Y", Value: bytes.Repeat([]byte{byte('a' + i)}, sizes[i]),
		}}}
	}
	key := func(w, i int) string { return fmt.Sprintf("k-%d-%d", w, i) }
	const workers = 4
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range sizes {
				res, err := c.Begin(t.Context(), begin(key(w, i)))
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := c.Complete(t.Context(), &ledgerv1.CompleteRequest{Tenant: "acme", Key: key(w, i), Token: res.GetClaim().GetToken(), Outcome: outcome(i)}); err != nil {
					t.Errorf("%s: Complete of %d bytes: %v", key(w, i), sizes[i], err)
					return
				}
			}
			for i := range sizes {
				res, err := c.Begin(t.Context(), begin(key(w, i)))
				want := outcome(i).GetResponse().GetValue()
				if got := res.GetReplay().GetOutcome().GetResponse().GetValue(); err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s: replay of %d bytes: %d bytes, equal %t (%v)", key(w, i), sizes[i], len(got), bytes.Equal(got, want), err)
				}
			}
		})
	}
	wg.Wait()
}

// TestSilentConnectionIsDropped: a connection to the ledger that goes
// silent without closing (its far end lost without a reset, as when a node
// dies) is found by DialOptions' pings: the call in flight fails
// UNAVAILABLE about 15 s on, long before its deadline, and the next call
// dials a new connection. Without pings the call waited for its deadline,
// and every later call too.
func TestSilentConnectionIsDropped(t *testing.T) {
	t.Parallel()
	_, addr, _ := start(t, "", server.TransportOptions()...)
	r := relaytest.New(t, addr)
	c := dial(t, r.Addr(), ledgerclient.DialOptions()...)
	if _, err := c.Begin(t.Context(), begin("before")); err != nil {
		t.Fatal(err)
	}

	r.Silence()
	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	sent := time.Now()
	_, err := c.Begin(ctx, begin("during"))
	ledgertest.WantStatus(t, err, errcode.Unavailable)
	if waited := time.Since(sent); waited > 30*time.Second {
		t.Fatalf("the call on the silent connection failed after %s, want about 15 s", waited)
	}

	// The ledger never heard the call, so its retry claims the key.
	ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	res, err := c.Begin(ctx, begin("during"))
	if err != nil || res.GetClaim().GetToken() != 1 {
		t.Fatalf("the retry on a new connection: %v, %v; want the claim", res, err)
	}
	if n := r.Accepted(); n != 2 {
		t.Fatalf("the relay accepted %d connections, want 2", n)
	}
}

// TestQuietConnectionIsKept: a connection that is only quiet answers
// DialOptions' pings and is kept: a Lookup that waits 17 s, past a ping
// and its timeout, is answered.
func TestQuietConnectionIsKept(t *testing.T) {
	t.Parallel()
	_, addr, _ := start(t, "", server.TransportOptions()...)
	c := dial(t, addr, ledgerclient.DialOptions()...)
	if _, err := c.Begin(t.Context(), begin("held")); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	res, err := c.Lookup(t.Context(), &ledgerv1.LookupRequest{Tenant: "acme", Key: "held", Wait: durationpb.New(17 * time.Second)})
	if err != nil || res.GetRecord() == nil {
		t.Fatalf("a Lookup that waits 17 s: %v, %v", res, err)
	}
	if waited := time.Since(sent); waited < 17*time.Second {
		t.Fatalf("the Lookup was answered after %s, before its wait", waited)
	}
}

// TestUnansweredHandshakeIsGivenUp: a connection whose TLS handshake gets
// no answer (a process that accepts and hangs) is given up in 20 s
// (gRPC's bound on a connection attempt, the handshake included), and the
// call waiting on it fails UNAVAILABLE then, not at its deadline; the
// connection is made anew (after gRPC's backoff, a second) and the retry
// claims. The TypeScript client bounds its connections the same.
func TestUnansweredHandshakeIsGivenUp(t *testing.T) {
	t.Parallel()
	ca := servertest.NewCA(t)
	cert := ca.Issue(t, servertest.Leaf{CommonName: "ledgerd", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true})
	_, addr, _ := start(t, "", append(server.TransportOptions(), grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}})))...)
	r := relaytest.New(t, addr)
	r.Admit(relaytest.Hang)
	c, conn := dialConn(t, r.Addr(), append(ledgerclient.DialOptions(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool})))...)

	ctx, cancel := context.WithTimeout(t.Context(), 45*time.Second)
	defer cancel()
	sent := time.Now()
	_, err := c.Begin(ctx, begin("k"))
	ledgertest.WantStatus(t, err, errcode.Unavailable)
	if waited := time.Since(sent); waited < 19*time.Second || waited > 30*time.Second {
		t.Fatalf("the call failed after %s, want about 20 s", waited)
	}

	r.Admit(relaytest.Forward)
	ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		conn.Connect()
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the connection stayed %s", st)
		}
	}
	res, err := c.Begin(ctx, begin("k"))
	if err != nil || res.GetClaim().GetToken() != 1 {
		t.Fatalf("the retry on a new connection: %v, %v; want the claim", res, err)
	}
	if n := r.Accepted(); n != 2 {
		t.Fatalf("the relay accepted %d connections, want 2", n)
	}
}

// TestConnectsSoonAfterAnOutage: a client whose ledger was down (every
// connection closed at once) while it tried 8 times is connected again
// soon after the ledger's return: its next attempt is at most 5 s on,
// jittered by up to a fifth (6 s), and the test allows 4 s more for that
// attempt's connection under load (one took 6.004 s in all under -race).
// With gRPC's default backoff the 9th came 21–32 s after the 8th (and
// later ones up to 2 min apart), every call failing meanwhile.
func TestConnectsSoonAfterAnOutage(t *testing.T) {
	t.Parallel()
	_, addr, _ := start(t, "", server.TransportOptions()...)
	r := relaytest.New(t, addr)
	r.Admit(relaytest.Close)
	c, conn := dialConn(t, r.Addr(), ledgerclient.DialOptions()...)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := c.Begin(ctx, begin("k"))
	ledgertest.WantStatus(t, err, errcode.Unavailable)

	ctx, cancel = context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := r.WaitAccepted(ctx, 8); err != nil {
		t.Fatal(err)
	}
	r.Admit(relaytest.Forward)
	back := time.Now()
	for st := conn.GetState(); st != connectivity.Ready; st = conn.GetState() {
		if !conn.WaitForStateChange(ctx, st) {
			t.Fatalf("the connection stayed %s", st)
		}
	}
	if waited := time.Since(back); waited > 10*time.Second {
		t.Fatalf("connected %s after the ledger's return, want within 6 s and a connection's setup", waited)
	}
	if res, err := c.Begin(ctx, begin("k")); err != nil || res.GetClaim().GetToken() != 1 {
		t.Fatalf("the call after the return: %v, %v; want the claim", res, err)
	}
}
