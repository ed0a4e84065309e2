package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

const typoTopic = "NO_SUCH_TOPIC"

// The publisher's event counters and send spans name each event's topic as its store routed
// it (by type here), within the store's set: a topic outside it (a plain INSERT's typo) is
// "(unknown)", never the name the row gave, and its event is dead-lettered. A batch that
// spans topics gets a span per topic.
func TestMetricsAndSpansNameTheTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	def, pay := testsvc.NewTopic(t, "OUTBOX_TM_DEF"), testsvc.NewTopic(t, "OUTBOX_TM_PAY")
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Routes: outbox.Routes{Topic: def,
		Topics: []string{pay}, ByType: map[string]string{"PAYMENT_DONE": pay}}})}
	sender := newFastRocketMQSender(t)

	insert := func(eventType string, n int) {
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		for range n {
			_, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "ORD-" + eventType, EventType: eventType, Payload: []byte("{}")})
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
	}
	insert("ORDER_CREATED", 2)
	insert("PAYMENT_DONE", 3)
	b.exec(t, "INSERT INTO {t} (biz_no, event_type, payload, topic) VALUES ('ORD-ORDER_TYPO', 'ORDER_TYPO', '{}', ?)", typoTopic)

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	tp, rec := newTracing(t)
	cfg := fastConfig("topic-telemetry", &logSink{})
	cfg.MeterProvider, cfg.TracerProvider = provider, tp
	p := newPublisher(t, b.store, sender, cfg)
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, stats.Sent)
	require.Equal(t, 1, stats.DeadLettered)

	c := collect(t, reader)
	assert.Equal(t, map[string]float64{
		"event_type=ORDER_CREATED,topic=" + def: 2,
		"event_type=PAYMENT_DONE,topic=" + pay:  3,
	}, c.values["outbox.events.sent"])
	assert.Equal(t, map[string]float64{"event_type=ORDER_TYPO,reason=permanent,topic=(unknown)": 1}, c.values["outbox.events.dead_lettered"])
	assert.Equal(t, map[string]uint64{
		"event_type=ORDER_CREATED,topic=" + def: 2,
		"event_type=PAYMENT_DONE,topic=" + pay:  3,
	}, c.counts["outbox.commit_to_send.duration"])

	spans := map[string]int{} // span name -> events
	for _, s := range rec.Ended() {
		if s.SpanKind() != trace.SpanKindProducer {
			continue
		}
		var dest string
		var n int64
		for _, kv := range s.Attributes() {
			switch kv.Key {
			case "messaging.destination.name":
				dest = kv.Value.AsString()
			case "messaging.batch.message_count":
				n = kv.Value.AsInt64()
			}
		}
		assert.Equal(t, "send "+dest, s.Name())
		spans[s.Name()] += int(n)
	}
	assert.Equal(t, map[string]int{"send " + def: 2, "send " + pay: 3, "send (unknown)": 1}, spans)
	got := b.countStatus(t, outbox.StatusFail)
	assert.Equal(t, 1, got, "the event naming an unknown topic is dead-lettered")
	failed, err := b.admin().List(ctx, outbox.Filter{Status: outbox.StatusFail})
	require.NoError(t, err)
	require.Len(t, failed, 1)
	for _, name := range []string{typoTopic, def, pay} {
		assert.Contains(t, failed[0].LastError, name, "the reason names the topic and the known ones")
	}
}

// A topic that does not exist (and that the broker does not create) is a fault, not the
// events' own: its events go back to WAIT with no attempt counted, never dead-lettered,
// even in a round whose other topics' events were sent; the others are sent.
func TestMissingTopicDeadLettersNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	def := testsvc.NewTopic(t, "OUTBOX_MTP_DEF")
	missing := testsvc.UniqueTable("OUTBOX_MTP_NONE")
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Routes: outbox.Routes{Topic: def,
		Topics: []string{missing}, ByType: map[string]string{"TO_MISSING": missing}}})}
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"),
		SendTimeout:     fastConfig("", nil).Tuning.SendTimeout,
		ProducerOptions: []producer.Option{producer.WithCreateTopicKey(testsvc.UniqueTable("NO_TEMPLATE"))},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sender.Close()) })
	var lost []int64
	for i := range 6 {
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		typ := "ORDER_CREATED"
		if i%2 == 0 {
			typ = "TO_MISSING"
		}
		id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", i), EventType: typ, Payload: []byte("{}")})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		if typ == "TO_MISSING" {
			lost = append(lost, id)
		}
	}
	cfg := fastConfig("missing-topic", &logSink{})
	cfg.MaxAttempts = 1 // a counted failure would dead-letter at once
	p := newPublisher(t, b.store, sender, cfg)
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	t.Logf("%s: %+v", claimModeName(), stats)
	assert.Equal(t, 0, stats.DeadLettered)
	assert.Equal(t, 0, stats.Retried)
	assert.True(t, p.Health().BrokerUnavailable, "a missing topic is an outage: claims pause, and probes follow")
	for _, id := range lost {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, ev.Status, "event %d", id)
		assert.Equal(t, 0, ev.RetryCount, "event %d: no attempt counted", id)
	}
	// The events of the topic that exists go, in this round or (per row, once the outage
	// the missing topic started has a probe) a later one.
	require.Eventually(t, func() bool {
		_, err := p.PublishPending(ctx)
		require.NoError(t, err)
		return b.countStatus(t, outbox.StatusSuccess) == 3
	}, time.Minute, 100*time.Millisecond)
	assert.Equal(t, 0, b.countStatus(t, outbox.StatusFail))
}
