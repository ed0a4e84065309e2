package inbox

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// metrics are the inbox's instruments; nil without a MeterProvider, when recording costs
// nothing. Their attributes are bounded: an outcome, a reason class, never an id.
type metrics struct {
	messages metric.Int64Counter     // inbox.messages{outcome}
	rejected metric.Int64Counter     // inbox.rejected{reason}
	duration metric.Float64Histogram // inbox.handle.duration{outcome}
	lag      metric.Float64Histogram // inbox.lag: from the event's insert to its handling
	outcomes map[Outcome]metric.MeasurementOption
}

// The histograms' buckets, in seconds: a delivery takes milliseconds; the lag runs from
// milliseconds (a consumer keeping up) to hours (a backlog, a retry after RocketMQ's
// backoff).
var (
	durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	lagBuckets      = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600}
)

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		return nil, nil
	}
	meter := mp.Meter("github.com/go-outbox/outbox/inbox")
	m := &metrics{outcomes: map[Outcome]metric.MeasurementOption{}}
	var errs [4]error
	m.messages, errs[0] = meter.Int64Counter("inbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Deliveries by outcome: handled (the effect committed), duplicate (suppressed), rejected, failed (delivered again)."))
	m.rejected, errs[1] = meter.Int64Counter("inbox.rejected", metric.WithUnit("{message}"),
		metric.WithDescription("Messages recorded as rejected, by reason: no_event_id, invalid_event_id, permanent, max_deliveries."))
	m.duration, errs[2] = meter.Float64Histogram("inbox.handle.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of one delivery: the inbox record, the handler and the commit."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	m.lag, errs[3] = meter.Float64Histogram("inbox.lag", metric.WithUnit("s"),
		metric.WithDescription("Time from the event's insert (the time in its UUIDv7 event id) to the commit of its effect."),
		metric.WithExplicitBucketBoundaries(lagBuckets...))
	for _, o := range []Outcome{Handled, Duplicate, Rejected, Failed} {
		m.outcomes[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o.String())))
	}
	return m, errors.Join(errs[:]...)
}

// delivered records one delivery begun at start.
func (m *metrics) delivered(ctx context.Context, msg *Message, o Outcome, start time.Time) {
	if m == nil {
		return
	}
	now := time.Now()
	m.messages.Add(ctx, 1, m.outcomes[o])
	m.duration.Record(ctx, now.Sub(start).Seconds(), m.outcomes[o])
	if o == Handled {
		if at := eventTime(msg.EventID); !at.IsZero() {
			m.lag.Record(ctx, max(now.Sub(at), 0).Seconds())
		}
	}
}

func (m *metrics) rejectedOne(ctx context.Context, class string) {
	if m == nil {
		return
	}
	m.rejected.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", class)))
}

// properties reads a message's properties for the W3C propagator.
type properties map[string]string

func (p properties) Get(key string) string { return p[key] }
func (p properties) Set(string, string)    {}
func (p properties) Keys() []string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	return keys
}

// startSpan starts the delivery's consumer span, continuing the trace the message carries
// (the W3C propagator is used directly: nothing global), and returns the function that
// ends it. Without a TracerProvider it does nothing.
func (in *Inbox) startSpan(ctx context.Context, msg *Message) (context.Context, func(Outcome, error)) {
	if in.tracer == nil {
		return ctx, func(Outcome, error) {}
	}
	ctx = propagation.TraceContext{}.Extract(ctx, properties(msg.Properties))
	ctx, span := in.tracer.Start(ctx, "process "+msg.Topic, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			attribute.String("messaging.system", "rocketmq"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", msg.Topic),
			attribute.String("messaging.consumer.group.name", in.cfg.Group),
			attribute.String("messaging.message.id", msg.MsgID),
		))
	return ctx, func(o Outcome, err error) {
		span.SetAttributes(attribute.String("outbox.inbox.outcome", o.String()))
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
