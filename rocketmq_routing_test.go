package outbox_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// plainSender is a sender with a producer of its own, built with opts.
func plainSender(t *testing.T, opts ...producer.Option) *outbox.RocketMQSender {
	t.Helper()
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"),
		SendTimeout: 10 * time.Second, ProducerOptions: opts,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// Each event reaches the topic its store routed it to, once: the one it names, else its
// event type's, else the default; the topic is on its row from the insert, and a row a
// plain INSERT wrote without a topic has its type's from its claim on.
func TestRoutedEventsReachTheirTopics(t *testing.T) {
	t.Parallel()
	def, orders, payments := testsvc.NewTopic(t, "OUTBOX_RT_DEF"), testsvc.NewTopic(t, "OUTBOX_RT_ORD"), testsvc.NewTopic(t, "OUTBOX_RT_PAY")
	consumers := map[string]*testsvc.Consumer{}
	for _, topic := range []string{def, orders, payments} {
		consumers[topic] = testsvc.Consume(t, topic)
	}
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Routes: outbox.Routes{Topic: def,
		Topics: []string{orders, payments}, ByType: map[string]string{"PAYMENT_DONE": payments}}})}
	want := map[int64]string{} // row id -> topic
	for i := range 60 {
		in := outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", i%7), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		switch i % 4 {
		case 0: // the default
			in.EventType = "ORDER_CREATED"
			want[b.insertInput(t, in)] = def
		case 1: // its own topic
			in.EventType, in.Topic = "ORDER_PAID", orders
			want[b.insertInput(t, in)] = orders
		case 2: // by type
			in.EventType = "PAYMENT_DONE"
			want[b.insertInput(t, in)] = payments
		case 3: // its own topic before its type's
			in.EventType, in.Topic = "PAYMENT_DONE", orders
			want[b.insertInput(t, in)] = orders
		}
	}
	for id, topic := range want {
		require.Equal(t, topic, b.column(t, id, "topic"), "row %d: the topic is stored at insert", id)
	}
	b.exec(t, "INSERT INTO {t} (biz_no, event_type, payload) VALUES ('ORD-PLAIN', 'PAYMENT_DONE', '{}')")
	plain := b.lastID(t)
	require.Empty(t, b.column(t, plain, "topic"), "a plain INSERT names no topic")
	want[plain] = payments

	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("routes", &logSink{}))
	for sent := 0; sent < len(want); {
		stats, err := p.PublishPending(context.Background())
		require.NoError(t, err)
		require.Positive(t, stats.Sent)
		sent += stats.Sent
	}
	assert.Equal(t, payments, b.column(t, plain, "topic"), "the claim wrote the plain INSERT's topic")

	counts := map[string]int{}
	for _, topic := range want {
		counts[topic]++
	}
	for topic, c := range consumers {
		c.WaitDistinct(t, counts[topic], time.Minute)
	}
	time.Sleep(time.Second) // anything sent to a wrong topic has had time to arrive too
	eventIDs := b.eventIDs(t)
	for topic, c := range consumers {
		for _, m := range c.Messages() {
			id := m.GetProperty(outbox.PropertyEventID)
			var row int64
			for r, e := range eventIDs {
				if e == id {
					row = r
				}
			}
			assert.Equal(t, want[row], topic, "event %s arrived in topic %s", id, topic)
		}
		for id, n := range c.Deliveries() {
			assert.Equal(t, 1, n, "event %s arrived once", id)
		}
	}
}

