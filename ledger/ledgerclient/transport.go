package ledgerclient

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"

	"github.com/idemledger/idemledger/internal/protocodec"
)

// windowSize is the HTTP/2 flow-control window of every stream and
// connection from the ledger: one that holds any of the ledger's answers (a
// replayed outcome is at most 1 MiB by default), fixed, which turns off
// gRPC's bandwidth-delay probing and its window updates.
const windowSize = 4 << 20

// A connection that goes silent without closing (a node lost without a
// reset, a route that drops its packets) is pinged after pingAfter without
// a frame from the ledger, and closed when the ping is not answered within
// pingTimeout (which also bounds, as TCP_USER_TIMEOUT, how long sent bytes
// may go unacknowledged): its calls fail UNAVAILABLE and the next call
// dials again. Without it each call waited for its deadline, and the next
// went to the same connection, until TCP gave up many minutes later.
// ledgerd lets a client ping every 5 s (server.TransportOptions); 10 s is
// the least gRPC allows.
const (
	pingAfter   = 10 * time.Second
	pingTimeout = 5 * time.Second
)

// connectParams bound a connection attempt, its TLS handshake included, at
// 20 s (gRPC's default, which the TypeScript client keeps too), and the
// wait between failed attempts at 5 s: gRPC's default backoff grows to
// 2 min, so a client whose ledger was down a few minutes went on failing
// its calls for up to 2 min after the ledger was back. Every write waits
// on the ledger; an attempt to a ledger that is down costs it nothing.
var connectParams = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: time.Second, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
	MinConnectTimeout: 20 * time.Second,
}

// DialOptions are the transport settings of a connection to ledgerd: fixed
// flow-control windows for the ledger's answers, keepalive pings that find
// a silent connection in 15 s, connection attempts given up in 20 s and
// made again at most 5 s apart, and protobuf encoded in buffers that are
// not cleared before they are written (gRPC's own codec clears 1 MiB to
// send a 256 KiB outcome), for every call on the connection: give it to a
// connection to ledgerd alone. Add credentials and any other options of
// your own.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: pingAfter, Timeout: pingTimeout}),
		grpc.WithConnectParams(connectParams),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(protocodec.Codec())),
	}
}
