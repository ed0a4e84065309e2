package outbox

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// routedProducer stands in for the client's producer in front of a topic with the queues
// queues: like the client, it packs a batch into one message that carries only the topic and
// msgs[0]'s queue, asks its selector for the queue, and fails with "route info not found"
// when the selector has none. fail, if set, decides a send's answer; what is stored is
// recorded per queue, in order.
type routedProducer struct {
	rocketmq.Producer
	sel  producer.QueueSelector
	fail func(q *primitive.MessageQueue, msgs []*primitive.Message) error

	mu     sync.Mutex
	queues []*primitive.MessageQueue
	calls  []int
	stored map[primitive.MessageQueue][]string // queue -> eventIds in stored order
}

func newRoutedProducer(sel producer.QueueSelector, brokers, perBroker int) *routedProducer {
	return &routedProducer{sel: sel, queues: testQueues("T", brokers, perBroker), stored: map[primitive.MessageQueue][]string{}}
}

func testQueues(topic string, brokers, perBroker int) []*primitive.MessageQueue {
	var qs []*primitive.MessageQueue
	for b := range brokers {
		for q := range perBroker {
			qs = append(qs, &primitive.MessageQueue{Topic: topic, BrokerName: fmt.Sprintf("broker-%c", 'a'+b), QueueId: q})
		}
	}
	return qs
}

func (p *routedProducer) SendSync(_ context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	p.mu.Lock()
	queues := p.queues
	p.calls = append(p.calls, len(msgs))
	p.mu.Unlock()
	msg := msgs[0]
	if len(msgs) > 1 {
		msg = &primitive.Message{Topic: msgs[0].Topic, Queue: msgs[0].Queue, Batch: true}
	}
	q := p.sel.Select(msg, queues, "")
	if q == nil {
		return nil, fmt.Errorf("the topic=%s route info not found", msg.Topic)
	}
	if p.fail != nil {
		if err := p.fail(q, msgs); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.stored[*q] = append(p.stored[*q], m.GetProperty(PropertyEventID))
	}
	return &primitive.SendResult{Status: primitive.SendOK}, nil
}

func (p *routedProducer) callSizes() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.calls...)
}

// queueOf returns the queue each stored eventId went to.
func (p *routedProducer) queueOf() map[string]primitive.MessageQueue {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]primitive.MessageQueue{}
	for q, ids := range p.stored {
		for _, id := range ids {
			out[id] = q
		}
	}
	return out
}

// keySender is a key-ordered sender on p, as NewRocketMQSender builds one, with p's
// selector.
func keySender(p *routedProducer, sel *keyQueueSelector) *RocketMQSender {
	return &RocketMQSender{producer: p, timeout: time.Minute, maxBatch: maxBatchBytesDefault, owned: true,
		selector: sel}
}

// keyedEvents returns keys x per events, interleaved (k0 e1, k1 e1, ..., k0 e2, ...), with
// event ids "kK-N" (N from 1).
func keyedEvents(keys, per int) []Event {
	var evs []Event
	for n := 1; n <= per; n++ {
		for k := range keys {
			evs = append(evs, Event{ID: int64(len(evs) + 1), EventID: fmt.Sprintf("k%d-%d", k, n), BizNo: fmt.Sprintf("k%d", k), Topic: "T",
				EventType: "E", Payload: []byte("{}")})
		}
	}
	return evs
}

// checkKeyOrderAnswers asserts what a key-ordered SendBatch promises: for each biz no, in
// the order given, successes, then at most one failure, then ErrNotSent; and that exactly
// the successes (and possibly the failures) were stored, each biz no's in one queue in
// order.
func checkKeyOrderAnswers(t *testing.T, evs []Event, errs []error, p *routedProducer) {
	t.Helper()
	require.Len(t, errs, len(evs))
	state := map[string]int{} // 0: sending, 1: failed, then only not-sent
	for i, ev := range evs {
		err := errs[i]
		switch {
		case err == nil:
			assert.Zero(t, state[ev.BizNo], "%s succeeded after its biz no stopped", ev.EventID)
		case errors.Is(err, ErrNotSent):
			state[ev.BizNo] = 1
		default:
			assert.Zero(t, state[ev.BizNo], "%s failed (%v) after its biz no stopped", ev.EventID, err)
			state[ev.BizNo] = 1
		}
	}
	stored := p.queueOf()
	for q, ids := range p.stored {
		last := map[string]int{}
		for _, id := range ids {
			var key string
			var n int
			_, scanErr := fmt.Sscanf(strings.Replace(id, "-", " ", 1), "%s %d", &key, &n)
			require.NoError(t, scanErr)
			assert.Greater(t, n, last[key], "queue %v: %s stored after a later event of its biz no", q, id)
			last[key] = n
		}
	}
	queueOfKey := map[string]primitive.MessageQueue{}
	for i, ev := range evs {
		q, ok := stored[ev.EventID]
		if errs[i] == nil {
			assert.True(t, ok, "%s succeeded but was not stored", ev.EventID)
		}
		if errors.Is(errs[i], ErrNotSent) {
			assert.False(t, ok, "%s was stored but answered not sent", ev.EventID)
		}
		if !ok {
			continue
		}
		if prev, seen := queueOfKey[ev.BizNo]; seen {
			assert.Equal(t, prev, q, "biz no %s in two queues", ev.BizNo)
		}
		queueOfKey[ev.BizNo] = q
	}
}