// A topic that exists on no broker (and that the broker does not create) fails its own
// events, unavailable or not sent, and only them: the events of the other topics in the same
// batch are sent, in both modes.
func TestRocketMQMissingTopicFailsOnlyItsEvents(t *testing.T) {
	t.Parallel()
	def := testsvc.NewTopic(t, "OUTBOX_MT_DEF")
	missing := testsvc.UniqueTable("OUTBOX_MT_NONE")
	consumer := testsvc.Consume(t, def)
	s := plainSender(t, producer.WithCreateTopicKey(testsvc.UniqueTable("NO_TEMPLATE")))
	prefix := testsvc.UniqueTable("mt")
	var evs []outbox.Event
	for i := range 12 {
		ev := outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("%s-%d", prefix, i), BizNo: fmt.Sprintf("ORD-%d", i), EventType: "E",
			Payload: []byte("{}"), Topic: def}
		if i%2 == 1 {
			ev.Topic = missing
		}
		evs = append(evs, ev)
	}
	sent := 0
	for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
		errs := outbox.Dispatch(context.Background(), s, evs, outbox.StoreInfo{Ordering: o})
		for i, err := range errs {
			if evs[i].Topic == def {
				assert.NoError(t, err, "%s: event %d of the topic that exists", o, i)
				sent++
				continue
			}
			require.Error(t, err, "%s: event %d of the missing topic", o, i)
			assert.True(t, outbox.IsUnavailable(err) || strings.HasPrefix(err.Error(), "not sent"), "%s: event %d: %v", o, i, err)
			assert.False(t, outbox.IsPermanent(err), "a missing topic is a fault: it dead-letters nothing")
		}
	}
	consumer.WaitDistinct(t, sent/2, time.Minute) // each event twice, one id
}

// handoffs records, by a producer interceptor, when each message is handed to the broker
// and when the broker's answer comes, on one clock of sequence numbers: a biz no's event
// handed over after its earlier one was answered has a handed number above that answer's.
type handoffs struct {
	mu     sync.Mutex
	seq    int
	handed map[string]int // event id -> sequence number of its send's start
	stored map[string]int // event id -> sequence number of its send's answer (stored only)
	call   map[string]int // event id -> the send call it went in
	calls  int
}

func newHandoffs() *handoffs {
	return &handoffs{handed: map[string]int{}, stored: map[string]int{}, call: map[string]int{}}
}

var eventIDProperty = regexp.MustCompile(outbox.PropertyEventID + "\x01([^\x02]+)\x02")

// eventIDsOf returns the event ids of a message the client hands to the broker: one, or
// the messages of a batch (encoded in its body, each with its properties).
func eventIDsOf(m *primitive.Message) []string {
	if !m.Batch {
		return []string{m.GetProperty(outbox.PropertyEventID)}
	}
	var ids []string
	for _, g := range eventIDProperty.FindAllSubmatch(m.Body, -1) {
		ids = append(ids, string(g[1]))
	}
	return ids
}

func (h *handoffs) interceptor(ctx context.Context, req, reply any, next primitive.Invoker) error {
	ids := eventIDsOf(req.(*primitive.Message))
	h.mu.Lock()
	h.seq++
	h.calls++
	for _, id := range ids {
		h.handed[id], h.call[id] = h.seq, h.calls
	}
	h.mu.Unlock()
	err := next(ctx, req, reply)
	h.mu.Lock()
	h.seq++
	if res, ok := reply.(*primitive.SendResult); err == nil && ok && res.Status == primitive.SendOK {
		for _, id := range ids {
			h.stored[id] = h.seq
		}
	}
	h.mu.Unlock()
	return err
}

// inversions returns, for each biz no's events in order, the pairs where the later one was
// handed to the broker before the earlier was stored, unless the two went in one send (a
// biz no's consecutive events of one topic may share a batch).
func (h *handoffs) inversions(order map[string][]string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for key, ids := range order {
		for i := 1; i < len(ids); i++ {
			prev, next := ids[i-1], ids[i]
			if h.call[prev] == h.call[next] {
				continue
			}
			if h.handed[next] < h.stored[prev] || h.stored[prev] == 0 {
				out = append(out, fmt.Sprintf("%s: %s handed over at %d, %s stored at %d", key, next, h.handed[next], prev, h.stored[prev]))
			}
		}
	}
	return out
}

