package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/internal/syncbuf"
	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server/servertest"
)

type panicking struct {
	ledgerv1.UnimplementedLedgerServiceServer
}

func (panicking) Begin(context.Context, *ledgerv1.BeginRequest) (*ledgerv1.BeginResponse, error) {
	panic("handler bug")
}

// TestInterceptorsRecoverLogAndCount: a panicking handler answers a typed
// INTERNAL, the panic and the call are logged, the call is counted, and the
// server goes on serving.
func TestInterceptorsRecoverLogAndCount(t *testing.T) {
	var logs syncbuf.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	metrics := grpcprom.NewServerMetrics()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)
	conn := servertest.NewServer(t, func(gs *grpc.Server) { ledgerv1.RegisterLedgerServiceServer(gs, panicking{}) },
		grpc.ChainUnaryInterceptor(unaryInterceptors(log, metrics)...)).Dial(t)
	client := ledgerv1.NewLedgerServiceClient(conn)

	_, err := client.Begin(t.Context(), &ledgerv1.BeginRequest{})
	if le := ledgerstatus.FromError(err); le == nil || le.Code != errcode.Internal || strings.Contains(err.Error(), "handler bug") {
		t.Fatalf("a panic = %v, want INTERNAL without the panic's text", err)
	}
	if _, err := client.Lookup(t.Context(), &ledgerv1.LookupRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("the next call = %v, want the server still serving", err)
	}
	for _, want := range []string{`"msg":"panic in a handler"`, `"panic":"handler bug"`, `"grpc.code":"Internal"`, `"grpc.method":"Begin"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}
	want := `
# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.
# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_code="Internal",grpc_method="Begin",grpc_service="idemledger.v1.LedgerService",grpc_type="unary"} 1
grpc_server_handled_total{grpc_code="Unimplemented",grpc_method="Lookup",grpc_service="idemledger.v1.LedgerService",grpc_type="unary"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "grpc_server_handled_total"); err != nil {
		t.Fatal(err)
	}
}
