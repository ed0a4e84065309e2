package inbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/go-outbox/outbox/internal/rmqlock"
)

// An orderly consumer consumes a queue only while the broker has locked it for the
// consumer's client id; the broker keeps a lock until its holder unlocks it or stops
// renewing it for rocketmq.broker.rebalance.lockMaxLiveTime (60 s by default). The Go client
// unlocks its queues when it is shut down, but not a queue a rebalance takes from it: the
// consumer that the rebalance gives the queue fails to lock it, and tries again at its next
// rebalance, every 20 s, until the lock has expired. Every consumer joining a group would
// stop the consumption of the queues it is given for up to a minute.
//
// A queueKeeper does what the client lacks, for one run of an orderly Consumer. It is the
// push consumer's allocation strategy (the client's default, AllocateByAveragely, wrapped),
// so it sees every rebalance's outcome: the queues the client is about to drop, and those it
// is about to take.
//
//   - A queue given up is refused from then on (a delivery of it that the client makes
//     before it has dropped the queue is not handled, and comes again to the new owner), and
//     once no handler of this consumer runs on it and the client has stored its offset, it is
//     unlocked at the broker, so that the new owner can lock it at once.
//   - A queue taken whose lock the client could not get (its old owner had not unlocked it
//     yet) is locked by the keeper for the client's id as soon as the broker grants it, and
//     the client is told to rebalance, so that it takes the queue then and not 20 s later.
//   - When the run ends, after the deliveries have finished, the offsets are stored and the
//     push consumer is shut down, every queue of the topics consumed is unlocked for the
//     client's id (the broker leaves alone the locks of other clients).
type queueKeeper struct {
	nameServers []string
	client      rmqlock.Client // signed and over TLS as the consumer's own requests
	log         *slog.Logger
	// rebalance is the push consumer's Rebalance (nil when it has none). It may run beside
	// a rebalance of the client's own: at worst both add a queue the client had not, and
	// the second copy, never locked, never consumes.
	rebalance func()

	// unlocking is held while an unlock is sent to a broker, and by a rebalance before it
	// takes a queue back: the client's lock of a queue taken back is never overtaken by the
	// keeper's unlock of it.
	unlocking sync.Mutex

	mu       sync.Mutex
	group    string                       // the group, as the client names it
	clientID string                       // the client's id; "" before the first rebalance
	all      map[string][]rmqlock.Queue   // every queue of each topic, by topic
	held     map[rmqlock.Queue]bool       // allocated to this consumer by the last rebalance
	given    map[rmqlock.Queue]*givenUp   // given up by a rebalance and not taken back
	pending  map[rmqlock.Queue]time.Time  // taken, and not yet seen delivered; since when
	inflight map[rmqlock.Queue]int        // handlers running, by queue
	routes   map[string]map[string]string // broker addresses by broker name, by topic
	wake     chan struct{}                // the worker has something to do
	stop     chan struct{}                // closed when the worker is to end
	done     chan struct{}                // closed once the worker has ended
	started  bool                         // the worker runs (or ran)
	stopOnce sync.Once

	deniedAt time.Time // when a refusal by the brokers' ACL was last logged
}

// givenUp is a queue a rebalance took from this consumer.
type givenUp struct {
	at       time.Time // when
	unlocked bool      // the broker's lock has been released
}

// Timing of the keeper.
const (
	// keeperTick is how often the keeper looks for queues to unlock and to lock.
	keeperTick = 100 * time.Millisecond
	// releaseDelay is how long after a rebalance gave a queue up it is unlocked at the
	// earliest: the client stores the queue's offset right after the rebalance, in a one-way
	// request that has to reach the broker before the new owner reads the offset.
	releaseDelay = 200 * time.Millisecond
	// lockRetry is how often a queue taken whose lock the client has not been seen to hold
	// is locked again.
	lockRetry = 200 * time.Millisecond
	// pendingFor is how long the keeper tries to lock a queue taken: past the broker's lock
	// life (60 s by default), the client's own retries every 20 s have long got it.
	pendingFor = 90 * time.Second
	// lockRenewal is the client's RebalanceLockInterval: how often it locks (renews) at the
	// broker the queues it holds. A queue the client takes in a rebalance is consumed only
	// once the client has seen its lock granted in one of these rounds (the lock it takes
	// before adding the queue is not recorded on it, a shortcoming of the client): its
	// default, 20 s, would let a queue handed over stand still for up to 20 s more. One round
	// is one small request to each broker.
	lockRenewal = time.Second
	// brokerCallTimeout bounds one request to a name server or a broker.
	brokerCallTimeout = 3 * time.Second
	// inlineLockTimeout bounds the lock of the queues a rebalance takes, which the
	// rebalance waits for.
	inlineLockTimeout = time.Second
)

