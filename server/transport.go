package server

import "google.golang.org/grpc"

// windowSize is the HTTP/2 flow-control window of every stream and
// connection. The ledger's messages are small (an outcome is at most 1 MiB),
// so a fixed window that holds any of them turns off gRPC's bandwidth-delay
// probing and its window updates: fewer frames, fewer syscalls per call.
// ledgerclient.DialOptions gives clients the same window.
const windowSize = 4 << 20

// TransportOptions are the server's transport settings for LedgerService:
// fixed flow-control windows (gRPC shares write buffers by default). ledgerd
// uses them.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(windowSize),
		grpc.InitialConnWindowSize(windowSize),
	}
}
