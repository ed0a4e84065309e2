package outbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterName is the instrumentation scope of the publisher's instruments.
const meterName = "github.com/go-outbox/outbox"

// lockRetrier is implemented by a store that counts its lock-conflict retries, as
// MySQLStore does.
type lockRetrier interface{ lockRetryCount() int64 }

// Attribute keys and values of the publisher's instruments: a closed set, so that every
// series is bounded. Event types are the service's own, and few; topics are the store's
// set ([StoreInfo.Topics]), "(unknown)" for a topic outside it, on every measurement of an
// event; store names are the service's configuration ([Config.StoreName]), on every
// measurement of a named publisher.
const (
	attrEventType = "event_type"
	attrTopic     = "topic"
	attrOutcome   = "outcome"
	attrReason    = "reason"
	attrStore     = "store"
)

// Bucket boundaries, in seconds: a send takes milliseconds; commit to send spans a wake-up
// (milliseconds), a poll interval (seconds), a backoff or an outage (minutes to an hour).
var (
	sendBuckets         = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	commitToSendBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// metrics holds the publisher's instruments. A nil *metrics (no [Config.MeterProvider]) is
// valid: every method returns at once, at no cost, and nothing is registered anywhere.
type metrics struct {
	log *slog.Logger

	sent, retried, deadLettered, reclaimed, claimsLost, leasesLost, outages metric.Int64Counter
	unconfirmedSent                                                         metric.Int64Counter
	sendDuration, commitToSend                                              metric.Float64Histogram

	// Observed: registered while Run runs (observe).
	meter                                          metric.Meter
	lockRetries                                    metric.Int64ObservableCounter
	brokerUnavailable                              metric.Int64ObservableGauge
	backlog, sending, sendingPastHalfLease, failed metric.Int64ObservableGauge
	oldestDueAge, oldestClaimAge                   metric.Float64ObservableGauge

	outcomeSent, outcomeFailed, outcomeUnavailable metric.MeasurementOption
	byType                                         sync.Map // eventAttrKey -> metric.MeasurementOption

	// topics names each event's topic, for the topic attribute.
	topics *topicNames

	// store is the store attribute (none for an unnamed store), added to every measurement;
	// plain is the option of a measurement with no other attribute.
	store []attribute.KeyValue
	plain metric.MeasurementOption

	stats statsCache
}

// newMetrics makes the publisher's instruments on cfg.MeterProvider, or returns nil without
// one. topics names the events' topics.
func newMetrics(cfg Config, store Store, topics *topicNames, log *slog.Logger) (*metrics, error) {
	if cfg.MeterProvider == nil {
		return nil, nil
	}
	meter := cfg.MeterProvider.Meter(meterName)
	m := &metrics{log: log, meter: meter, topics: topics}
	if cfg.StoreName != "" {
		m.store = []attribute.KeyValue{attribute.String(attrStore, cfg.StoreName)}
	}
	m.plain = m.attrs()
	m.outcomeSent = m.attrs(attribute.String(attrOutcome, "sent"))
	m.outcomeFailed = m.attrs(attribute.String(attrOutcome, "failed"))
	m.outcomeUnavailable = m.attrs(attribute.String(attrOutcome, "unavailable"))
	m.stats = statsCache{reader: store, interval: cfg.Tuning.StatsInterval, timeout: cfg.Tuning.StoreTimeout, lease: cfg.Tuning.Lease, log: log}
	events := metric.WithUnit("{event}")
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(name, metric.WithDescription(desc), events)
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	m.sent = counter("outbox.events.sent", "Events the broker accepted.")
	m.retried = counter("outbox.events.retried", "Failed sends released for a later retry, with backoff.")
	m.unconfirmedSent = counter("outbox.events.unconfirmed", "Events the broker stored without confirming them flushed or replicated in time (counted in outbox.events.sent too); sent once, not again.")
	m.deadLettered = counter("outbox.events.dead_lettered", "Events marked FAIL: a permanent error, the last retry, or too many reclaims.")
	m.reclaimed = counter("outbox.events.reclaimed", "SENDING events returned to WAIT because their lease expired (their instance died or stalled).")
	m.claimsLost = counter("outbox.claims.lost", "Per-row claims another instance won first.")
	m.leasesLost = counter("outbox.leases.lost", "Outcomes not recorded because the lease had been reclaimed by then.")
	oc, err := meter.Int64Counter("outbox.broker.outages",
		metric.WithDescription("Times the publisher found the broker unavailable and paused its claims."), metric.WithUnit("{outage}"))
	m.outages = oc
	errs = append(errs, err)
	m.sendDuration = histogram("outbox.send.duration", "Duration of one Sender.Send call: one event, or one batch.", sendBuckets)
	m.commitToSend = histogram("outbox.commit_to_send.duration",
		"From the event's commit (create_time), or the due time of one written with a delay, to the broker's acceptance, by the database clock up to the read and this process's clock after.",
		commitToSendBuckets)

	m.lockRetries, err = meter.Int64ObservableCounter("outbox.store.lock_retries",
		metric.WithDescription("Store statements run again after a deadlock or a lock wait timeout."), metric.WithUnit("{statement}"))
	errs = append(errs, err)
	m.brokerUnavailable, err = meter.Int64ObservableGauge("outbox.broker.unavailable",
		// No unit: "1" would make Prometheus's name outbox_broker_unavailable_ratio.
		metric.WithDescription("1 while the publisher finds the broker unavailable and probes it, else 0."))
	errs = append(errs, err)
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithDescription(desc), events)
		errs = append(errs, err)
		return g
	}
	ageGauge := func(name, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit("s"))
		errs = append(errs, err)
		return g
	}
	m.backlog = gauge("outbox.table.backlog", "WAIT rows due now.")
	m.oldestDueAge = ageGauge("outbox.table.oldest_due_age", "How long the oldest due WAIT row has been due: the publish lag.")
	m.sending = gauge("outbox.table.sending", "SENDING rows: claimed, outcome not yet recorded.")
	m.oldestClaimAge = ageGauge("outbox.table.oldest_claim_age", "Age of the oldest SENDING claim.")
	m.sendingPastHalfLease = gauge("outbox.table.sending_past_half_lease", "SENDING rows claimed more than half a lease ago.")
	m.failed = gauge("outbox.table.failed", "FAIL rows (dead letters) by event type.")
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return m, nil
}

