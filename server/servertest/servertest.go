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
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
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
	return Start(t, register, opts...).Dial(t)
}

// Server is a gRPC server on an in-memory listener.
type Server struct {
	lis *bufconn.Listener
}

// Start starts a gRPC server with opts on an in-memory listener and lets
// register (when not nil) add services. It stops when the test ends.
func Start(t testing.TB, register func(*grpc.Server), opts ...grpc.ServerOption) *Server {
	t.Helper()
	gs := grpc.NewServer(opts...)
	if register != nil {
		register(gs)
	}
	return StartServer(t, gs)
}

// StartServer serves gs on an in-memory listener. It stops when the test
// ends, unless the test stops it first.
func StartServer(t testing.TB, gs *grpc.Server) *Server {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return &Server{lis: lis}
}

// Dial returns a plaintext client connection to the server, with opts
// added, closed when the test ends.
func (s *Server) Dial(t testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// DialLedger serves a LedgerService on an in-memory ledger (ledger/memory,
// real clock) whose every caller is namespace with every tenant, and
// returns a client connection to it: the ledger that tests of write
// services and interceptors talk to.
func DialLedger(t testing.TB, namespace string) *grpc.ClientConn {
	t.Helper()
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: namespace, Tenants: []string{"*"}}, nil
	})
	return Dial(t, server.New(ledger.New(memory.New(memory.Config{}), ledger.Config{}), server.Config{Auth: auth}))
}
