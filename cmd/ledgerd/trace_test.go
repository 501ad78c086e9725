package main_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"

	ledgerv1 "github.com/idemledger/idemledger/gen/idemledger/v1"
	"github.com/idemledger/idemledger/interceptors/grpcguard"
	"github.com/idemledger/idemledger/interceptors/guard"
	testpb "github.com/idemledger/idemledger/internal/testpb"
	"github.com/idemledger/idemledger/ledger/ledgerclient"
	"github.com/idemledger/idemledger/ledger/ledgertest"
	"github.com/idemledger/idemledger/server/servertest"
)

type traced struct {
	testpb.UnimplementedInvoiceServiceServer
}

func (traced) CreateInvoice(ctx context.Context, req *testpb.CreateInvoiceRequest) (*testpb.CreateInvoiceResponse, error) {
	_, span := otel.Tracer("invoices").Start(ctx, "handler")
	defer span.End()
	return &testpb.CreateInvoiceResponse{Invoice: &testpb.Invoice{Id: "inv_1", Tenant: req.GetTenant()}}, nil
}

// spanRecorder is the process's one tracer provider's recorder: the
// libraries' tracers bind to the first provider set, so a second one
// (-count=2) would record nothing. Each test reads the spans of its own
// trace.
var spanRecorder = sync.OnceValue(func() *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return rec
})

// TestSpanTree: one protected call, traced end to end with an in-memory
// exporter, over the ledger's unary calls and over its Stream: the write
// service's span holds the guard's, which holds Begin (client, then
// server, then the store's claim), the handler, then Complete (client,
// server, the store's complete); the store's span says the decision and
// the attempt.
func TestSpanTree(t *testing.T) {
	rec := spanRecorder()
	for _, api := range []string{"Unary", "Stream"} {
		t.Run(api, func(t *testing.T) {
			ledger := tracedLedger(t, api)
			g, err := guard.New(ledger)
			if err != nil {
				t.Fatal(err)
			}
			icpt, err := grpcguard.UnaryServerInterceptor(g,
				grpcguard.WithMethod("/idemledger.testing.v1.InvoiceService/CreateInvoice", grpcguard.Method{Policy: guard.Policy{}}), grpcguard.WithKeyField("request_id"))
			if err != nil {
				t.Fatal(err)
			}
			svcConn := servertest.NewServer(t, func(gs *grpc.Server) { testpb.RegisterInvoiceServiceServer(gs, traced{}) },
				grpc.StatsHandler(otelgrpc.NewServerHandler()), grpc.UnaryInterceptor(icpt)).Dial(t, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
			ctx, root := otel.Tracer("agent").Start(context.Background(), "agent")
			if _, err := testpb.NewInvoiceServiceClient(svcConn).CreateInvoice(ctx, &testpb.CreateInvoiceRequest{RequestId: "k-1", Tenant: "acme", CustomerId: "c", Currency: "EUR"}); err != nil {
				t.Fatal(err)
			}
			root.End()

			guardPath := "agent > idemledger.testing.v1.InvoiceService/CreateInvoice > idemledger.testing.v1.InvoiceService/CreateInvoice > idemledger.guard /idemledger.testing.v1.InvoiceService/CreateInvoice"
			wants := []string{
				guardPath + " > idemledger.v1.LedgerService/Begin > idemledger.v1.LedgerService/Begin > idemledger.store claim",
				guardPath + " > handler",
				guardPath + " > idemledger.v1.LedgerService/Complete > idemledger.v1.LedgerService/Complete > idemledger.store complete",
			}
			// collect reads the trace's ended spans and their paths (each
			// span's ancestry, from the root, by name).
			collect := func() (spans []sdktrace.ReadOnlySpan, paths []string) {
				for _, s := range rec.Ended() {
					if s.SpanContext().TraceID() == root.SpanContext().TraceID() {
						spans = append(spans, s)
					}
				}
				byID := map[string]sdktrace.ReadOnlySpan{}
				for _, s := range spans {
					byID[s.SpanContext().SpanID().String()] = s
				}
				for _, s := range spans {
					var names []string
					for p := s; p != nil; p = byID[p.Parent().SpanID().String()] {
						names = append([]string{p.Name()}, names...)
					}
					paths = append(paths, strings.Join(names, " > "))
				}
				return spans, paths
			}
			// A server's span ends after its answer is sent, so the client
			// may have the answer first: wait a little for the last spans.
			var spans []sdktrace.ReadOnlySpan
			var paths []string
			ledgertest.Eventually(t, 5*time.Second, func() bool {
				spans, paths = collect()
				return missing(wants, paths) == nil
			}, "a span at every path; missing:\n  %s\nspans:\n  %s", lazy(func() string { return strings.Join(missing(wants, paths), "\n  ") }),
				lazy(func() string { return strings.Join(paths, "\n  ") }))
			for _, s := range spans {
				if s.Name() != "idemledger.store claim" {
					continue
				}
				attrs := map[string]string{}
				for _, a := range s.Attributes() {
					attrs[string(a.Key)] = a.Value.String()
				}
				if attrs["idemledger.decision"] != "claimed" || attrs["idemledger.attempt"] != "1" {
					t.Errorf("the store's claim span: %v", attrs)
				}
				if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
					t.Error("the store's span is in another trace")
				}
			}
		})
	}
}

// tracedLedger is a LedgerService on the memory store, called with unary
// calls (otelgrpc traces them on both sides) or on a Stream (ledgerclient
// and the server trace each call).
func tracedLedger(t *testing.T, api string) ledgerv1.LedgerServiceClient {
	t.Helper()
	if api == "Stream" {
		// The Stream's own span would be the stream's, not a call's: the
		// calls' spans come from ledgerclient and the server.
		conn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("billing"))).Dial(t)
		c := ledgerclient.New(ledgerv1.NewLedgerServiceClient(conn))
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	conn := servertest.NewServer(t, servertest.Ledger(servertest.MemoryLedger("billing")),
		grpc.StatsHandler(otelgrpc.NewServerHandler())).Dial(t, grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	return ledgerv1.NewLedgerServiceClient(conn)
}

// missing returns the wants that paths lacks.
func missing(wants, paths []string) []string {
	var out []string
	for _, w := range wants {
		if !slices.Contains(paths, w) {
			out = append(out, w)
		}
	}
	return out
}

// lazy is a message part formatted when a test fails, not when it is
// written.
type lazy func() string

func (f lazy) String() string { return f() }
