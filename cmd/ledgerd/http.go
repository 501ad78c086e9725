package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/vanguard"
	"connectrpc.com/vanguard/vanguardgrpc"
	"google.golang.org/grpc"

	"github.com/idemledger/idemledger/server"

	// The well-known types, so that an outcome in JSON may be any of them
	// (an Any in JSON needs its type; an application's own types travel
	// as google.protobuf.BytesValue or Struct, or in binary Connect).
	_ "google.golang.org/protobuf/types/known/emptypb"
	_ "google.golang.org/protobuf/types/known/structpb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)

// startHTTP serves the services of gs (LedgerService, health) on addr over
// the Connect protocol (JSON or binary, a POST that curl can make),
// gRPC-Web and gRPC, transcoded by vanguard into gs: the same
// authentication (the bearer token in Authorization, or the client
// certificate), rate limit, validation, interceptors and counters as
// --listen. Without TLS it speaks HTTP/1.1 and cleartext HTTP/2.
func startHTTP(addr string, gs *grpc.Server, tlsConf *tls.Config, auth server.Authenticator, conns *connLimit, cfg config, log *slog.Logger) (*http.Server, string, error) {
	transcoder, err := vanguardgrpc.NewTranscoder(gs, vanguard.WithDefaultServiceOptions(
		// JSON carries a message's bytes as base64: the gate's bound.
		vanguard.WithMaxMessageBufferBytes(uint32(jsonBodyLimit(cfg.maxRecvBytes))), //nolint:gosec // bounded by the flag's check
	), vanguard.WithCodec(newOpaqueJSON))
	if err != nil {
		return nil, "", fmt.Errorf("http listener: %w", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("http listen: %w", err)
	}
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if tlsConf != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	srv := &http.Server{
		Handler:           connectGate(transcoder, auth, cfg.maxRecvBytes),
		Protocols:         &protocols,
		TLSConfig:         tlsConf,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10, // read before a call is authenticated: bounded
		IdleTimeout:       15 * time.Minute,
		HTTP2:             &http.HTTP2Config{SendPingTimeout: pingAfter, PingTimeout: pingTimeout},
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		ConnState:         conns.connState,
	}
	lis = conns.listen(lis)
	go func() {
		var err error
		if tlsConf != nil {
			err = srv.ServeTLS(lis, "", "")
		} else {
			err = srv.Serve(lis)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http listener stopped", "error", err)
		}
	}()
	return srv, lis.Addr().String(), nil
}

// stopHTTP drains the HTTP listener: calls in flight finish within ctx.
func stopHTTP(ctx context.Context, srv *http.Server) {
	if srv == nil {
		return
	}
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
}
