package outbox_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// routingSender is a sender with a producer of its own whose default topic is def, with
// topics and byType as its routes.
func routingSender(t *testing.T, def string, topics []string, byType map[string]string, opts ...producer.Option) *outbox.RocketMQSender {
	t.Helper()
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, Topic: def, Topics: topics, TopicsByType: byType,
		GroupName: testsvc.UniqueTable("pg"), SendTimeout: 10 * time.Second, ProducerOptions: opts,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// Each event reaches the topic it is routed to, once: the one it names, else its event
// type's, else the default; alone and in batches that span the topics. Info names the whole
// set, the default first.
func TestRocketMQRoutesEachEventToItsTopic(t *testing.T) {
	t.Parallel()
	def, orders, payments := testsvc.NewTopic(t, "OUTBOX_RT_DEF"), testsvc.NewTopic(t, "OUTBOX_RT_ORD"), testsvc.NewTopic(t, "OUTBOX_RT_PAY")
	consumers := map[string]*testsvc.Consumer{}
	for _, topic := range []string{def, orders, payments} {
		consumers[topic] = testsvc.Consume(t, topic)
	}
	s := routingSender(t, def, []string{orders, payments}, map[string]string{"PAYMENT_DONE": payments})
	info := s.Info()
	assert.Equal(t, []string{def, orders, payments}, info.Topics)
	assert.Equal(t, def, info.Topic)
	assert.Equal(t, map[string]string{"PAYMENT_DONE": payments}, info.TopicsByType)

	prefix := testsvc.UniqueTable("rt")
	want := map[string]string{} // event id -> topic
	var evs []outbox.Event
	for i := range 60 {
		ev := outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("%s-%d", prefix, i), BizNo: fmt.Sprintf("ORD-%d", i%7),
			Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		switch i % 4 {
		case 0: // the default
			ev.EventType = "ORDER_CREATED"
			want[ev.EventID] = def
		case 1: // its own topic
			ev.EventType, ev.Topic = "ORDER_PAID", orders
			want[ev.EventID] = orders
		case 2: // by type
			ev.EventType = "PAYMENT_DONE"
			want[ev.EventID] = payments
		case 3: // its own topic before its type's
			ev.EventType, ev.Topic = "PAYMENT_DONE", orders
			want[ev.EventID] = orders
		}
		evs = append(evs, ev)
	}
	ctx := context.Background()
	for _, ev := range evs[:8] {
		require.NoError(t, sendAlone(ctx, s, ev))
	}
	for i, err := range s.Send(ctx, evs[8:34], false) {
		require.NoError(t, err, "batch event %d", i)
	}
	for i, err := range s.Send(ctx, evs[34:], true) {
		require.NoError(t, err, "key-ordered batch event %d", i)
	}

	counts := map[string]int{}
	for _, topic := range want {
		counts[topic]++
	}
	for topic, c := range consumers {
		c.WaitDistinct(t, counts[topic], time.Minute)
	}
	time.Sleep(time.Second) // anything sent to a wrong topic has had time to arrive too
	for topic, c := range consumers {
		for _, m := range c.Messages() {
			id := m.GetProperty(outbox.PropertyEventID)
			assert.Equal(t, want[id], topic, "event %s arrived in topic %s", id, topic)
			assert.Equal(t, topic, m.Topic)
		}
		for id, n := range c.Deliveries() {
			assert.Equal(t, 1, n, "event %s arrived once", id)
		}
	}
}

// An event that names a topic outside the sender's set fails at once as Permanent, with an
// error naming the topic and the known ones; the others of its batch are sent.
func TestRocketMQUnknownTopicIsPermanent(t *testing.T) {
	t.Parallel()
	def, other := testsvc.NewTopic(t, "OUTBOX_UK_DEF"), testsvc.NewTopic(t, "OUTBOX_UK_OTH")
	consumer := testsvc.Consume(t, def)
	s := routingSender(t, def, []string{other}, nil)
	prefix := testsvc.UniqueTable("uk")
	typo := outbox.Event{ID: 1, EventID: prefix + "-typo", BizNo: "ORD-1", EventType: "E", Topic: "OTHER_TYPO", Payload: []byte("{}")}
	good := outbox.Event{ID: 2, EventID: prefix + "-good", BizNo: "ORD-1", EventType: "E", Payload: []byte("{}")}

	check := func(err error) {
		t.Helper()
		require.Error(t, err)
		assert.True(t, outbox.IsPermanent(err), "%v", err)
		for _, name := range []string{"OTHER_TYPO", def, other} {
			assert.ErrorContains(t, err, name)
		}
	}
	check(sendAlone(context.Background(), s, typo))
	for _, keyOrder := range []bool{false, true} {
		errs := s.Send(context.Background(), []outbox.Event{typo, good}, keyOrder)
		check(errs[0])
		assert.NoError(t, errs[1], "key order %v: an event of another topic is not held back", keyOrder)
	}
	consumer.WaitDistinct(t, 1, time.Minute)
}

// A topic that exists on no broker (and that the broker does not create) fails its own
// events, unavailable or not sent, and only them: the events of the other topics in the same
// batch are sent, in both claim modes.
func TestRocketMQMissingTopicFailsOnlyItsEvents(t *testing.T) {
	t.Parallel()
	def := testsvc.NewTopic(t, "OUTBOX_MT_DEF")
	missing := testsvc.UniqueTable("OUTBOX_MT_NONE")
	consumer := testsvc.Consume(t, def)
	s := routingSender(t, def, []string{missing}, nil, producer.WithCreateTopicKey(testsvc.UniqueTable("NO_TEMPLATE")))
	prefix := testsvc.UniqueTable("mt")
	var evs []outbox.Event
	for i := range 12 {
		ev := outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("%s-%d", prefix, i), BizNo: fmt.Sprintf("ORD-%d", i%3), EventType: "E",
			Payload: []byte("{}")}
		if i%2 == 1 {
			ev.Topic = missing
		}
		evs = append(evs, ev)
	}
	sent := 0
	for _, keyOrder := range []bool{false, true} {
		errs := s.Send(context.Background(), evs, keyOrder)
		for i, err := range errs {
			if evs[i].Topic == "" {
				assert.NoError(t, err, "key order %v: event %d of the topic that exists", keyOrder, i)
				sent++
				continue
			}
			require.Error(t, err, "key order %v: event %d of the missing topic", keyOrder, i)
			assert.True(t, outbox.IsUnavailable(err) || strings.HasPrefix(err.Error(), "not sent"), "key order %v: event %d: %v", keyOrder, i, err)
			assert.False(t, outbox.IsPermanent(err), "a missing topic is a fault: it dead-letters nothing")
		}
	}
	consumer.WaitDistinct(t, sent/2, time.Minute) // each event twice, one id
}

