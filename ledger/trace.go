package ledger

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemledger/idemledger/ledger/errcode"
)

// tracer makes the spans of the store's calls, under the call's span when
// that one is recorded.
var tracer = otel.Tracer("github.com/idemledger/idemledger/ledger")

// Span attributes of a store call.
const (
	AttrDecision  = attribute.Key("idemledger.decision")
	AttrAttempt   = attribute.Key("idemledger.attempt")
	AttrBatchSize = attribute.Key("idemledger.batch_size")
	AttrCode      = attribute.Key("idemledger.code")
)

// noSpan is a span that records nothing (the trace API's own, from a
// context without one).
var noSpan = trace.SpanFromContext(context.Background())

// storeSpan starts the span of a store call ("idemledger.store claim"),
// when the call's own span is recorded; otherwise the store call has a
// span that records nothing and costs nothing.
func storeSpan(ctx context.Context, op string, s Scope) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return tracer.Start(ctx, "idemledger.store "+op, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attribute.String("idemledger.namespace", s.Namespace), attribute.String("idemledger.tenant", s.Tenant)))
}

// endSpan ends a store call's span, with its error's code.
func endSpan(span trace.Span, err error) {
	if err != nil {
		code := errcode.Of(err)
		span.SetAttributes(AttrCode.String(code.String()))
		if code == errcode.Internal || code == errcode.Unavailable || code == errcode.UpstreamTimeout || code == errcode.Contention {
			span.SetStatus(otelcodes.Error, code.String())
		}
	}
	span.End()
}

// endBegin ends Begin's span with its decision and attempt.
func endBegin(span trace.Span, res BeginResponse, err error) {
	switch {
	case res.Claim != nil && res.Claim.Attempt > 1:
		span.SetAttributes(AttrDecision.String("taken_over"), AttrAttempt.Int64(int64(res.Claim.Attempt)))
	case res.Claim != nil:
		span.SetAttributes(AttrDecision.String("claimed"), AttrAttempt.Int64(int64(res.Claim.Attempt)))
	case res.Replay != nil:
		span.SetAttributes(AttrDecision.String("replayed"), AttrAttempt.Int64(int64(res.Replay.Attempt)))
	case err != nil:
		span.SetAttributes(AttrDecision.String(strings.ToLower(errcode.Of(err).String())))
	}
	endSpan(span, err)
}
