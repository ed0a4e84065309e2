package outbox

import (
	"cmp"
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
)

// maxParallelQueueSends bounds the sends one key-ordered Send has in flight at once (one
// per queue).
const maxParallelQueueSends = 16

// keyQueueSelector is the queue selector of the producers the sender builds. It chooses, for
// a message:
//   - with a queue set (msg.Queue, as the sender sets it on a batch): that queue, if the
//     topic's route has it now; else none, and the client fails the send with "route info
//     not found" (Unavailable: nothing is sent, and the events wait for the queue's broker);
//   - with a sharding key: the key's queue in the topic's known queues (see below), if the
//     route has it now; else none, as above;
//   - with neither: the next queue in turn, moving to another broker on a retry, as the
//     client's default selector does.
//
// A key's queue is the one at FNV-1a(key) modulo the number of the topic's known queues, the
// choice of the client's producer.NewHashQueueSelector over a full route, so that one biz
// no's single messages and batches meet in one queue. The known queues are those of every
// route the client has handed the selector, sorted as the client sorts a route (by broker
// name, then queue id), less those absent from the route for [forgetQueueAfter]: a broker
// that leaves the route (stopped, or killed: the name server drops it when its connection
// closes) keeps its keys, which wait for it instead of moving to another queue behind
// their own earlier events. A queue gone for longer is forgotten, and its keys move.
//
// The client's own hash selector is not enough for batches: the client packs a batch into
// a new message that carries none of its messages' properties, so the hash selector finds
// no sharding key and picks a random queue.
type keyQueueSelector struct {
	inTurn producer.QueueSelector
	now    func() time.Time

	mu     sync.Mutex
	routes map[string]*knownQueues // topic -> its known queues
}

// knownQueues is a topic's known queues (see keyQueueSelector).
type knownQueues struct {
	last   []*primitive.MessageQueue            // the route the client handed last
	gone   map[primitive.MessageQueue]time.Time // known queues absent from last, and since when
	queues []*primitive.MessageQueue            // the known queues, sorted; replaced, never changed
}

// expired reports whether a queue has been gone long enough to forget.
func (r *knownQueues) expired(now time.Time) bool {
	for _, at := range r.gone {
		if now.Sub(at) >= forgetQueueAfter {
			return true
		}
	}
	return false
}

// forgetQueueAfter is how long a topic's queue may be absent from its route before its keys
// move to the queues that remain.
const forgetQueueAfter = 10 * time.Minute

func newKeyQueueSelector() *keyQueueSelector {
	return &keyQueueSelector{inTurn: producer.NewRoundRobinQueueSelector(), now: time.Now, routes: map[string]*knownQueues{}}
}

// Select implements producer.QueueSelector.
func (k *keyQueueSelector) Select(msg *primitive.Message, queues []*primitive.MessageQueue, lastBrokerName string) *primitive.MessageQueue {
	if len(queues) == 0 {
		return nil
	}
	want := msg.Queue
	if want == nil {
		key := msg.GetShardingKey()
		if key == "" {
			return k.inTurn.Select(msg, queues, lastBrokerName)
		}
		known := k.observe(msg.Topic, queues)
		want = known[keyQueue(key, len(known))]
	} else {
		k.observe(msg.Topic, queues)
	}
	for _, q := range queues {
		if *q == *want {
			return q
		}
	}
	return nil
}

// observe records queues as topic's route and returns its known queues.
func (k *keyQueueSelector) observe(topic string, queues []*primitive.MessageQueue) []*primitive.MessageQueue {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	r := k.routes[topic]
	if r != nil && !r.expired(now) && slices.EqualFunc(r.last, queues, func(a, b *primitive.MessageQueue) bool { return *a == *b }) {
		return r.queues
	}
	if r == nil {
		r = &knownQueues{gone: map[primitive.MessageQueue]time.Time{}}
		k.routes[topic] = r
	}
	in := make(map[primitive.MessageQueue]bool, len(queues))
	for _, q := range queues {
		in[*q] = true
	}
	for _, q := range r.last {
		if _, ok := r.gone[*q]; !ok && !in[*q] {
			r.gone[*q] = now
		}
	}
	r.last = make([]*primitive.MessageQueue, len(queues))
	known := make([]*primitive.MessageQueue, 0, len(queues)+len(r.gone))
	for i, q := range queues {
		delete(r.gone, *q)
		c := *q
		r.last[i] = &c
		known = append(known, &c)
	}
	for q, at := range r.gone {
		if now.Sub(at) >= forgetQueueAfter {
			delete(r.gone, q)
			continue
		}
		known = append(known, &q)
	}
	if len(r.gone) > 0 {
		slices.SortFunc(known, func(a, b *primitive.MessageQueue) int {
			return cmp.Or(strings.Compare(a.BrokerName, b.BrokerName), cmp.Compare(a.QueueId, b.QueueId))
		})
	}
	r.queues = known
	return known
}

// route returns topic's known queues (nil before the first send to it). The list is never
// changed: a new one replaces it.
func (k *keyQueueSelector) route(topic string) []*primitive.MessageQueue {
	k.mu.Lock()
	defer k.mu.Unlock()
	if r := k.routes[topic]; r != nil {
		return r.queues
	}
	return nil
}