// In key order, one biz no's events of two topics go to one queue of each topic, and each
// topic's orderly consumer receives them in order; sent alone and in batches that span both
// topics.
func TestRocketMQKeyOrderPerTopic(t *testing.T) {
	t.Parallel()
	const keys, per = 12, 10
	topicA, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KT_A")
	topicB, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KT_B")
	consumers := map[string]*testsvc.OrderlyConsumer{topicA: testsvc.ConsumeOrderly(t, topicA), topicB: testsvc.ConsumeOrderly(t, topicB)}
	s := routingSender(t, topicA, []string{topicB}, map[string]string{"B_STEP": topicB})
	run := newKeyRun(keys, per)
	// Every other step of every biz no goes to topic B: by type, or by the event's own
	// topic; the rank each topic's consumer checks is the event's place among its biz no's
	// events of that topic.
	for _, key := range run.keys {
		ranks := map[string]int64{}
		for n := range run.byKey[key] {
			ev := &run.byKey[key][n]
			topic := topicA
			switch n % 4 {
			case 1:
				ev.EventType = "B_STEP"
				topic = topicB
			case 3:
				ev.Topic = topicB
				topic = topicB
			}
			ranks[topic]++
			run.rank[ev.EventID] = ranks[topic]
		}
	}
	rng := mrand.New(mrand.NewPCG(3, 4))
	ctx := context.Background()
	for _, ev := range run.interleave(rng, 0, 2) {
		require.NoError(t, sendInKeyOrder(ctx, s, ev))
	}
	rest := run.interleave(rng, 2, per)
	for len(rest) > 0 {
		n := min(20, len(rest))
		for i, err := range s.Send(ctx, rest[:n], true) {
			require.NoError(t, err, "event %d", i)
		}
		rest = rest[n:]
	}
	total := map[string]int{}
	for _, evs := range run.byKey {
		for _, ev := range evs {
			if ev.Topic == topicB || ev.EventType == "B_STEP" {
				total[topicB]++
			} else {
				total[topicA]++
			}
		}
	}
	for topic, c := range consumers {
		c.WaitDistinct(t, total[topic], 2*time.Minute)
	}
	for topic, c := range consumers {
		assert.Empty(t, c.Inversions(run.rankOf), "every biz no in order in topic %s", topic)
		queues, _ := checkOneQueuePerKey(t, c)
		assert.Len(t, queues, keys, "every biz no has events in topic %s", topic)
		for key, q := range queues {
			assert.Equal(t, topic, q.Topic, "biz no %s", key)
		}
		for id, n := range c.Deliveries() {
			assert.Equal(t, 1, n, "event %s once", id)
		}
	}
}