// For a message with a sharding key, the selector picks what the client's hash selector
// picks, whatever the number of queues; a batch goes to its first message's queue while the
// route has it, and nowhere once it has not; a message with neither goes round, off the
// broker that failed.
func TestKeyQueueSelectorChoices(t *testing.T) {
	t.Parallel()
	sel, hash := newKeyQueueSelector(), producer.NewHashQueueSelector()
	for _, n := range []int{1, 2, 3, 4, 8, 12, 16, 31} {
		qs := testQueues("T", 1, n)
		for k := range 500 {
			msg := primitive.NewMessage("T", []byte("x")).WithShardingKey(fmt.Sprintf("ORD-%d", k))
			require.Same(t, hash.Select(msg, qs, ""), sel.Select(msg, qs, ""), "%d queues, key %d", n, k)
		}
	}

	sel = newKeyQueueSelector()
	qs := testQueues("T", 2, 4)
	want := *qs[5]
	batch := &primitive.Message{Topic: "T", Queue: &want, Batch: true}
	assert.Same(t, qs[5], sel.Select(batch, qs, ""))
	assert.Same(t, qs[5], sel.Select(batch, qs, "broker-b"), "a retry stays on the queue")
	assert.Nil(t, sel.Select(batch, qs[:4], ""), "the queue is gone from the route")

	plain := primitive.NewMessage("T", []byte("x"))
	for range 10 {
		q := sel.Select(plain, qs, "broker-a")
		assert.Equal(t, "broker-b", q.BrokerName, "a retry without a key moves off the broker that failed")
	}

	// The route it keeps is the known queues, by value: a route that lost broker-b's
	// queues keeps them (TestKeyQueueStaysWhileItsBrokerIsAway).
	assert.Len(t, sel.route("T"), 8)
	sel.Select(plain, qs[:4], "")
	assert.Len(t, sel.route("T"), 8)
	sel.Select(plain, testQueues("T", 2, 4), "")
	route := sel.route("T")
	require.Len(t, route, 8)
	sel.Select(plain, testQueues("T", 2, 4), "")
	assert.Same(t, route[0], sel.route("T")[0], "an equal list does not replace the route")
	assert.Nil(t, sel.route("OTHER"))
}

// A key-ordered batch is sent as one batch per queue (plus the first event alone, before the
// route is known), every event to its biz no's queue, the one single sends choose, each biz
// no's events in order.
func TestKeyOrderedSendBatchGroupsByQueue(t *testing.T) {
	t.Parallel()
	sel := newKeyQueueSelector()
	p := newRoutedProducer(sel, 2, 4)
	s := keySender(p, sel)
	evs := keyedEvents(40, 5)
	errs := s.Send(context.Background(), evs, true)
	for i, err := range errs {
		require.NoError(t, err, "event %d", i)
	}
	checkKeyOrderAnswers(t, evs, errs, p)
	calls := p.callSizes()
	require.NotEmpty(t, calls)
	assert.Equal(t, 1, calls[0], "the first event goes alone, fetching the route")
	assert.Len(t, calls, 1+8, "then one batch per queue")

	// Single sends of the same biz nos land on the queues their batches did.
	batchQueue := p.queueOf()
	single := Event{EventID: "k7-6", BizNo: "k7", EventType: "E", Topic: "T", Payload: []byte("{}")}
	require.NoError(t, s.Send(context.Background(), []Event{single}, true)[0])
	assert.Equal(t, batchQueue["k7-1"], p.queueOf()["k7-6"])

	// Once the route is known, the next batch needs no single send first.
	before := len(p.callSizes())
	errs = s.Send(context.Background(), keyedEvents(3, 2), true)
	assert.Equal(t, []error{nil, nil, nil, nil, nil, nil}, errs)
	assert.LessOrEqual(t, len(p.callSizes())-before, 3)
}

