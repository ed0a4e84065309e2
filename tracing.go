package outbox

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Tracing follows one event from the transaction that wrote it to the consumer that reads
// it, with W3C Trace Context (https://www.w3.org/TR/trace-context/):
//
//   - InsertEvent stores the trace context of the span in its ctx, if there is one, in the
//     row's trace_parent and trace_state columns. The columns are written once, with the
//     row, so claims and acknowledgements still rewrite the row in place.
//   - The RocketMQ sender sends the stored context as the message properties traceparent
//     and tracestate, so a consumer continues the trace of the transaction that wrote the
//     event.
//   - With [Config.TracerProvider] set, the publisher makes each send a producer span,
//     linked to the stored context of every event it sends. A link, not a parent: the send
//     happens later, in another process perhaps, and one batch send carries the events of
//     many traces.
//
// Only the W3C propagator is used, never the process's global propagator or tracer
// provider: importing or configuring this package changes nothing process-wide.

const (
	// PropertyTraceParent and PropertyTraceState carry an event's stored W3C trace context
	// in its message, under the names W3C Trace Context gives them, so that any consumer
	// can extract them with a TraceContext propagator.
	PropertyTraceParent = "traceparent"
	PropertyTraceState  = "tracestate"

	// maxTraceState is the trace_state column's width. A longer tracestate loses its last
	// entries, as W3C Trace Context allows a vendor to drop entries to fit its limits.
	maxTraceState = 256
	// maxSendLinks bounds the links of one batch send span (an SDK keeps 128 by default).
	maxSendLinks = 128
	// tracerName is the instrumentation scope of the send spans.
	tracerName = "github.com/go-outbox/outbox"
)

// traceFields is a propagation.TextMapCarrier of the two W3C fields, without a map.
type traceFields struct{ parent, state string }

func (f *traceFields) Get(key string) string {
	switch key {
	case PropertyTraceParent:
		return f.parent
	case PropertyTraceState:
		return f.state
	}
	return ""
}

func (f *traceFields) Set(key, value string) {
	switch key {
	case PropertyTraceParent:
		f.parent = value
	case PropertyTraceState:
		f.state = value
	}
}

func (f *traceFields) Keys() []string { return []string{PropertyTraceParent, PropertyTraceState} }

// traceOf returns the W3C trace context of the span in ctx, as InsertEvent stores it: both
// empty when ctx carries no valid span context. That check is one context lookup and
// allocates nothing, so a service that does not trace pays nothing for it.
func traceOf(ctx context.Context) (parent, state string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	var f traceFields
	propagation.TraceContext{}.Inject(ctx, &f)
	return f.parent, fitTraceState(f.state)
}

// fitTraceState drops a tracestate's last entries until it fits the trace_state column.
func fitTraceState(s string) string {
	for len(s) > maxTraceState {
		i := strings.LastIndexByte(s, ',')
		if i < 0 {
			return ""
		}
		s = strings.TrimRight(s[:i], " \t")
	}
	return s
}

// storedSpanContext parses an event's stored trace context with the W3C propagator. It is
// invalid (trace.SpanContext.IsValid is false) when the event has none or a malformed
// traceparent; a malformed tracestate is dropped and the traceparent kept, as W3C Trace
// Context requires.
func storedSpanContext(ev *Event) trace.SpanContext {
	if ev.TraceParent == "" {
		return trace.SpanContext{}
	}
	f := traceFields{parent: ev.TraceParent, state: ev.TraceState}
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), &f))
}

// traceProperties returns the message properties for an event's stored trace context: none
// unless the stored traceparent is well formed, and a tracestate only if it is too. What a
// row holds was checked when InsertEvent wrote it; this checks again for rows written or
// edited by other means, so that a consumer is never handed a malformed context.
func traceProperties(ev *Event) (parent, state string) {
	sc := storedSpanContext(ev)
	if !sc.IsValid() {
		return "", ""
	}
	if ev.TraceState != "" && sc.TraceState().String() != "" {
		state = ev.TraceState
	}
	return ev.TraceParent, state
}

// sendTracing makes the publisher's send spans. A nil *sendTracing (no
// [Config.TracerProvider]) makes none and costs nothing.
type sendTracing struct {
	tracer trace.Tracer
	name   string
	attrs  []attribute.KeyValue
}

// newSendTracing returns the send tracing for tp and the sender info says, or nil if tp is
// nil. A span is named for the sender's topic if it names one, else "outbox send".
func newSendTracing(tp trace.TracerProvider, info SenderInfo) *sendTracing {
	if tp == nil {
		return nil
	}
	t := &sendTracing{
		tracer: tp.Tracer(tracerName),
		name:   "outbox send",
		attrs:  []attribute.KeyValue{attribute.String("messaging.operation.type", "send")},
	}
	if info.Topic != "" {
		t.name = "send " + info.Topic
		t.attrs = append(t.attrs, attribute.String("messaging.destination.name", info.Topic))
	}
	if info.System != "" {
		t.attrs = append(t.attrs, attribute.String("messaging.system", info.System))
	}
	return t
}

// start starts the span of one send of evs (one event, or a batch), as a producer span
// linked to the stored trace context of each event (of the first maxSendLinks that have
// one). It returns ctx and a nil span when tracing is off.
func (t *sendTracing) start(ctx context.Context, evs ...Event) (context.Context, trace.Span) {
	if t == nil {
		return ctx, nil
	}
	links := make([]trace.Link, 0, min(len(evs), maxSendLinks))
	for i := range evs {
		if len(links) == maxSendLinks {
			break
		}
		if sc := storedSpanContext(&evs[i]); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	attrs := append(t.attrs[:len(t.attrs):len(t.attrs)], attribute.Int("messaging.batch.message_count", len(evs)))
	if len(evs) == 1 {
		attrs = append(attrs, attribute.String("outbox.event.id", evs[0].EventID),
			attribute.String("outbox.event.type", evs[0].EventType))
	}
	return t.tracer.Start(ctx, t.name, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithLinks(links...), trace.WithAttributes(attrs...))
}

// endSendSpan ends a span from sendTracing.start with the send's outcome: an error status
// if any event failed, saying how many. A nil span is ignored.
func endSendSpan(span trace.Span, errs ...error) {
	if span == nil {
		return
	}
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	if first != nil {
		span.RecordError(first)
		span.SetAttributes(attribute.Int("outbox.send.failed", failed))
		span.SetStatus(codes.Error, first.Error())
	}
	span.End()
}
