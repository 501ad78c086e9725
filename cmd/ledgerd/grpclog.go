package main

import (
	"context"
	"fmt"
	"log/slog"
)

// grpcLogger writes gRPC's own log (grpclog) to ledgerd's structured log:
// its warnings and errors at warn and error, its chatter at debug, so that
// every line on stderr is one JSON object.
type grpcLogger struct{ log *slog.Logger }

func (g grpcLogger) print(level slog.Level, args ...any) {
	g.log.Log(context.Background(), level, fmt.Sprint(args...), "logger", "grpc")
}

func (g grpcLogger) printf(level slog.Level, format string, args ...any) {
	g.log.Log(context.Background(), level, fmt.Sprintf(format, args...), "logger", "grpc")
}

func (g grpcLogger) Info(args ...any)                    { g.print(slog.LevelDebug, args...) }
func (g grpcLogger) Infoln(args ...any)                  { g.print(slog.LevelDebug, args...) }
func (g grpcLogger) Infof(format string, args ...any)    { g.printf(slog.LevelDebug, format, args...) }
func (g grpcLogger) Warning(args ...any)                 { g.print(slog.LevelWarn, args...) }
func (g grpcLogger) Warningln(args ...any)               { g.print(slog.LevelWarn, args...) }
func (g grpcLogger) Warningf(format string, args ...any) { g.printf(slog.LevelWarn, format, args...) }
func (g grpcLogger) Error(args ...any)                   { g.print(slog.LevelError, args...) }
func (g grpcLogger) Errorln(args ...any)                 { g.print(slog.LevelError, args...) }
func (g grpcLogger) Errorf(format string, args ...any)   { g.printf(slog.LevelError, format, args...) }
func (g grpcLogger) Fatal(args ...any)                   { g.print(slog.LevelError, args...); panic(fmt.Sprint(args...)) }
func (g grpcLogger) Fatalln(args ...any)                 { g.Fatal(args...) }
func (g grpcLogger) Fatalf(format string, args ...any)   { g.Fatal(fmt.Sprintf(format, args...)) }
func (g grpcLogger) V(l int) bool                        { return l <= 0 }