// With CloudEvents on, routed events still go to their topics, each a CloudEvent in binary
// content mode with its id, type and the sender's source; alone, in a batch and in key
// order.
func TestCloudEventsRoutedToTheirTopics(t *testing.T) {
	t.Parallel()
	def, pay := testsvc.NewTopic(t, "OUTBOX_CERT_DEF"), testsvc.NewTopic(t, "OUTBOX_CERT_PAY")
	consumers := map[string]*testsvc.Consumer{def: testsvc.Consume(t, def), pay: testsvc.Consume(t, pay)}
	const source = "/outbox-test/routing"
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, Topic: def, Topics: []string{pay},
		TopicsByType: map[string]string{"PAYMENT_DONE": pay}, GroupName: testsvc.UniqueTable("pg"),
		CloudEventsSource: source,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	prefix := testsvc.UniqueTable("cert")
	want := map[string]string{}
	var evs []outbox.Event
	for i := range 12 {
		ev := outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("%s-%d", prefix, i), BizNo: fmt.Sprintf("ORD-%d", i%3),
			EventType: "ORDER_CREATED", Payload: fmt.Appendf(nil, `{"n":%d}`, i), CreateTime: time.Now()}
		switch i % 3 {
		case 0:
			want[ev.EventID] = def
		case 1:
			ev.EventType = "PAYMENT_DONE"
			want[ev.EventID] = pay
		case 2:
			ev.Topic = pay
			want[ev.EventID] = pay
		}
		evs = append(evs, ev)
	}
	ctx := context.Background()
	for _, ev := range evs[:3] {
		require.NoError(t, sendAlone(ctx, s, ev))
	}
	for i, err := range s.Send(ctx, evs[3:8], false) {
		require.NoError(t, err, "event %d", i)
	}
	for i, err := range s.Send(ctx, evs[8:], true) {
		require.NoError(t, err, "event %d", i)
	}
	consumers[def].WaitDistinct(t, 4, time.Minute)
	consumers[pay].WaitDistinct(t, 8, time.Minute)
	byID := map[string]outbox.Event{}
	for _, ev := range evs {
		byID[ev.EventID] = ev
	}
	for topic, c := range consumers {
		for _, m := range c.Messages() {
			ev := byID[m.GetProperty(outbox.PropertyEventID)]
			assert.Equal(t, want[ev.EventID], topic, "event %s", ev.EventID)
			ce, err := readBinaryCloudEvent(m)
			require.NoError(t, err, "event %s", ev.EventID)
			assert.Equal(t, ev.EventID, ce.attrs["id"])
			assert.Equal(t, ev.EventType, ce.attrs["type"])
			assert.Equal(t, source, ce.attrs["source"])
			assert.Equal(t, ev.Payload, ce.data)
		}
	}
}