// keyQueue is the index of the queue, of n, that a sharding key goes to: FNV-1a 32 modulo n,
// computed as the client's hash selector does (its sign correction included), so that both
// choose alike.
func keyQueue(key string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	i := int(h.Sum32()) % n
	if i < 0 {
		i = -i
	}
	return i
}

// keyOrderedBatch is the state of one key-ordered Send.
type keyOrderedBatch struct {
	s      *RocketMQSender
	evs    []Event
	keys   []string // per event: its biz no, the key whose order is kept
	topics []string // per event: its topic
	errs   []error  // each position is written by one goroutine only

	mu     sync.Mutex
	failed map[string]error // key -> its first failure in the batch
	stop   map[string]error // topic -> once set, nothing more is sent to it: it is unavailable
}

// sendInKeyOrder is Send of a batch in key order (see Send). A biz no's events in one call
// are of one topic ([Dispatch] sends its next topic's in a later call), so they go to one
// queue.
func (s *RocketMQSender) sendInKeyOrder(ctx context.Context, evs []Event, errs []error) {
	b := &keyOrderedBatch{s: s, evs: evs, keys: make([]string, len(evs)), topics: make([]string, len(evs)), errs: errs,
		failed: map[string]error{}, stop: map[string]error{}}
	// An event the sender refuses (no topic, no payload) fails at its turn:
	// it and the rest of its key are held back, and answered once the key's earlier events
	// are.
	var order []string            // topics, in the order of their first event
	byTopic := map[string][]int{} // topic -> positions to send
	var held []bool
	refused := map[string]bool{}
	for i := range evs {
		topic, key := evs[i].Topic, evs[i].BizNo
		b.keys[i], b.topics[i] = key, topic
		if refused[key] || s.refuse(&evs[i]) != nil {
			refused[key] = true
			if held == nil {
				held = make([]bool, len(evs))
			}
			held[i] = true
			continue
		}
		if _, ok := byTopic[topic]; !ok {
			order = append(order, topic)
		}
		byTopic[topic] = append(byTopic[topic], i)
	}
	if held != nil {
		defer b.answerHeld(held)
	}
	if len(order) == 0 {
		return
	}
	if s.selector == nil {
		// The caller's producer: its selector is the caller's, so batches could land
		// anywhere. One message at a time, each to its key's queue by its sharding key.
		for _, topic := range order {
			b.oneByOne(ctx, byTopic[topic], nil)
		}
		return
	}
	var lanes []*lane
	for _, topic := range order {
		todo := byTopic[topic]
		route := s.selector.route(topic)
		if route == nil {
			// No send to the topic has gone through the selector yet, so its route is not
			// known: the first event goes alone (fetching it), the rest by the route.
			b.oneByOne(ctx, todo[:1], nil)
			todo = todo[1:]
			route = s.selector.route(topic)
			if route == nil {
				b.oneByOne(ctx, todo, nil)
				continue
			}
		}
		lanes = append(lanes, b.lanes(todo, route)...)
	}
	if len(lanes) == 1 {
		lanes[0].send(ctx, b)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, maxParallelQueueSends)
	for _, l := range lanes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l.send(ctx, b)
		})
	}
	wg.Wait()
}

// answerHeld answers the events held back after an event the sender refuses, once the
// others are answered: the refused event fails (Permanent) if its biz no's earlier events
// were all sent, and is not sent otherwise; its biz no's later events are not sent.
func (b *keyOrderedBatch) answerHeld(held []bool) {
	stopped := map[string]error{} // key -> its first error in the batch
	for i := range b.evs {
		key := b.keys[i]
		cause := stopped[key]
		switch {
		case !held[i]:
			if cause == nil && b.errs[i] != nil {
				stopped[key] = b.errs[i]
			}
		case cause == nil:
			// The first held event of its biz no: the refused one.
			refusal := b.s.refuse(&b.evs[i])
			b.errs[i] = refusal
			stopped[key] = refusal
		case errors.Is(cause, ErrNotSent):
			b.errs[i] = cause
		default:
			b.errs[i] = &keyNotSentError{bizNo: b.evs[i].BizNo, cause: cause}
		}
	}
}

// lane is the part of a key-ordered batch that goes to one queue: its chunks are sent one
// after the other.
type lane struct {
	queue  *primitive.MessageQueue
	chunks [][]int // positions in the batch
}

