package main

import (
	"context"
	"log/slog"
	"os"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracingEnabled reports whether the standard OTEL_* environment asks for
// traces: OTEL_TRACES_EXPORTER set (otlp, console; not none), or an OTLP
// endpoint; never with OTEL_SDK_DISABLED=true. Without any of them
// ledgerd records no spans (an OTLP exporter by default would send to a
// collector on localhost that is rarely there).
func tracingEnabled() bool {
	switch exp := os.Getenv("OTEL_TRACES_EXPORTER"); {
	case os.Getenv("OTEL_SDK_DISABLED") == "true", exp == "none":
		return false
	case exp != "":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// setupTracing configures OpenTelemetry from the standard variables, through
// the contrib autoexport and autoprop packages: the propagators from
// OTEL_PROPAGATORS (default tracecontext,baggage); when tracingEnabled, the
// exporter from OTEL_TRACES_EXPORTER (otlp, console, none) and, for OTLP,
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL (grpc or http/protobuf), endpoint
// and headers; the sampler from OTEL_TRACES_SAMPLER; the resource from
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, over the defaults
// service.name=ledgerd and its version. It returns the function that
// flushes and stops the exporter.
func setupTracing(ctx context.Context, log *slog.Logger) (func(context.Context) error, error) {
	tp, prop, err := newTracing(ctx)
	if err != nil {
		return nil, err
	}
	otel.SetTextMapPropagator(prop)
	if tp == nil {
		// No span is recorded: a noop provider makes each one cost no
		// more than a context (the default provider allocates a span).
		otel.SetTracerProvider(noop.NewTracerProvider())
		return func(context.Context) error { return nil }, nil
	}
	otel.SetTracerProvider(tp)
	log.InfoContext(ctx, "exporting traces", "exporter", os.Getenv("OTEL_TRACES_EXPORTER"), "protocol", os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	return tp.Shutdown, nil
}

// newTracing is setupTracing's provider (nil when no span is to be
// recorded) and propagator, not yet the process's.
func newTracing(ctx context.Context) (*sdktrace.TracerProvider, propagation.TextMapPropagator, error) {
	prop := autoprop.NewTextMapPropagator()
	if !tracingEnabled() {
		return nil, prop, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nil, nil, err
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return nil, prop, nil
	}
	// Later options win: the environment over the defaults.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName("ledgerd"), semconv.ServiceVersion(version())), resource.WithFromEnv())
	if err != nil {
		return nil, nil, err
	}
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), prop, nil
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