// attrs is the measurement option of kvs and the store attribute.
func (m *metrics) attrs(kvs ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(kvs[:len(kvs):len(kvs)], m.store...)...))
}

// eventAttrKey is an event's attributes: its type, and its topic ("" for none).
type eventAttrKey struct{ eventType, topic string }

// typeAttr is the event_type attribute (and the store's), made once per type.
func (m *metrics) typeAttr(eventType string) metric.MeasurementOption {
	return m.eventAttr(eventAttrKey{eventType: eventType})
}

// eventAttr is the attributes of k (and the store's), made once per type and topic.
func (m *metrics) eventAttr(k eventAttrKey) metric.MeasurementOption {
	if o, ok := m.byType.Load(k); ok {
		return o.(metric.MeasurementOption)
	}
	kvs := []attribute.KeyValue{attribute.String(attrEventType, k.eventType)}
	if k.topic != "" {
		kvs = append(kvs, attribute.String(attrTopic, k.topic))
	}
	o := m.attrs(kvs...)
	m.byType.Store(k, o)
	return o
}

// eventAttrs is the attributes of ev's measurements: its event type and its topic.
func (m *metrics) eventAttrs(ev *Event) metric.MeasurementOption {
	return m.eventAttr(eventAttrKey{eventType: ev.EventType, topic: m.topics.of(ev)})
}