// lanes groups the positions todo by the queue their biz no goes to in route, each biz no's
// events together and in their order, and cuts each group into chunks under MaxBatchBytes,
// between one biz no's events and the next's where they fit.
func (b *keyOrderedBatch) lanes(todo []int, route []*primitive.MessageQueue) []*lane {
	type group struct {
		queue int
		keys  []string
		runs  map[string][]int
	}
	var groups []*group
	byQueue := map[int]*group{}
	for _, i := range todo {
		key := b.evs[i].BizNo
		q := keyQueue(key, len(route))
		g := byQueue[q]
		if g == nil {
			g = &group{queue: q, runs: map[string][]int{}}
			byQueue[q] = g
			groups = append(groups, g)
		}
		if _, ok := g.runs[key]; !ok {
			g.keys = append(g.keys, key)
		}
		g.runs[key] = append(g.runs[key], i)
	}

	lanes := make([]*lane, len(groups))
	for gi, g := range groups {
		l := &lane{queue: route[g.queue]}
		var cur []int
		size := 0
		flush := func() {
			if len(cur) > 0 {
				l.chunks = append(l.chunks, cur)
				cur, size = nil, 0
			}
		}
		for _, key := range g.keys {
			run := g.runs[key]
			runSize := 0
			for _, i := range run {
				runSize += b.s.messageSize(b.evs[i], true)
			}
			if size+runSize > b.s.maxBatch || len(cur)+len(run) > maxBatchMessages {
				flush() // the run starts a chunk of its own, and fits in it unless it is too big
			}
			for _, i := range run {
				n := b.s.messageSize(b.evs[i], true)
				if len(cur) > 0 && (size+n > b.s.maxBatch || len(cur) >= maxBatchMessages) {
					flush()
				}
				cur = append(cur, i)
				size += n
			}
		}
		flush()
		lanes[gi] = l
	}
	return lanes
}

// send sends the lane's chunks in order, leaving out the events of biz nos that failed
// before their turn.
func (l *lane) send(ctx context.Context, b *keyOrderedBatch) {
	for _, chunk := range l.chunks {
		live := make([]int, 0, len(chunk))
		for _, i := range chunk {
			if b.failure(b.keys[i]) != nil {
				b.errs[i] = b.notSentAfter(i)
			} else {
				live = append(live, i)
			}
		}
		if len(live) == 0 {
			continue
		}
		if stop := b.stopped(ctx, b.topics[live[0]]); stop != nil {
			fillAt(b.errs, live, stop)
			continue
		}
		err := b.sendChunk(ctx, live, l.queue)
		switch {
		case stored(err):
			fillAt(b.errs, live, err)
		case IsPermanent(err) && len(live) > 1:
			// One message refused the batch: find it, sending one by one (each biz no still
			// stopped at its first failure).
			b.oneByOne(ctx, live, l.queue)
		default:
			b.failChunk(live, err)
		}
	}
}

// sendChunk sends the events at positions chunk as one batch to queue (the selector's choice
// when nil: a single message goes by its sharding key).
func (b *keyOrderedBatch) sendChunk(ctx context.Context, chunk []int, queue *primitive.MessageQueue) error {
	msgs := make([]*primitive.Message, len(chunk))
	for k, i := range chunk {
		msgs[k] = b.s.message(b.evs[i], true)
	}
	msgs[0].Queue = queue // the client hands the selector a batch with msgs[0]'s queue alone
	res, err := b.s.producer.SendSync(ctx, msgs...)
	what := "batch send"
	if len(msgs) == 1 {
		what = "send"
	}
	return sendOutcome(what, res, err)
}

// oneByOne sends the events at positions at one at a time, in order, to queue (see
// sendChunk), skipping the biz nos that failed.
func (b *keyOrderedBatch) oneByOne(ctx context.Context, at []int, queue *primitive.MessageQueue) {
	for _, i := range at {
		key := b.keys[i]
		if b.failure(key) != nil {
			b.errs[i] = b.notSentAfter(i)
			continue
		}
		if stop := b.stopped(ctx, b.topics[i]); stop != nil {
			b.errs[i] = stop
			continue
		}
		if err := b.sendChunk(ctx, []int{i}, queue); stored(err) {
			b.errs[i] = err
		} else {
			b.failChunk([]int{i}, err)
		}
	}
}

// failChunk records that the send of the events at positions chunk failed with err: the
// first event of each biz no gets err, its later ones are not sent. An unavailable broker
// stops the rest of the batch's sends to its topic.
func (b *keyOrderedBatch) failChunk(chunk []int, err error) {
	for _, i := range chunk {
		key := b.keys[i]
		if b.failure(key) != nil {
			b.errs[i] = b.notSentAfter(i)
		} else {
			b.errs[i] = err
			b.fail(key, err)
		}
	}
	if isOutage(err) {
		b.mu.Lock()
		if topic := b.topics[chunk[0]]; b.stop[topic] == nil {
			b.stop[topic] = notSent(err)
		}
		b.mu.Unlock()
	}
}

// stopped returns why nothing more is to be sent to topic, if so: the deadline passed, or a
// send found the topic unavailable (its broker down, or the topic missing).
func (b *keyOrderedBatch) stopped(ctx context.Context, topic string) error {
	if ctx.Err() != nil {
		return errNotSent
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stop[topic]
}

func (b *keyOrderedBatch) fail(key string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failed[key] == nil {
		b.failed[key] = err
	}
}

func (b *keyOrderedBatch) failure(key string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failed[key]
}

// notSentAfter is the error of the event at position i left unsent after its key's
// failure.
func (b *keyOrderedBatch) notSentAfter(i int) error {
	return &keyNotSentError{bizNo: b.evs[i].BizNo, cause: b.failure(b.keys[i])}
}
