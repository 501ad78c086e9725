package ledgerclient

import (
	"google.golang.org/grpc"

	"github.com/idemledger/idemledger/internal/protocodec"
)

// windowSize is the HTTP/2 flow-control window of every stream and
// connection from the ledger: one that holds any of the ledger's answers (a
// replayed outcome is at most 1 MiB by default), fixed, which turns off
// gRPC's bandwidth-delay probing and its window updates.
const windowSize = 4 << 20

// DialOptions are the transport settings of a connection to ledgerd: fixed
// flow-control windows for the ledger's answers, and protobuf encoded in
// buffers that are not cleared before they are written (gRPC's own codec
// clears 1 MiB to send a 256 KiB outcome), for every call on the
// connection: give it to a connection to ledgerd alone. Add credentials and
// any other options of your own.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(windowSize),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(protocodec.Codec())),
	}
}
