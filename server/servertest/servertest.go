// Package servertest runs a real LedgerService gRPC server over bufconn for
// tests, torn down by t.Cleanup.
package servertest

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
)

// Dial serves srv on an in-memory listener and returns a client connection
// to it. Both are closed when the test ends.
func Dial(t testing.TB, srv ledgerv1.LedgerServiceServer, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	return Serve(t, func(gs *grpc.Server) { ledgerv1.RegisterLedgerServiceServer(gs, srv) }, opts...)
}

// Serve starts a gRPC server with opts on an in-memory listener, lets
// register (when not nil) add services, and returns a client connection to
// it. Both are closed when the test ends.
func Serve(t testing.TB, register func(*grpc.Server), opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(opts...)
	if register != nil {
		register(gs)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