// In key order a biz no's events go out in id order across topics: none is handed to the
// broker before every earlier one of its biz no, in whatever topic, is stored, while the
// biz nos go side by side and a biz no's consecutive events of one topic share a batch.
// Each topic's orderly consumer receives its part of each biz no in order, from one queue.
func TestRocketMQKeyOrderAcrossTopics(t *testing.T) {
	t.Parallel()
	const keys, per = 12, 10
	topicA, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KT_A")
	topicB, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KT_B")
	consumers := map[string]*testsvc.OrderlyConsumer{topicA: testsvc.ConsumeOrderly(t, topicA), topicB: testsvc.ConsumeOrderly(t, topicB)}
	h := newHandoffs()
	s := plainSender(t, producer.WithInterceptor(h.interceptor))
	run := newKeyRun(topicA, keys, per)
	// Steps 1 and 3 of every four go to topic B, so that each biz no switches topics, and
	// has runs of one topic too; the rank each topic's consumer checks is the event's place
	// among its biz no's events of that topic.
	order := map[string][]string{}
	for _, key := range run.keys {
		ranks := map[string]int64{}
		for n := range run.byKey[key] {
			ev := &run.byKey[key][n]
			if n%4 == 1 || n%4 == 3 {
				ev.Topic = topicB
			}
			ranks[ev.Topic]++
			run.rank[ev.EventID] = ranks[ev.Topic]
			order[key] = append(order[key], ev.EventID)
		}
	}
	rng := mrand.New(mrand.NewPCG(3, 4))
	ctx := context.Background()
	info := outbox.StoreInfo{Ordering: outbox.KeyOrder}
	for _, ev := range run.interleave(rng, 0, 2) {
		require.NoError(t, outbox.Dispatch(ctx, s, []outbox.Event{ev}, info)[0])
	}
	// The rest in batches of each biz no's events in order, the biz nos interleaved, as a
	// claim returns them grouped by key.
	rest := run.interleave(rng, 2, per)
	for len(rest) > 0 {
		n := min(40, len(rest))
		batch := groupByKey(rest[:n])
		for i, err := range outbox.Dispatch(ctx, s, batch, info) {
			require.NoError(t, err, "event %d", i)
		}
		rest = rest[n:]
	}
	total := map[string]int{}
	for _, evs := range run.byKey {
		for _, ev := range evs {
			total[ev.Topic]++
		}
	}
	for topic, c := range consumers {
		c.WaitDistinct(t, total[topic], 2*time.Minute)
	}
	assert.Empty(t, h.inversions(order), "a biz no's event handed over before its earlier one was stored")
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
	h.mu.Lock()
	calls := h.calls
	h.mu.Unlock()
	t.Logf("%d events in %d sends to the broker", keys*per, calls)
}

// groupByKey returns evs with each biz no's events together, in their order, the biz nos
// in the order of their first event: as a claim in key order returns them.
func groupByKey(evs []outbox.Event) []outbox.Event {
	var keys []string
	by := map[string][]outbox.Event{}
	for _, ev := range evs {
		if _, ok := by[ev.BizNo]; !ok {
			keys = append(keys, ev.BizNo)
		}
		by[ev.BizNo] = append(by[ev.BizNo], ev)
	}
	out := make([]outbox.Event, 0, len(evs))
	for _, k := range keys {
		out = append(out, by[k]...)
	}
	return out
}

// With CloudEvents on, events still go to their topics, each a CloudEvent in binary
// content mode with its id, type and the sender's source; alone, in a batch and in key
// order.
func TestCloudEventsRoutedToTheirTopics(t *testing.T) {
	t.Parallel()
	def, pay := testsvc.NewTopic(t, "OUTBOX_CERT_DEF"), testsvc.NewTopic(t, "OUTBOX_CERT_PAY")
	consumers := map[string]*testsvc.Consumer{def: testsvc.Consume(t, def), pay: testsvc.Consume(t, pay)}
	const source = "/outbox-test/routing"
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"),
		CloudEventsSource: source,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	prefix := testsvc.UniqueTable("cert")
	var evs []outbox.Event
	for i := range 12 {
		ev := outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("%s-%d", prefix, i), BizNo: fmt.Sprintf("ORD-%d", i%3),
			EventType: "ORDER_CREATED", Payload: fmt.Appendf(nil, `{"n":%d}`, i), CreateTime: time.Now(), Topic: def}
		if i%3 != 0 {
			ev.EventType, ev.Topic = "PAYMENT_DONE", pay
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
	for i, err := range outbox.Dispatch(ctx, s, groupByKey(evs[8:]), outbox.StoreInfo{Ordering: outbox.KeyOrder}) {
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
			assert.Equal(t, ev.Topic, topic, "event %s", ev.EventID)
			ce, err := readBinaryCloudEvent(m)
			require.NoError(t, err, "event %s", ev.EventID)
			assert.Equal(t, ev.EventID, ce.attrs["id"])
			assert.Equal(t, ev.EventType, ce.attrs["type"])
			assert.Equal(t, source, ce.attrs["source"])
			assert.Equal(t, ev.Payload, ce.data)
		}
	}
}