func newQueueKeeper(nameServers []string, client rmqlock.Client, log *slog.Logger) *queueKeeper {
	return &queueKeeper{nameServers: nameServers, client: client, log: log, all: map[string][]rmqlock.Queue{},
		held: map[rmqlock.Queue]bool{}, given: map[rmqlock.Queue]*givenUp{}, pending: map[rmqlock.Queue]time.Time{},
		inflight: map[rmqlock.Queue]int{}, routes: map[string]map[string]string{},
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

func queueOf(mq primitive.MessageQueue) rmqlock.Queue {
	return rmqlock.Queue{Topic: mq.Topic, BrokerName: mq.BrokerName, QueueID: mq.QueueId}
}

// allocate is the push consumer's allocation strategy: the client's default, whose outcome
// the keeper records before the client applies it.
func (k *queueKeeper) allocate(group, clientID string, mqAll []*primitive.MessageQueue, cidAll []string) []*primitive.MessageQueue {
	mine := consumer.AllocateByAveragely(group, clientID, mqAll, cidAll)
	if len(mqAll) == 0 || clientID == "" {
		return mine
	}
	topic := mqAll[0].Topic
	all := make([]rmqlock.Queue, 0, len(mqAll))
	for _, mq := range mqAll {
		all = append(all, queueOf(*mq))
	}
	now := set(mine)
	k.unlocking.Lock() // an unlock in flight ends before the client locks a queue taken back
	defer k.unlocking.Unlock()
	k.mu.Lock()
	k.group, k.clientID = group, clientID
	k.all[topic] = all
	t := time.Now()
	for q := range k.held {
		if q.Topic == topic && !now[q] {
			delete(k.held, q)
			delete(k.pending, q)
			k.given[q] = &givenUp{at: t}
		}
	}
	var taken []rmqlock.Queue
	for q := range now {
		if !k.held[q] {
			k.held[q] = true
			delete(k.given, q)
			k.pending[q] = t
			taken = append(taken, q)
		}
	}
	k.mu.Unlock()
	// Lock the queues taken before the client tries to: the ones free are then this
	// client's, and the client's own lock of them succeeds; only the others, still another
	// consumer's, stay pending, and the client is told to rebalance once they are granted.
	granted := k.lock(group, clientID, taken, inlineLockTimeout)
	k.mu.Lock()
	for _, q := range granted {
		if since, ok := k.pending[q]; ok && since.Equal(t) {
			delete(k.pending, q)
		}
	}
	k.poke()
	k.mu.Unlock()
	return mine
}

func set(mqs []*primitive.MessageQueue) map[rmqlock.Queue]bool {
	s := make(map[rmqlock.Queue]bool, len(mqs))
	for _, mq := range mqs {
		s[queueOf(*mq)] = true
	}
	return s
}

// poke wakes the worker; k.mu is held.
func (k *queueKeeper) poke() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// enter counts a handler in on mq, unless a rebalance has given mq up: then the delivery
// is not to be handled.
func (k *queueKeeper) enter(mq primitive.MessageQueue) bool {
	q := queueOf(mq)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.given[q] != nil {
		return false
	}
	k.inflight[q]++
	delete(k.pending, q) // the client holds it
	return true
}

// exit counts out a handler that enter counted in.
func (k *queueKeeper) exit(mq primitive.MessageQueue) {
	q := queueOf(mq)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.inflight[q]--; k.inflight[q] <= 0 {
		delete(k.inflight, q)
		if k.given[q] != nil {
			k.poke()
		}
	}
}

// start starts the worker.
func (k *queueKeeper) start() {
	k.mu.Lock()
	k.started = true
	k.mu.Unlock()
	go k.work()
}

// halt ends the worker and waits for it.
func (k *queueKeeper) halt() {
	k.stopOnce.Do(func() { close(k.stop) })
	k.mu.Lock()
	started := k.started
	k.mu.Unlock()
	if started {
		<-k.done
	}
}

func (k *queueKeeper) work() {
	defer close(k.done)
	tick := time.NewTicker(keeperTick)
	defer tick.Stop()
	var lastLock time.Time
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		case <-k.wake:
		}
		k.release()
		if time.Since(lastLock) >= lockRetry {
			lastLock = time.Now()
			if k.lockPending() && k.rebalance != nil {
				select {
				case <-k.stop:
					return
				default:
				}
				k.rebalance()
			}
		}
	}
}

// release unlocks the queues given up that no handler runs on, releaseDelay after they were.
func (k *queueKeeper) release() {
	k.unlocking.Lock()
	defer k.unlocking.Unlock()
	k.mu.Lock()
	group, id := k.group, k.clientID
	var qs []rmqlock.Queue
	for q, g := range k.given {
		if !g.unlocked && k.inflight[q] == 0 && time.Since(g.at) >= releaseDelay {
			qs = append(qs, q)
		}
	}
	k.mu.Unlock()
	if len(qs) == 0 {
		return
	}
	done := k.unlock(group, id, qs)
	k.mu.Lock()
	for _, q := range done {
		if g := k.given[q]; g != nil {
			g.unlocked = true
		}
	}
	k.mu.Unlock()
}

