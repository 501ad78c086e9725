package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// TestLogsCarryTheTraceID: a line logged under a span says its trace and
// span ids.
func TestLogsCarryTheTraceID(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(traceHandler{slog.NewJSONHandler(&buf, nil)}).With("component", "test")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "under a span")
	log.InfoContext(context.Background(), "without one")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"trace_id":"`+sc.TraceID().String()+`"`) ||
		!strings.Contains(lines[0], `"span_id":"`+sc.SpanID().String()+`"`) || strings.Contains(lines[1], "trace_id") {
		t.Fatalf("log:\n%s", buf.String())
	}
}

func TestTracingEnabled(t *testing.T) {
	for env, want := range map[[3]string]bool{
		{"", "", ""}:                          false,
		{"http://collector:4317", "", ""}:     true,
		{"", "otlp", ""}:                      true,
		{"", "console", ""}:                   true,
		{"http://collector:4317", "none", ""}: false,
		{"http://collector:4317", "", "true"}: false,
	} {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", env[0])
		t.Setenv("OTEL_TRACES_EXPORTER", env[1])
		t.Setenv("OTEL_SDK_DISABLED", env[2])
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		if got := tracingEnabled(); got != want {
			t.Errorf("%v: %v, want %v", env, got, want)
		}
	}
}