// observe registers the observed instruments for p while Run runs; the returned function
// unregisters them.
func (m *metrics) observe(p *Publisher) func() {
	if m == nil {
		return func() {}
	}
	instruments := []metric.Observable{m.brokerUnavailable}
	lr, hasLocks := p.store.(lockRetrier)
	if hasLocks {
		instruments = append(instruments, m.lockRetries)
	}
	if m.stats.reader != nil {
		instruments = append(instruments, m.backlog, m.oldestDueAge, m.sending, m.oldestClaimAge, m.sendingPastHalfLease, m.failed)
	}
	reg, err := m.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		o.ObserveInt64(m.brokerUnavailable, boolCount(p.Health().BrokerUnavailable), m.plain)
		if hasLocks {
			o.ObserveInt64(m.lockRetries, lr.lockRetryCount(), m.plain)
		}
		if st, ok := m.stats.get(ctx); ok {
			o.ObserveInt64(m.backlog, st.Due, m.plain)
			o.ObserveFloat64(m.oldestDueAge, st.OldestDueAge.Seconds(), m.plain)
			o.ObserveInt64(m.sending, st.Sending, m.plain)
			o.ObserveFloat64(m.oldestClaimAge, st.OldestClaimAge.Seconds(), m.plain)
			o.ObserveInt64(m.sendingPastHalfLease, st.SendingPastHalfLease, m.plain)
			for t, n := range st.FailByType {
				o.ObserveInt64(m.failed, n, m.typeAttr(t))
			}
		}
		return nil
	}, instruments...)
	if err != nil {
		m.log.Error("outbox: could not register the publisher's gauges", slog.Any("error", err))
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}

// statsCache reads the table's statistics at most once per interval, however often the
// gauges are collected: a scrape between two reads gets the last read. The table gauges
// (backlog, publish lag, SENDING and FAIL rows) report nothing for a store whose Stats is
// unsupported.
type statsCache struct {
	reader                   Store
	unsupported              bool // the store's Stats said errors.ErrUnsupported: asked no more
	interval, timeout, lease time.Duration
	log                      *slog.Logger
	mu                       sync.Mutex
	readAt                   time.Time // of the last read, successful or not
	last                     TableStats
	ok                       bool
}

