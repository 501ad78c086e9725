// Package servertest runs real gRPC servers over an in-memory listener for
// tests, torn down by the test's Cleanup. There is one shape, after
// connect-go's memhttptest: NewServer starts a server, Server.Dial connects
// to it.
//
//	srv := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("billing")))
//	client := ledgerv1.NewLedgerServiceClient(srv.Dial(t))
package servertest

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/ledger"
	"github.com/idemledger/idemledger/ledger/memory"
	"github.com/idemledger/idemledger/server"
)

// Server is a gRPC server on an in-memory listener.
type Server struct {
	gs  *grpc.Server
	lis *bufconn.Listener
}

// NewServer starts a gRPC server with opts, on which register (when not
// nil) registers its services, over an in-memory listener. It stops when
// the test ends.
func NewServer(tb testing.TB, register func(*grpc.Server), opts ...grpc.ServerOption) *Server {
	tb.Helper()
	gs := grpc.NewServer(opts...)
	if register != nil {
		register(gs)
	}
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	return &Server{gs: gs, lis: lis}
}

// Dial returns a plaintext client connection to the server, with opts
// added, closed when the test ends.
func (s *Server) Dial(tb testing.TB, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return conn
}

// Stop stops the server at once: its connections break, as when a ledger
// process dies.
func (s *Server) Stop() { s.gs.Stop() }

// Ledger registers srv as the LedgerService, for NewServer.
func Ledger(srv ledgerv1.LedgerServiceServer) func(*grpc.Server) {
	return func(gs *grpc.Server) { ledgerv1.RegisterLedgerServiceServer(gs, srv) }
}

// MemoryLedger returns a LedgerService on an in-memory ledger (ledger/memory,
// real clock) whose every caller is namespace with every tenant: the ledger
// that tests of write services and interceptors talk to.
func MemoryLedger(namespace string) ledgerv1.LedgerServiceServer {
	return MemoryLedgerAt(namespace, nil)
}

// MemoryLedgerAt is MemoryLedger on a memory store whose clock is now
// (the wall clock when nil): a test moves leases and retention along by
// moving its clock, instead of sleeping.
func MemoryLedgerAt(namespace string, now func() time.Time) ledgerv1.LedgerServiceServer {
	return LedgerServer(namespace, ledger.New(memory.New(memory.Config{Now: now}), ledger.Config{}))
}

// LedgerServer is the LedgerService on l whose every caller is namespace
// with every tenant: for a test that reads l itself (its waiters).
func LedgerServer(namespace string, l *ledger.Ledger) ledgerv1.LedgerServiceServer {
	auth := server.AuthenticatorFunc(func(context.Context) (server.Principal, error) {
		return server.Principal{Namespace: namespace, Tenants: []string{"*"}}, nil
	})
	return server.New(l, server.Config{Auth: auth})
}
