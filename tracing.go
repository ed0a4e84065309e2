package outbox

import (
	"context"
	"strings"
	"sync/atomic"

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
//     many traces. A batch of more than 128 events gets one span per 128 events: an SDK
//     keeps 128 links per span by default and drops the rest.
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
	// maxSendLinks is how many events one send span covers and links to: an SDK keeps 128
	// links per span by default (SpanLimits.LinkCountLimit) and drops the rest.
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

// unknownTopicLabel names, in metrics and spans, a topic outside the store's set (such an
// event is dead-lettered, never sent): parentheses are in no topic name, so it is no
// topic's.
const unknownTopicLabel = "(unknown)"

// topicNames names an event's topic in metrics and spans: its own ([Event.Topic]), within
// the store's set of topics ([StoreInfo.Topics]), which the publisher learns from the
// store's check; a topic outside it is unknownTopicLabel, so that the names stay bounded.
type topicNames struct {
	known atomic.Pointer[map[string]bool] // nil: any (a store that declares no set)
}

// set makes topics the known set (nil: any).
func (n *topicNames) set(topics []string) {
	if topics == nil {
		n.known.Store(nil)
		return
	}
	known := make(map[string]bool, len(topics))
	for _, t := range topics {
		known[t] = true
	}
	n.known.Store(&known)
}

// of returns the name of ev's topic.
func (n *topicNames) of(ev *Event) string {
	if known := n.known.Load(); known != nil && ev.Topic != "" && !(*known)[ev.Topic] {
		return unknownTopicLabel
	}
	return ev.Topic
}

// sendTracing makes the publisher's send spans. A nil *sendTracing (no
// [Config.TracerProvider]) makes none and costs nothing.
type sendTracing struct {
	tracer trace.Tracer
	topics *topicNames
	attrs  []attribute.KeyValue
}

// newSendTracing returns the send tracing for tp and the sender info says, or nil if tp is
// nil. A span is named for its events' topic ("send ORDERS"), or "outbox send" for events
// that name none; a named store ([Config.StoreName]) is its attribute outbox.store.
func newSendTracing(tp trace.TracerProvider, info SenderInfo, topics *topicNames, store string) *sendTracing {
	if tp == nil {
		return nil
	}
	t := &sendTracing{
		tracer: tp.Tracer(tracerName),
		topics: topics,
		attrs:  []attribute.KeyValue{attribute.String("messaging.operation.type", "send")},
	}
	if info.System != "" {
		t.attrs = append(t.attrs, attribute.String("messaging.system", info.System))
	}
	if store != "" {
		t.attrs = append(t.attrs, attribute.String("outbox.store", store))
	}
	return t
}

// sendSpans are the spans of one send: a producer span for each topic of its events, and
// for each run of at most maxSendLinks of a topic's events, in order, so that every event's
// stored trace context is linked from one. A send of one event, or of a batch of one topic
// and up to maxSendLinks events, has one span. Nil when tracing is off.
type sendSpans []sendSpan

// sendSpan is one span of a send, and the positions of its events in the send.
type sendSpan struct {
	span trace.Span
	at   []int
}

// start starts the spans of one send of evs (one event, or a batch), each a producer span
// named for its events' topic and linked to the stored trace context of each of its events
// that has one. The spans of a longer batch, or of one that spans topics, are siblings,
// timed alike; a topic's are told apart by outbox.send.part (1 to outbox.send.parts);
// messaging.batch.message_count is the events of the span. It returns ctx with the first
// span, or ctx and nil when tracing is off.
func (t *sendTracing) start(ctx context.Context, evs ...Event) (context.Context, sendSpans) {
	if t == nil {
		return ctx, nil
	}
	var order []string
	byTopic := map[string][]int{}
	for i := range evs {
		topic := t.topics.of(&evs[i])
		if _, ok := byTopic[topic]; !ok {
			order = append(order, topic)
		}
		byTopic[topic] = append(byTopic[topic], i)
	}
	if len(evs) == 0 {
		order = []string{""}
	}
	var spans sendSpans
	sendCtx := ctx
	for _, topic := range order {
		at := byTopic[topic]
		name := "outbox send"
		attrs := t.attrs[:len(t.attrs):len(t.attrs)]
		if topic != "" {
			name = "send " + topic
			attrs = append(attrs, attribute.String("messaging.destination.name", topic))
		}
		parts := max(1, (len(at)+maxSendLinks-1)/maxSendLinks)
		for part := range parts {
			chunk := at[part*maxSendLinks : min((part+1)*maxSendLinks, len(at))]
			links := make([]trace.Link, 0, len(chunk))
			for _, i := range chunk {
				if sc := storedSpanContext(&evs[i]); sc.IsValid() {
					links = append(links, trace.Link{SpanContext: sc})
				}
			}
			attrs := append(attrs[:len(attrs):len(attrs)], attribute.Int("messaging.batch.message_count", len(chunk)))
			if len(evs) == 1 {
				attrs = append(attrs, attribute.String("outbox.event.id", evs[0].EventID),
					attribute.String("outbox.event.type", evs[0].EventType))
			}
			if parts > 1 {
				attrs = append(attrs, attribute.Int("outbox.send.part", part+1), attribute.Int("outbox.send.parts", parts))
			}
			spanCtx, span := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithLinks(links...), trace.WithAttributes(attrs...))
			if len(spans) == 0 {
				sendCtx = spanCtx
			}
			spans = append(spans, sendSpan{span: span, at: chunk})
		}
	}
	return sendCtx, spans
}

// endSendSpan ends the spans from sendTracing.start with the send's outcome, errs[i] being
// the i-th event's: each span gets an error status if any of its events failed, saying how
// many. Nil spans are ignored.
func endSendSpan(spans sendSpans, errs ...error) {
	for _, s := range spans {
		own := make([]error, 0, len(s.at))
		for _, i := range s.at {
			if i < len(errs) {
				own = append(own, errs[i])
			}
		}
		endSpan(s.span, own)
	}
}

// endSpan ends one send span with the outcome of its events.
func endSpan(span trace.Span, errs []error) {
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
