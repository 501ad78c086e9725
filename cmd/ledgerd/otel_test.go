package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// receiver is an OTLP trace receiver on loopback, over gRPC and over HTTP
// (protobuf): it keeps every resource's attributes and span names it got,
// and by which protocol.
type receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu   sync.Mutex
	got  []received
	grpc string // host:port
	http string // http://host:port
}

type received struct {
	protocol string
	attrs    map[string]string
	spans    []string
}

func (r *receiver) note(protocol string, req *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		g := received{protocol: protocol, attrs: map[string]string{}}
		for _, kv := range rs.GetResource().GetAttributes() {
			g.attrs[kv.GetKey()] = value(kv.GetValue())
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				g.spans = append(g.spans, s.GetName())
			}
		}
		r.got = append(r.got, g)
	}
}

func value(v *commonpb.AnyValue) string { return v.GetStringValue() }

func (r *receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.note("grpc", req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func (r *receiver) received() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	r := &receiver{}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, r)
	go func() { _ = gs.Serve(gl) }()
	t.Cleanup(gs.Stop)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		var msg coltracepb.ExportTraceServiceRequest
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &msg) != nil {
			http.Error(w, "not OTLP/HTTP protobuf", http.StatusBadRequest)
			return
		}
		r.note("http/protobuf", &msg)
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	})}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { _ = hs.Close() })
	r.grpc, r.http = gl.Addr().String(), "http://"+hl.Addr().String()
	return r
}

// traceOnce sets tracing up from the environment (not as the process's:
// the libraries bind to the first provider set, TestSpanTree's), records
// one span, flushes it, and returns the propagator.
func traceOnce(t *testing.T) propagation.TextMapPropagator {
	t.Helper()
	tp, prop, err := newTracing(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if tp == nil {
		return prop
	}
	_, span := tp.Tracer("test").Start(t.Context(), "the-span")
	span.End()
	if err := tp.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	return prop
}

// clearOTel unsets every OTEL_* variable for the test.
func clearOTel(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "")
			_ = os.Unsetenv(k)
		}
	}
}

// TestOpenTelemetryVariables: each standard variable does what the
// specification says, against a real OTLP receiver on loopback.
func TestOpenTelemetryVariables(t *testing.T) {
	t.Run("protocol", func(t *testing.T) {
		for _, c := range []struct{ protocol, endpoint func(*receiver) string }{
			{func(*receiver) string { return "grpc" }, func(r *receiver) string { return "http://" + r.grpc }},
			{func(*receiver) string { return "http/protobuf" }, func(r *receiver) string { return r.http }},
		} {
			clearOTel(t)
			r := newReceiver(t)
			protocol := c.protocol(r)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", c.endpoint(r))
			traceOnce(t)
			got := r.received()
			if len(got) != 1 || got[0].protocol != protocol || !slices.Contains(got[0].spans, "the-span") || got[0].attrs["service.name"] != "ledgerd" {
				t.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: the receiver got %+v; want the span over %s, service.name=ledgerd", protocol, got, protocol)
			}
		}
	})
	resource := func(t *testing.T, env map[string]string) map[string]string {
		t.Helper()
		clearOTel(t)
		r := newReceiver(t)
		t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+r.grpc)
		for k, v := range env {
			t.Setenv(k, v)
		}
		traceOnce(t)
		got := r.received()
		if len(got) != 1 {
			t.Fatalf("the receiver got %+v", got)
		}
		return got[0].attrs
	}
	t.Run("OTEL_SERVICE_NAME", func(t *testing.T) {
		if got := resource(t, map[string]string{"OTEL_SERVICE_NAME": "billing-ledger"})["service.name"]; got != "billing-ledger" {
			t.Errorf("service.name = %q, want billing-ledger", got)
		}
	})
	t.Run("OTEL_RESOURCE_ATTRIBUTES", func(t *testing.T) {
		attrs := resource(t, map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=ledger-eu,deployment.environment.name=prod"})
		if attrs["service.name"] != "ledger-eu" || attrs["deployment.environment.name"] != "prod" {
			t.Errorf("resource = %v; want service.name=ledger-eu and deployment.environment.name=prod", attrs)
		}
	})
	t.Run("OTEL_TRACES_EXPORTER", func(t *testing.T) {
		for _, c := range []struct {
			exporter string
			received int
		}{{"otlp", 1}, {"none", 0}, {"console", 0}} {
			clearOTel(t)
			r := newReceiver(t)
			t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+r.grpc)
			t.Setenv("OTEL_TRACES_EXPORTER", c.exporter)
			out := captureStdout(t, func() { traceOnce(t) })
			if got := len(r.received()); got != c.received {
				t.Errorf("OTEL_TRACES_EXPORTER=%s: the receiver got %d exports, want %d", c.exporter, got, c.received)
			}
			if printed := strings.Contains(out, "the-span"); printed != (c.exporter == "console") {
				t.Errorf("OTEL_TRACES_EXPORTER=%s: the span on stdout: %t\n%s", c.exporter, printed, out)
			}
		}
	})
	t.Run("OTEL_PROPAGATORS", func(t *testing.T) {
		for env, want := range map[string][]string{
			"":                        {"traceparent", "baggage"},
			"b3":                      {"b3"},
			"tracecontext,baggage,b3": {"traceparent", "baggage", "b3"},
		} {
			clearOTel(t)
			t.Setenv("OTEL_PROPAGATORS", env)
			fields := traceOnce(t).Fields()
			for _, f := range want {
				if !slices.Contains(fields, f) && !slices.Contains(fields, strings.ToLower(f)) {
					t.Errorf("OTEL_PROPAGATORS=%q: the propagator's fields %v lack %s", env, fields, f)
				}
			}
		}
	})
}

// captureStdout runs f with file descriptor 1 on a pipe (the console
// exporter took os.Stdout when its package was initialized) and returns
// what was written to it.
func captureStdout(t *testing.T, f func()) string {
	t.Helper()
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := syscall.Dup(1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string)
	go func() { b, _ := io.ReadAll(rd); done <- string(b) }()
	if err := syscall.Dup3(int(wr.Fd()), 1, 0); err != nil {
		t.Fatal(err)
	}
	f()
	if err := syscall.Dup3(saved, 1, 0); err != nil {
		t.Fatal(err)
	}
	_ = syscall.Close(saved)
	_ = wr.Close()
	return <-done
}