// MaxBatchBytes cuts a queue's events between one biz no's run and the next where they fit;
// when a chunk fails, the later chunks carry on without the failed biz nos' events, which are
// not sent.
func TestKeyOrderedSendBatchStopsAFailedKeyAcrossChunks(t *testing.T) {
	t.Parallel()
	sel := newKeyQueueSelector()
	p := newRoutedProducer(sel, 1, 1) // one queue: every biz no in one lane
	sel.observe("T", p.queues)
	s := keySender(p, sel)
	evs := keyedEvents(3, 4) // k0..k2, 4 events each
	for i := range evs {
		evs[i].Payload = make([]byte, 300)
	}
	s.maxBatch = 4*s.messageSize(evs[0], true) + 10 // a run of four fills a chunk
	var failOnce sync.Once
	p.fail = func(_ *primitive.MessageQueue, msgs []*primitive.Message) error {
		var err error
		if msgs[0].GetProperty(PropertyBizNo) == "k1" {
			failOnce.Do(func() { err = errors.New("CODE: 1, DESC: something the broker did not like") })
		}
		return err
	}
	errs := s.Send(context.Background(), evs, true)
	assert.Equal(t, []int{4, 4, 4}, p.callSizes(), "one chunk per biz no's run")
	checkKeyOrderAnswers(t, evs, errs, p)
	for i, ev := range evs {
		switch {
		case ev.BizNo != "k1":
			assert.NoError(t, errs[i], ev.EventID)
		case ev.EventID == "k1-1":
			assert.ErrorContains(t, errs[i], "CODE: 1")
			assert.False(t, errors.Is(errs[i], ErrNotSent))
		default:
			assert.ErrorIs(t, errs[i], ErrNotSent, ev.EventID)
			assert.ErrorContains(t, errs[i], "biz no k1")
			assert.False(t, IsPermanent(errs[i]) || IsUnavailable(errs[i]), "not charged with the failure: %v", errs[i])
		}
	}

	// A run longer than a chunk is split; its later part is not sent once the first fails.
	p = newRoutedProducer(sel, 1, 1)
	s = keySender(p, sel)
	s.maxBatch = 2*s.messageSize(evs[0], true) + 10
	long := keyedEvents(1, 5)
	for i := range long {
		long[i].Payload = make([]byte, 300)
	}
	p.fail = func(_ *primitive.MessageQueue, msgs []*primitive.Message) error {
		if msgs[0].GetProperty(PropertyEventID) == "k0-3" {
			return errors.New("CODE: 1, DESC: no")
		}
		return nil
	}
	errs = s.Send(context.Background(), long, true)
	assert.Equal(t, []int{2, 2}, p.callSizes())
	checkKeyOrderAnswers(t, long, errs, p)
	assert.NoError(t, errs[1])
	assert.Error(t, errs[2])
	assert.False(t, errors.Is(errs[2], ErrNotSent))
	assert.ErrorIs(t, errs[3], ErrNotSent, "the failed chunk's second event of the biz no")
	assert.ErrorIs(t, errs[4], ErrNotSent, "the next chunk is not sent")
}

