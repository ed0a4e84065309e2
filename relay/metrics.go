package relay

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
)

const meterName = "github.com/go-outbox/outbox/relay"

// metrics are the relay's instruments. The event counters have the publisher's names and
// attributes (outbox.events.sent, .retried, .dead_lettered, by event_type), so that a
// dashboard of the table counts what is sent whichever way it is published; the
// outbox.relay.* ones are the relay's own. Nil records nothing.
type metrics struct {
	sent, retried, deadLettered metric.Int64Counter
	resent, swept, terms, lost  metric.Int64Counter
	reg                         metric.Registration
}

func newMetrics(mp metric.MeterProvider, r *Relay) (*metrics, error) {
	if mp == nil {
		return nil, nil
	}
	meter := mp.Meter(meterName)
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{event}"))
		errs = append(errs, err)
		return c
	}
	m := &metrics{
		sent:         counter("outbox.events.sent", "Events the broker accepted."),
		retried:      counter("outbox.events.retried", "Failed sends released for a later retry, with backoff."),
		deadLettered: counter("outbox.events.dead_lettered", "Events marked FAIL: a permanent error, the last retry, or too many reclaims."),
		resent:       counter("outbox.relay.events.resent", "Events sent twice: the relay sent them and could not mark them SUCCESS before its term ended (whoever publishes next sends them again), or found them SUCCESS, sent by another publisher, when it marked them."),
		swept:        counter("outbox.relay.events.swept", "Events the relay sent from the table rather than the binlog: at a term's start, after a position was lost, for a key released."),
	}
	terms, err := meter.Int64Counter("outbox.relay.terms", metric.WithDescription("Terms of leadership this relay began."))
	errs = append(errs, err)
	lost, err := meter.Int64Counter("outbox.relay.positions_lost", metric.WithDescription("Times the binlog could not be followed (a purged position, DDL, a statement-format change) and the table was swept."))
	errs = append(errs, err)
	m.terms, m.lost = terms, lost
	leader, err := meter.Int64ObservableGauge("outbox.relay.leader", metric.WithDescription("1 while this relay leads its table, else 0."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	table := metric.WithAttributes(attribute.String("table", r.cfg.Table), attribute.String("instance_id", r.cfg.InstanceID))
	m.reg, err = meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		v := int64(0)
		if r.Health().Leader {
			v = 1
		}
		o.ObserveInt64(leader, v, table)
		return nil
	}, leader)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func typeAttr(ev outbox.Event) metric.AddOption {
	return metric.WithAttributes(attribute.String("event_type", ev.EventType))
}

func (m *metrics) sentEvents(ctx context.Context, evs []outbox.Event) {
	if m == nil {
		return
	}
	for _, ev := range evs {
		m.sent.Add(ctx, 1, typeAttr(ev))
	}
}

func (m *metrics) retry(ctx context.Context, ev outbox.Event) {
	if m != nil {
		m.retried.Add(ctx, 1, typeAttr(ev))
	}
}

func (m *metrics) deadLetter(ctx context.Context, ev outbox.Event, cause error) {
	if m == nil {
		return
	}
	reason := "retries"
	if outbox.IsPermanent(cause) {
		reason = "permanent"
	}
	m.deadLettered.Add(ctx, 1, metric.WithAttributes(attribute.String("event_type", ev.EventType), attribute.String("reason", reason)))
}

func (m *metrics) add(ctx context.Context, c func(*metrics) metric.Int64Counter, n int64) {
	if m != nil && n > 0 {
		c(m).Add(ctx, n)
	}
}

func (m *metrics) close() {
	if m != nil && m.reg != nil {
		_ = m.reg.Unregister()
	}
}
