package outbox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// keyRun is the events of some biz nos, each biz no's in order, with each event's place in
// its biz no (the rank the orderly consumer checks against).
type keyRun struct {
	byKey map[string][]outbox.Event
	keys  []string
	rank  map[string]int64 // eventId -> place in its biz no, from 1
}

func newKeyRun(topic string, keys, per int) *keyRun {
	r := &keyRun{byKey: map[string][]outbox.Event{}, rank: map[string]int64{}}
	prefix := testsvc.UniqueTable("ev")
	for k := range keys {
		key := fmt.Sprintf("ORD-%d", k)
		r.keys = append(r.keys, key)
		for n := 1; n <= per; n++ {
			ev := outbox.Event{ID: int64(k*per + n), EventID: fmt.Sprintf("%s-%s-%d", prefix, key, n), BizNo: key,
				EventType: fmt.Sprintf("STEP_%d", n), Payload: fmt.Appendf(nil, `{"order":%q,"step":%d}`, key, n), Topic: topic}
			r.byKey[key] = append(r.byKey[key], ev)
			r.rank[ev.EventID] = int64(n)
		}
	}
	return r
}

// interleave returns the events from..to-1 (0-based places) of every biz no, mixed across
// biz nos at random, in order within each.
func (r *keyRun) interleave(rng *mrand.Rand, from, to int) []outbox.Event {
	var out []outbox.Event
	next := map[string]int{}
	for _, key := range r.keys {
		next[key] = from
	}
	for len(next) > 0 {
		live := make([]string, 0, len(next))
		for _, key := range r.keys {
			if _, ok := next[key]; ok {
				live = append(live, key)
			}
		}
		key := live[rng.IntN(len(live))]
		out = append(out, r.byKey[key][next[key]])
		if next[key]++; next[key] == to {
			delete(next, key)
		}
	}
	return out
}

func (r *keyRun) rankOf(eventID string) int64 { return r.rank[eventID] }