// lockPending locks for the client's id the queues taken that no delivery has shown the
// client to hold, and reports whether the broker granted any.
func (k *queueKeeper) lockPending() bool {
	k.mu.Lock()
	group, id := k.group, k.clientID
	var qs []rmqlock.Queue
	for q, since := range k.pending {
		switch {
		case time.Since(since) > pendingFor:
			delete(k.pending, q)
		case time.Since(since) >= lockRetry:
			qs = append(qs, q)
		}
	}
	k.mu.Unlock()
	if len(qs) == 0 {
		return false
	}
	granted := false
	got := k.lock(group, id, qs, brokerCallTimeout)
	k.mu.Lock()
	for _, q := range got {
		if _, ok := k.pending[q]; ok {
			delete(k.pending, q)
			granted = true
		}
	}
	k.mu.Unlock()
	return granted
}

// lock locks qs at their brokers for id, each broker's request bounded by timeout, and
// returns the queues the brokers hold for id.
func (k *queueKeeper) lock(group, id string, qs []rmqlock.Queue, timeout time.Duration) []rmqlock.Queue {
	var out []rmqlock.Queue
	for addr, bqs := range k.byBroker(qs) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		got, err := k.client.Lock(ctx, addr, group, id, bqs)
		cancel()
		if err != nil {
			k.forgetRoute(bqs[0].Topic)
			k.denied(err, "lock", group, bqs)
			k.log.Debug("inbox: could not lock queues taken in a rebalance; trying again", slog.String("broker", addr), slog.Any("error", err))
			continue
		}
		out = append(out, got...)
	}
	return out
}

// releaseAll unlocks, for the client's id, every queue of the topics consumed: the run's
// last act, after the push consumer is shut down.
func (k *queueKeeper) releaseAll() {
	k.mu.Lock()
	group, id := k.group, k.clientID
	var qs []rmqlock.Queue
	for _, all := range k.all {
		qs = append(qs, all...)
	}
	k.mu.Unlock()
	if id == "" || len(qs) == 0 {
		return
	}
	k.unlock(group, id, qs)
}

// unlock unlocks qs at their brokers for id, and returns those unlocked.
func (k *queueKeeper) unlock(group, id string, qs []rmqlock.Queue) []rmqlock.Queue {
	var done []rmqlock.Queue
	for addr, bqs := range k.byBroker(qs) {
		ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
		err := k.client.Unlock(ctx, addr, group, id, bqs)
		cancel()
		if err != nil {
			k.forgetRoute(bqs[0].Topic)
			k.denied(err, "unlock", group, bqs)
			k.log.Debug("inbox: could not unlock queues given up; trying again", slog.String("broker", addr), slog.Any("error", err))
			continue
		}
		done = append(done, bqs...)
	}
	return done
}

// byBroker groups qs by the address of their broker's master; a queue whose broker the
// name servers do not know is left out.
func (k *queueKeeper) byBroker(qs []rmqlock.Queue) map[string][]rmqlock.Queue {
	out := map[string][]rmqlock.Queue{}
	for _, q := range qs {
		if addr := k.brokerAddr(q); addr != "" {
			out[addr] = append(out[addr], q)
		}
	}
	for _, bqs := range out {
		rmqlock.Sort(bqs)
	}
	return out
}

func (k *queueKeeper) brokerAddr(q rmqlock.Queue) string {
	k.mu.Lock()
	addr := k.routes[q.Topic][q.BrokerName]
	k.mu.Unlock()
	if addr != "" {
		return addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), brokerCallTimeout)
	defer cancel()
	route, err := k.client.Route(ctx, k.nameServers, q.Topic)
	if err != nil {
		k.log.Debug("inbox: could not read the route of a topic", slog.String("topic", q.Topic), slog.Any("error", err))
		return ""
	}
	k.mu.Lock()
	k.routes[q.Topic] = route
	k.mu.Unlock()
	return route[q.BrokerName]
}

// deniedEvery is how often a refusal by the brokers' ACL is logged at warn while it lasts.
const deniedEvery = time.Minute

// denied logs at warn, at most once every deniedEvery, a refusal of the brokers' ACL to
// lock or unlock qs: without the keeper's locks and unlocks, a queue handed over stands
// still until the broker's lock expires.
func (k *queueKeeper) denied(err error, what, group string, qs []rmqlock.Queue) {
	if !rmqlock.Denied(err) {
		return
	}
	k.mu.Lock()
	now := time.Now()
	due := now.Sub(k.deniedAt) >= deniedEvery
	if due {
		k.deniedAt = now
	}
	k.mu.Unlock()
	if !due {
		return
	}
	user := k.client.Credentials.AccessKey
	if user == "" {
		user = "(none: set ConsumerConfig.Credentials)"
	}
	k.log.Warn("inbox: the broker's ACL refused to "+what+" the consumer's queues, so queues handed over stand still until the broker's lock expires (60 s); "+
		"grant the user Sub on the group and the topic",
		slog.String("user", user), slog.String("group", group), slog.String("topic", qs[0].Topic), slog.Any("error", err))
}

func (k *queueKeeper) forgetRoute(topic string) {
	k.mu.Lock()
	delete(k.routes, topic)
	k.mu.Unlock()
}
