package server

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// The transport's bounds. A fixed window turns off gRPC's bandwidth-delay
// probing and its window updates: fewer frames, fewer syscalls per call.
// The stream window is what one call may make the server buffer before
// the server reads it; gRPC takes data for the connection as it comes, so
// what one connection may make the server buffer is
// MaxConnectionStreams × streamWindow (64 MiB). The ledger's calls are
// small; a larger one (an outcome of up to 1 MiB) takes a few window
// updates.
const (
	streamWindow = 256 << 10
	connWindow   = 4 << 20
	// MaxConnectionStreams is the most calls one connection runs at once.
	MaxConnectionStreams = 256
	// MaxHeaderListBytes bounds a call's metadata, which the server reads
	// before it knows who is calling.
	MaxHeaderListBytes = 64 << 10
	// MinPingInterval is how often a client may ping, with or without
	// calls open; a client that pings more often is told too_many_pings
	// and disconnected. The ledger's clients ping a connection after 10 s
	// without a frame from it, to find one that went silent.
	MinPingInterval = 5 * time.Second
)

// TransportOptions are the server's transport settings for LedgerService:
// fixed flow-control windows, the clients' pings allowed every
// MinPingInterval, and the Codec. ledgerd uses them, with
// MaxConnectionStreams and MaxHeaderListBytes.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinPingInterval, PermitWithoutStream: true}),
		grpc.ForceServerCodecV2(Codec()),
	}
}