// A batch refused as illegal is sent one by one: the illegal event is Permanent, its biz no's
// later events are not sent, and the other biz nos of the batch go.
func TestKeyOrderedSendBatchOneByOneStopsTheKey(t *testing.T) {
	t.Parallel()
	sel := newKeyQueueSelector()
	p := newRoutedProducer(sel, 1, 1)
	sel.observe("T", p.queues)
	s := keySender(p, sel)
	p.fail = func(_ *primitive.MessageQueue, msgs []*primitive.Message) error {
		for _, m := range msgs {
			if m.GetProperty(PropertyEventID) == "k1-2" {
				return errIllegal
			}
		}
		return nil
	}
	evs := keyedEvents(3, 4)
	errs := s.Send(context.Background(), evs, true)
	checkKeyOrderAnswers(t, evs, errs, p)
	for i, ev := range evs {
		switch ev.EventID {
		case "k1-2":
			assert.True(t, IsPermanent(errs[i]), "%v", errs[i])
		case "k1-3", "k1-4":
			assert.ErrorIs(t, errs[i], ErrNotSent)
			assert.False(t, IsPermanent(errs[i]))
		default:
			assert.NoError(t, errs[i], ev.EventID)
		}
	}
	assert.Equal(t, []int{12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, p.callSizes(), "the batch, then each event but the two left out")

	// An event without a payload stops its biz no the same way, before anything is sent.
	p = newRoutedProducer(sel, 1, 1)
	s = keySender(p, sel)
	evs = keyedEvents(2, 3)
	evs[2].Payload = nil // k0-2
	errs = s.Send(context.Background(), evs, true)
	checkKeyOrderAnswers(t, evs, errs, p)
	assert.True(t, IsPermanent(errs[2]))
	assert.ErrorIs(t, errs[4], ErrNotSent) // k0-3
	assert.Equal(t, []int{4}, p.callSizes())
}

// An unavailable broker stops the whole batch; a queue gone from the route fails its batch as
// unavailable, nothing of it sent.
func TestKeyOrderedSendBatchUnavailable(t *testing.T) {
	t.Parallel()
	sel := newKeyQueueSelector()
	p := newRoutedProducer(sel, 2, 4)
	sel.observe("T", p.queues)
	s := keySender(p, sel)
	busy := errors.New("CODE: 14, DESC: service not available now")
	p.fail = func(q *primitive.MessageQueue, _ []*primitive.Message) error {
		if q.BrokerName == "broker-b" {
			return busy
		}
		return nil
	}
	evs := keyedEvents(40, 3)
	errs := s.Send(context.Background(), evs, true)
	checkKeyOrderAnswers(t, evs, errs, p)
	unavailable := 0
	for i := range evs {
		if errs[i] != nil {
			assert.True(t, errors.Is(errs[i], ErrNotSent) || IsUnavailable(errs[i]), "%v", errs[i])
			unavailable++
		}
	}
	assert.NotZero(t, unavailable)

	// The route shrinks between the grouping and the send: the batches for the queues that
	// are gone fail as unavailable.
	p = newRoutedProducer(sel, 2, 4)
	sel.observe("T", p.queues)
	s = keySender(p, sel)
	p.queues = p.queues[:4] // the sender groups by the route it saw: 8 queues
	evs = keyedEvents(40, 3)
	errs = s.Send(context.Background(), evs, true)
	checkKeyOrderAnswers(t, evs, errs, p)
	gone := 0
	for i, ev := range evs {
		if errs[i] != nil && !errors.Is(errs[i], ErrNotSent) {
			assert.True(t, IsUnavailable(errs[i]), "%s: %v", ev.EventID, errs[i])
			assert.ErrorContains(t, errs[i], "route info not found")
			gone++
		}
	}
	assert.NotZero(t, gone)
	for id, q := range p.queueOf() {
		assert.Equal(t, "broker-a", q.BrokerName, "%s sent to a queue that is gone", id)
	}
}

// With a producer whose queue selector is not the sender's, the sender cannot choose a batch's
// queue: it sends one message at a time, in order, each with its sharding key, stopping a biz
// no at its failure.
func TestKeyOrderedSendBatchWithAnotherSelector(t *testing.T) {
	t.Parallel()
	sel := newKeyQueueSelector()
	p := newRoutedProducer(sel, 2, 4)
	p.fail = func(_ *primitive.MessageQueue, msgs []*primitive.Message) error {
		if msgs[0].GetProperty(PropertyEventID) == "k2-2" {
			return errors.New("CODE: 1, DESC: no")
		}
		return nil
	}
	s := &RocketMQSender{producer: p, timeout: time.Minute, maxBatch: maxBatchBytesDefault}
	evs := keyedEvents(5, 4)
	errs := s.Send(context.Background(), evs, true)
	checkKeyOrderAnswers(t, evs, errs, p)
	for _, n := range p.callSizes() {
		assert.Equal(t, 1, n)
	}
	assert.Len(t, p.callSizes(), 20-2)
	assert.ErrorIs(t, errs[17], ErrNotSent) // k2-4
}

// Random batches, random failures of every class, random chunk sizes: the answers always
// keep each biz no's order.
func TestKeyOrderedSendBatchRandomFailures(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 11))
	failures := []error{
		errIllegal, errors.New("CODE: 1, DESC: no"), errors.New("CODE: 14, DESC: service not available now"),
		errors.New("the topic=T route info not found"),
	}
	for round := range 300 {
		sel := newKeyQueueSelector()
		p := newRoutedProducer(sel, 1+rng.IntN(2), 1+rng.IntN(4))
		if rng.IntN(4) > 0 {
			sel.observe("T", p.queues)
		}
		s := keySender(p, sel)
		if rng.IntN(2) == 0 {
			s.selector = nil // the caller's producer
		}
		evs := keyedEvents(1+rng.IntN(12), 1+rng.IntN(6))
		rng.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })
		// Shuffled across biz nos, in order within each.
		next := map[string]int{}
		for i := range evs {
			next[evs[i].BizNo]++
			evs[i].EventID = fmt.Sprintf("%s-%d", evs[i].BizNo, next[evs[i].BizNo])
			evs[i].Payload = make([]byte, rng.IntN(200))
		}
		s.maxBatch = 1 + rng.IntN(2000)
		rate := rng.IntN(4)
		var mu sync.Mutex
		failRng := rand.New(rand.NewPCG(uint64(round), 7))
		p.fail = func(_ *primitive.MessageQueue, _ []*primitive.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if failRng.IntN(10) < rate {
				return failures[failRng.IntN(len(failures))]
			}
			return nil
		}
		errs := s.Send(context.Background(), evs, true)
		checkKeyOrderAnswers(t, evs, errs, p)
		if t.Failed() {
			t.Fatalf("round %d", round)
		}
	}
}