func (c *statsCache) get(ctx context.Context) (TableStats, bool) {
	if c.reader == nil {
		return TableStats{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unsupported {
		return TableStats{}, false
	}
	if !c.readAt.IsZero() && time.Since(c.readAt) < c.interval {
		return c.last, c.ok
	}
	c.readAt = time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	st, err := c.reader.Stats(ctx, StatsOptions{Lease: c.lease})
	if errors.Is(err, errors.ErrUnsupported) {
		c.unsupported = true
		return TableStats{}, false
	}
	if err != nil {
		c.log.WarnContext(ctx, "outbox: could not read the table's statistics for the gauges", slog.Any("error", err))
		c.last, c.ok = TableStats{}, false
		return c.last, false
	}
	c.last, c.ok = st, true
	return st, true
}

// now is the start of a timed call: the zero time when metrics are off, so that they cost
// nothing.
func (m *metrics) now() time.Time {
	if m == nil {
		return time.Time{}
	}
	return time.Now()
}

// sendDone records one Send call begun at start that returned *err.
func (m *metrics) sendDone(ctx context.Context, ev Event, start time.Time, err *error) {
	if m == nil {
		return
	}
	end := time.Now()
	m.sendDuration.Record(ctx, end.Sub(start).Seconds(), m.sendOutcome(*err))
	if stored(*err) {
		m.accepted(ctx, ev, end)
	}
}

// batchSent runs one Sender.Send call and records it.
func (m *metrics) batchSent(ctx context.Context, evs []Event, send func() []error) []error {
	if m == nil {
		return send()
	}
	start := time.Now()
	errs := send()
	end := time.Now()
	outcome := m.outcomeSent
	if len(errs) != len(evs) {
		outcome = m.outcomeFailed
	} else {
		unavailable := 0
		for i, err := range errs {
			switch {
			case stored(err):
				m.accepted(ctx, evs[i], end)
			case isOutage(err):
				unavailable++
				outcome = m.outcomeFailed
			default:
				outcome = m.outcomeFailed
			}
		}
		if unavailable == len(evs) {
			outcome = m.outcomeUnavailable
		}
	}
	m.sendDuration.Record(ctx, end.Sub(start).Seconds(), outcome)
	return errs
}

func (m *metrics) sendOutcome(err error) metric.MeasurementOption {
	switch {
	case stored(err):
		return m.outcomeSent
	case isOutage(err):
		return m.outcomeUnavailable
	}
	return m.outcomeFailed
}

// accepted counts an event the broker accepted at end, and records its commit-to-send
// latency.
//
// The latency is measured on two clocks, never compared: the event's age when the store
// read it, by the store's own clock (the claim's SELECT computes it, as it computes every
// lease and retry time), plus the time since that read on this process's monotonic clock.
// A skew between this machine's clock and the database's changes nothing. For a store that
// does not date its reads, the age is taken from CreateTime by this machine's clock, which
// is right only as far as the two clocks agree.
//
// An event written with a delay (EventInput.Delay or NotBefore) counts from its due time,
// not its commit, when the store read it as written (it dates that too): waiting for its
// time is not publishing lag. One released back to WAIT first (the broker was down, say)
// counts from its commit, its delay included.
func (m *metrics) accepted(ctx context.Context, ev Event, end time.Time) {
	attr := m.eventAttrs(&ev)
	m.sent.Add(ctx, 1, attr)
	var age time.Duration
	switch {
	case !ev.Read.At.IsZero():
		age = ev.Read.Age + end.Sub(ev.Read.At) - ev.Read.Deferred
	case !ev.CreateTime.IsZero():
		age = end.Sub(ev.CreateTime)
	default:
		return
	}
	m.commitToSend.Record(ctx, max(age, 0).Seconds(), attr)
}

// unconfirmed counts an event the broker stored without confirming it durable in time.
func (m *metrics) unconfirmed(ctx context.Context, ev Event) {
	if m == nil {
		return
	}
	m.unconfirmedSent.Add(ctx, 1, m.eventAttrs(&ev))
}

// retry counts a failed send released for a later retry.
func (m *metrics) retry(ctx context.Context, ev Event) {
	if m == nil {
		return
	}
	m.retried.Add(ctx, 1, m.eventAttrs(&ev))
}

// deadLetter counts an event dead-lettered after a failed send: for a permanent error, or
// for its last retry.
func (m *metrics) deadLetter(ctx context.Context, ev Event, cause error) {
	if m == nil {
		return
	}
	reason := "retries"
	if IsPermanent(cause) {
		reason = "permanent"
	}
	m.deadLettered.Add(ctx, 1, m.deadAttrs(&ev, reason))
}

// deadAttrs is the attributes of a dead letter of ev for reason.
func (m *metrics) deadAttrs(ev *Event, reason string) metric.MeasurementOption {
	kvs := []attribute.KeyValue{attribute.String(attrEventType, ev.EventType), attribute.String(attrReason, reason)}
	if topic := m.topics.of(ev); topic != "" {
		kvs = append(kvs, attribute.String(attrTopic, topic))
	}
	return m.attrs(kvs...)
}

// reclaimedEvents counts a reclaim run: n events back to WAIT, and the poison events it
// dead-lettered.
func (m *metrics) reclaimedEvents(ctx context.Context, n int64, dead []Event) {
	if m == nil {
		return
	}
	if n > 0 {
		m.reclaimed.Add(ctx, n, m.plain)
	}
	for _, ev := range dead {
		m.deadLettered.Add(ctx, 1, m.deadAttrs(&ev, "reclaims"))
	}
}

// claimLost counts a per-row claim another instance won.
func (m *metrics) claimLost(ctx context.Context) {
	if m == nil {
		return
	}
	m.claimsLost.Add(ctx, 1, m.plain)
}

// leaseLost counts outcomes not recorded because their leases had been reclaimed.
func (m *metrics) leaseLost(ctx context.Context, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.leasesLost.Add(ctx, n, m.plain)
}

// outage counts the start of an outage.
func (m *metrics) outage(ctx context.Context) {
	if m == nil {
		return
	}
	m.outages.Add(ctx, 1, m.plain)
}
