package main

import (
	"context"
	"log/slog"
	"os"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// tracingEnabled reports whether the standard OTEL_* environment asks for
// traces: an OTLP endpoint, or OTEL_TRACES_EXPORTER=otlp; never with
// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true.
func tracingEnabled() bool {
	switch {
	case os.Getenv("OTEL_SDK_DISABLED") == "true", os.Getenv("OTEL_TRACES_EXPORTER") == "none":
		return false
	case os.Getenv("OTEL_TRACES_EXPORTER") == "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// setupTracing exports ledgerd's spans over OTLP (gRPC), configured by the
// standard OTEL_* variables (endpoint, headers, sampler, service name,
// resource attributes), when they ask for it; otherwise spans are not
// recorded. It returns the function that flushes and stops the exporter.
func setupTracing(ctx context.Context, log *slog.Logger) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if !tracingEnabled() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName("ledgerd"), semconv.ServiceVersion(version())))
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	log.InfoContext(ctx, "exporting traces over OTLP")
	return tp.Shutdown, nil
}

// traceHandler adds the trace and span ids of a record's context to it, so
// that a log line leads to its trace.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