// A broker that leaves the topic's route keeps its keys: their sends fail (route info not
// found, Unavailable) instead of moving to another broker's queue behind the keys' own
// earlier events; the other keys stay where they were; when the broker is back, its keys
// are sent to their queues again; a queue gone for forgetQueueAfter is forgotten, and its
// keys move.
func TestKeyQueueStaysWhileItsBrokerIsAway(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	sel := newKeyQueueSelector()
	sel.now = func() time.Time { return now }
	full := testQueues("T", 2, 4)
	onlyA := full[:4]
	keyed := func(key string) *primitive.Message {
		m := primitive.NewMessage("T", nil)
		m.WithShardingKey(key)
		return m
	}
	var onA, onB string // a key whose queue is on broker-a, one on broker-b
	home := map[string]primitive.MessageQueue{}
	for k := 0; onA == "" || onB == ""; k++ {
		key := fmt.Sprintf("ORD-%d", k)
		q := sel.Select(keyed(key), full, "")
		require.NotNil(t, q)
		home[key] = *q
		if q.BrokerName == "broker-a" && onA == "" {
			onA = key
		}
		if q.BrokerName == "broker-b" && onB == "" {
			onB = key
		}
	}

	now = now.Add(time.Minute)
	assert.Nil(t, sel.Select(keyed(onB), onlyA, ""), "broker-b's key waits for broker-b")
	if q := sel.Select(keyed(onA), onlyA, ""); assert.NotNil(t, q) {
		assert.Equal(t, home[onA], *q, "broker-a's key stays on its queue")
	}
	batch := &primitive.Message{Topic: "T", Queue: &primitive.MessageQueue{Topic: "T", BrokerName: "broker-b", QueueId: 1}, Batch: true}
	assert.Nil(t, sel.Select(batch, onlyA, ""), "a batch for broker-b's queue waits")
	assert.Len(t, sel.route("T"), 8, "broker-b's queues stay known")

	now = now.Add(forgetQueueAfter - time.Second)
	if q := sel.Select(keyed(onB), full, ""); assert.NotNil(t, q) {
		assert.Equal(t, home[onB], *q, "broker-b back: its key is on its queue again")
	}

	now = now.Add(time.Minute)
	require.Nil(t, sel.Select(keyed(onB), onlyA, ""))
	now = now.Add(forgetQueueAfter)
	q := sel.Select(keyed(onB), onlyA, "")
	if assert.NotNil(t, q, "gone for good: the key moves") {
		assert.Equal(t, "broker-a", q.BrokerName)
	}
	assert.Len(t, sel.route("T"), 4)

	// A selector that starts while broker-b is away knows only broker-a's queues.
	fresh := newKeyQueueSelector()
	if q := fresh.Select(keyed(onB), onlyA, ""); assert.NotNil(t, q) {
		assert.Equal(t, "broker-a", q.BrokerName)
	}
}