// keyOrderedSender is a sender with a producer of its own, built with opts, for sends in
// key order.
func keyOrderedSender(t *testing.T, timeout time.Duration, opts ...producer.Option) *outbox.RocketMQSender {
	t.Helper()
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"),
		SendTimeout: timeout, ProducerOptions: opts,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// sendInKeyOrder sends one event alone in key order and returns its error.
func sendInKeyOrder(ctx context.Context, s outbox.Sender, ev outbox.Event) error {
	return s.Send(ctx, []outbox.Event{ev}, true)[0]
}

// checkOneQueuePerKey asserts that every biz no's arrivals came from one queue, and returns
// the queue of each and the brokers they are on.
func checkOneQueuePerKey(t *testing.T, c *testsvc.OrderlyConsumer) (map[string]primitive.MessageQueue, map[string]bool) {
	t.Helper()
	queues, brokers := map[string]primitive.MessageQueue{}, map[string]bool{}
	for key, arrivals := range c.Arrivals() {
		for _, a := range arrivals {
			if q, ok := queues[key]; ok {
				assert.Equal(t, q, a.Queue, "biz no %s arrived from two queues (%s)", key, a.EventID)
			}
			queues[key] = a.Queue
			brokers[a.Queue.BrokerName] = true
		}
	}
	return queues, brokers
}

// In key order, single sends and batches of many biz nos, mixed, reach an orderly consumer
// in each biz no's order, every biz no in one queue (the queue its single sends and its
// batches share, and the client's own hash selector picks), the biz nos spread over the
// queues of every broker the topic is on.
func TestRocketMQKeyOrderArrivesInOrder(t *testing.T) {
	t.Parallel()
	const keys, per = 24, 12
	topic, brokers := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KEYORDER")
	consumer := testsvc.ConsumeOrderly(t, topic)
	s := keyOrderedSender(t, 10*time.Second)
	run := newKeyRun(topic, keys, per)
	rng := mrand.New(mrand.NewPCG(1, 2))
	ctx := context.Background()

	// Steps 1 and 2 one by one, 3 to 7 in one batch, 8 to 12 in batches of 16.
	for _, ev := range run.interleave(rng, 0, 2) {
		require.NoError(t, sendInKeyOrder(ctx, s, ev))
	}
	for i, err := range s.Send(ctx, run.interleave(rng, 2, 7), true) {
		require.NoError(t, err, "event %d", i)
	}
	rest := run.interleave(rng, 7, per)
	for len(rest) > 0 {
		n := min(16, len(rest))
		for i, err := range s.Send(ctx, rest[:n], true) {
			require.NoError(t, err, "event %d", i)
		}
		rest = rest[n:]
	}

	// The client's own hash selector, one message per biz no with the biz no as sharding
	// key, picks the same queues.
	addrs, err := primitive.NewNamesrvAddr(testsvc.RocketMQNameServer(t))
	require.NoError(t, err)
	prod, err := rocketmq.NewProducer(producer.WithNameServer(addrs), producer.WithGroupName(testsvc.UniqueTable("pg")),
		producer.WithInstanceName(testsvc.UniqueTable("hash")), producer.WithQueueSelector(producer.NewHashQueueSelector()))
	require.NoError(t, err)
	require.NoError(t, prod.Start())
	t.Cleanup(func() { _ = prod.Shutdown() })
	for _, key := range run.keys {
		id := "hash-" + key + "-" + testsvc.UniqueTable("x")
		run.rank[id] = per + 1
		msg := primitive.NewMessage(topic, []byte("{}")).WithShardingKey(key)
		msg.WithProperty(outbox.PropertyEventID, id)
		msg.WithProperty(outbox.PropertyBizNo, key)
		res, err := prod.SendSync(ctx, msg)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
	}

	consumer.WaitDistinct(t, keys*(per+1), 2*time.Minute)
	assert.Empty(t, consumer.Inversions(run.rankOf), "every biz no in order")
	queues, brokerNames := checkOneQueuePerKey(t, consumer)
	distinct := map[primitive.MessageQueue]bool{}
	for _, q := range queues {
		distinct[q] = true
	}
	t.Logf("%d biz nos over %d queues of %d brokers", keys, len(distinct), len(brokerNames))
	assert.Greater(t, len(distinct), 2, "the biz nos are spread over queues")
	assert.Len(t, brokerNames, brokers, "over the queues of every broker")
	for _, n := range consumer.Deliveries() {
		assert.Equal(t, 1, n, "no repeats in a run without faults")
	}
}

// A biz no whose event the broker refuses (a payload over its 4 MiB limit) is stopped there:
// its later events of the batch are not sent, its earlier ones and the other biz nos' events
// are, and arrive in order.
func TestRocketMQKeyOrderStopsAKeyAtItsFailure(t *testing.T) {
	t.Parallel()
	topic, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KEYSTOP")
	consumer := testsvc.ConsumeOrderly(t, topic)
	// The client compresses a body this size before sending, which under -race takes seconds.
	s := keyOrderedSender(t, 30*time.Second)
	run := newKeyRun(topic, 6, 4)
	big := make([]byte, 5<<20)
	_, _ = rand.Read(big) // incompressible
	run.byKey["ORD-2"][1].Payload = big

	evs := run.interleave(mrand.New(mrand.NewPCG(3, 4)), 0, 4)
	errs := s.Send(context.Background(), evs, true)
	want := 0
	for i, ev := range evs {
		switch {
		case ev.BizNo != "ORD-2", ev.EventType == "STEP_1":
			assert.NoError(t, errs[i], ev.EventID)
			want++
		case ev.EventType == "STEP_2":
			assert.True(t, outbox.IsPermanent(errs[i]), "%v", errs[i])
			assert.ErrorContains(t, errs[i], "CODE: 13")
		default:
			assert.ErrorIs(t, errs[i], outbox.ErrNotSent, ev.EventID)
			assert.False(t, outbox.IsPermanent(errs[i]))
		}
	}
	consumer.WaitDistinct(t, want, time.Minute)
	assert.Empty(t, consumer.Inversions(run.rankOf))
	checkOneQueuePerKey(t, consumer)
	got := consumer.Arrivals()["ORD-2"]
	require.Len(t, got, 1, "only ORD-2's first event was sent")
	assert.Equal(t, run.byKey["ORD-2"][0].EventID, got[0].EventID)
}

// refusingProducer refuses, as the broker refuses an illegal message (code 13), any send
// holding the event refuse names, and passes every other send to the real producer.
type refusingProducer struct {
	rocketmq.Producer
	refuse string

	mu      sync.Mutex
	batches int // sends of more than one message
}

func (p *refusingProducer) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	p.mu.Lock()
	if len(msgs) > 1 {
		p.batches++
	}
	p.mu.Unlock()
	for _, m := range msgs {
		if m.GetProperty(outbox.PropertyEventID) == p.refuse {
			return nil, errors.New("CODE: 13, DESC: the message is illegal (injected)")
		}
	}
	return p.Producer.SendSync(ctx, msgs...)
}

// A batch refused in the middle of a biz no's run is sent again one by one, on the real
// broker: the refused event is Permanent, its biz no's later events are not sent, the other
// biz nos' events go, each biz no in one queue and in order.
func TestRocketMQKeyOrderBatchRefusedInTheMiddle(t *testing.T) {
	t.Parallel()
	topic, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KEYREFUSE")
	consumer := testsvc.ConsumeOrderly(t, topic)
	s := keyOrderedSender(t, 10*time.Second)
	run := newKeyRun(topic, 16, 5)
	refused := run.byKey["ORD-5"][2] // ORD-5's third event
	var rp *refusingProducer
	outbox.WrapProducerForTest(s, func(p rocketmq.Producer) rocketmq.Producer {
		rp = &refusingProducer{Producer: p, refuse: refused.EventID}
		return rp
	})

	ctx := context.Background()
	// The first batch learns the route; the second one meets the refusal.
	first := run.interleave(mrand.New(mrand.NewPCG(5, 6)), 0, 2)
	for i, err := range s.Send(ctx, first, true) {
		require.NoError(t, err, "event %d", i)
	}
	evs := run.interleave(mrand.New(mrand.NewPCG(7, 8)), 2, 5)
	errs := s.Send(ctx, evs, true)
	want := len(first)
	for i, ev := range evs {
		switch {
		case ev.EventID == refused.EventID:
			assert.True(t, outbox.IsPermanent(errs[i]), "%v", errs[i])
		case ev.BizNo == refused.BizNo && run.rank[ev.EventID] > 3:
			assert.ErrorIs(t, errs[i], outbox.ErrNotSent, ev.EventID)
		default:
			assert.NoError(t, errs[i], ev.EventID)
			want++
		}
	}
	assert.NotZero(t, rp.batches, "batches were sent")
	consumer.WaitDistinct(t, want, time.Minute)
	assert.Empty(t, consumer.Inversions(run.rankOf))
	checkOneQueuePerKey(t, consumer)
	got := consumer.Arrivals()[refused.BizNo]
	require.Len(t, got, 2, "ORD-5: the two events before the refused one")
}

