package ledgerclient

import "google.golang.org/grpc"

// windowSize is the HTTP/2 flow-control window of every stream and
// connection to the ledger: ledgerd's own (server.TransportOptions). A fixed
// window that holds any of the ledger's messages turns off gRPC's
// bandwidth-delay probing and its window updates.
const windowSize = 4 << 20

// DialOptions are the transport settings of a connection to ledgerd: fixed
// flow-control windows that match the server's. Add credentials and any
// other options of your own.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
	}
}
