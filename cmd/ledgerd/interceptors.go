package main

// The gRPC interceptors of ledgerd's listeners: metrics, the refusals'
// summary, logging, recovery, and the answer before the caller's deadline.

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idemledger/idemledger/ledger/errcode"
	"github.com/idemledger/idemledger/ledger/ledgerstatus"
	"github.com/idemledger/idemledger/server"
)

// unaryInterceptors are ledgerd's interceptors, outermost first: metrics,
// a summary of refused credentials, logging of every finished call (once,
// with the cause callers are not told), and recovery from panics, which
// are logged with their stack and answered INTERNAL.
func unaryInterceptors(log *slog.Logger, metrics *grpcprom.ServerMetrics) []grpc.UnaryServerInterceptor {
	refused := newRefusals(log)
	return []grpc.UnaryServerInterceptor{
		metrics.UnaryServerInterceptor(),
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			res, err := next(ctx, req)
			refused.note(ctx, err)
			return res, err
		},
		logging.UnaryServerInterceptor(slogAdapter(log), logOptions...),
		recovery.UnaryServerInterceptor(recovery.WithRecoveryHandlerContext(recovered(log))),
		answerInTime,
	}
}

// answerInTime runs a call with its deadline brought forward by a margin
// (a quarter of the time left, at most 250 ms), so that a store that does not
// answer (a database cut off, a path that drops every packet) ends the
// call with ledgerd's typed UPSTREAM_TIMEOUT, which reaches the caller
// before its own deadline, instead of the caller's untyped
// DEADLINE_EXCEEDED.
func answerInTime(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	d, ok := ctx.Deadline()
	if !ok {
		return next(ctx, req)
	}
	ctx, cancel := context.WithDeadline(ctx, d.Add(-min(time.Until(d)/4, 250*time.Millisecond)))
	defer cancel()
	return next(ctx, req)
}

// streamInterceptors are the same for streams (LedgerService.Stream): a
// stream is counted and logged once, when it ends; each call on it is
// counted by the decision counters and answered like a unary call.
func streamInterceptors(log *slog.Logger, metrics *grpcprom.ServerMetrics) []grpc.StreamServerInterceptor {
	refused := newRefusals(log)
	return []grpc.StreamServerInterceptor{
		metrics.StreamServerInterceptor(),
		func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			err := next(srv, ss)
			refused.note(ss.Context(), err)
			return err
		},
		logging.StreamServerInterceptor(slogAdapter(log), logOptions...),
		recovery.StreamServerInterceptor(recovery.WithRecoveryHandlerContext(recovered(log))),
	}
}

var logOptions = []logging.Option{
	logging.WithLogOnEvents(logging.FinishCall),
	logging.WithLevels(codeToLevel),
	logging.WithErrorFields(func(err error) logging.Fields {
		if cause := server.Cause(err); cause != nil {
			return logging.Fields{"error.cause", cause.Error()}
		}
		return nil
	}),
}

// refusals turns calls refused for their credentials into one INFO line a
// minute at most, with their count: each one is logged at debug only, so
// that a scanner or a misconfigured client does not flood the log.
type refusals struct {
	log  *slog.Logger
	mu   sync.Mutex
	n    int
	next time.Time // the next summary is due then
}

func newRefusals(log *slog.Logger) *refusals { return &refusals{log: log} }

func (r *refusals) note(ctx context.Context, err error) {
	if status.Code(err) != codes.Unauthenticated {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	if now := time.Now(); !now.Before(r.next) {
		r.log.InfoContext(ctx, "calls refused for their credentials", "count", r.n, "error", err.Error())
		r.n, r.next = 0, now.Add(time.Minute)
	}
}

// recovered logs a panic with its stack and answers INTERNAL.
func recovered(log *slog.Logger) recovery.RecoveryHandlerFuncContext {
	return func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in a handler", "panic", p, "stack", string(debug.Stack()))
		return ledgerstatus.Err(errcode.Errorf(errcode.Internal, "internal error"))
	}
}

// slogAdapter lets the go-grpc-middleware logging interceptor write to slog.
func slogAdapter(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

// codeToLevel keeps the ledger's everyday answers (replays, IN_PROGRESS,
// KEY_REUSED, NOT_FOUND) at debug, callers' mistakes at info, and the
// ledger's own failures at warn and error.
func codeToLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.NotFound, codes.Aborted, codes.FailedPrecondition, codes.Canceled:
		return logging.LevelDebug
	case codes.Unauthenticated:
		return logging.LevelDebug // summarized by refusals
	case codes.InvalidArgument, codes.PermissionDenied, codes.ResourceExhausted:
		return logging.LevelInfo
	case codes.Unavailable, codes.DeadlineExceeded:
		return logging.LevelWarn
	}
	return logging.LevelError
}