// A sender built with the caller's ProducerOptions (here an interceptor) keeps its own queue
// selector: in key order its single sends and its batches take each biz no to one queue, in
// order. (The orderly consumer refuses one delivery: it comes again before the next event of
// its queue.)
func TestRocketMQKeyOrderWithProducerOptions(t *testing.T) {
	t.Parallel()
	topic, brokers := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KEYOWN")
	run := newKeyRun(topic, 12, 6)
	refused := run.byKey["ORD-3"][1]
	consumer := testsvc.ConsumeOrderlyWith(t, topic, testsvc.OrderlyOptions{RefuseOnce: []string{refused.EventID}})
	var mu sync.Mutex
	batches := 0 // batch sends the caller's interceptor saw
	countBatches := func(ctx context.Context, req, reply any, next primitive.Invoker) error {
		if m, ok := req.(*primitive.Message); ok && m.Batch {
			mu.Lock()
			batches++
			mu.Unlock()
		}
		return next(ctx, req, reply)
	}
	s := keyOrderedSender(t, 10*time.Second, producer.WithInterceptor(countBatches))

	rng := mrand.New(mrand.NewPCG(9, 10))
	ctx := context.Background()
	for _, ev := range run.interleave(rng, 0, 1) {
		require.NoError(t, sendInKeyOrder(ctx, s, ev))
	}
	for i, err := range s.Send(ctx, run.interleave(rng, 1, 6), true) {
		require.NoError(t, err, "event %d", i)
	}
	mu.Lock()
	assert.Positive(t, batches, "the caller's option reached the producer, which sent batches")
	mu.Unlock()
	consumer.WaitDistinct(t, 12*6, time.Minute)
	assert.Empty(t, consumer.Inversions(run.rankOf))
	_, brokerNames := checkOneQueuePerKey(t, consumer)
	assert.Len(t, brokerNames, brokers)

	var got []string
	for _, a := range consumer.Arrivals()["ORD-3"] {
		got = append(got, fmt.Sprintf("%d%s", run.rank[a.EventID], map[bool]string{true: " refused"}[a.Refused]))
	}
	assert.Equal(t, []string{"1", "2 refused", "2", "3", "4", "5", "6"}, got, "a refused delivery comes again, first")
}

// Why the sender has a selector of its own: the client's hash selector sends one key's
// single messages to one queue, but its batches anywhere (the client packs a batch into a
// message without its messages' properties, so the selector finds no sharding key and picks
// at random). If this starts failing, the client carries the key into batches now.
func TestRocketMQHashSelectorScattersBatches(t *testing.T) {
	t.Parallel()
	topic, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_HASHBATCH")
	addrs, err := primitive.NewNamesrvAddr(testsvc.RocketMQNameServer(t))
	require.NoError(t, err)
	prod, err := rocketmq.NewProducer(producer.WithNameServer(addrs), producer.WithGroupName(testsvc.UniqueTable("pg")),
		producer.WithInstanceName(testsvc.UniqueTable("hash")), producer.WithQueueSelector(producer.NewHashQueueSelector()))
	require.NoError(t, err)
	require.NoError(t, prod.Start())
	t.Cleanup(func() { _ = prod.Shutdown() })
	msg := func() *primitive.Message { return primitive.NewMessage(topic, []byte("{}")).WithShardingKey("ORD-42") }
	singles, batches := map[primitive.MessageQueue]bool{}, map[primitive.MessageQueue]bool{}
	for range 20 {
		res, err := prod.SendSync(context.Background(), msg())
		require.NoError(t, err)
		singles[*res.MessageQueue] = true
		res, err = prod.SendSync(context.Background(), msg(), msg())
		require.NoError(t, err)
		batches[*res.MessageQueue] = true
	}
	t.Logf("one key: 20 single sends on %d queue(s), 20 two-message batches on %d", len(singles), len(batches))
	assert.Len(t, singles, 1)
	assert.Greater(t, len(batches), 1, "the client's hash selector keeps batches of one key together")
}
