package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/trace"
)

type ctxKey struct{}

// Without a span in the context, reading the trace context at insert allocates nothing,
// and without a TracerProvider neither does the publisher's send span.
func TestTracingCostsNothingWhenOff(t *testing.T) {
	ctx := context.WithValue(context.Background(), ctxKey{}, "a request's value")
	var parent, state string
	assert.Zero(t, testing.AllocsPerRun(1000, func() { parent, state = traceOf(ctx) }), "traceOf without a span")
	assert.Empty(t, parent)
	assert.Empty(t, state)

	// The insert statement's two extra arguments: empty strings in interfaces allocate nothing.
	var args [2]any
	assert.Zero(t, testing.AllocsPerRun(1000, func() { args[0], args[1] = traceOf(ctx) }), "the insert's trace arguments")

	var off *sendTracing
	ev := Event{ID: 1, EventID: "e", BizNo: "b", EventType: "E", Payload: []byte("x")}
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		_, span := off.start(ctx, ev)
		endSendSpan(span, nil)
	}), "the send span without a TracerProvider")
}

func BenchmarkTraceOfWithoutSpan(b *testing.B) {
	ctx := context.WithValue(context.Background(), ctxKey{}, "a request's value")
	b.ReportAllocs()
	for b.Loop() {
		traceOf(ctx)
	}
}

func BenchmarkTraceOfWithSpan(b *testing.B) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	b.ReportAllocs()
	for b.Loop() {
		traceOf(ctx)
	}
}
