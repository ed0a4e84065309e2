package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// newKeyOrderRocketMQSender is a sender with a producer of its own, bounding sends by
// sendTimeout, closed when t ends. It sends in key order when the publisher says so (a
// store in key order).
func newKeyOrderRocketMQSender(t *testing.T, topic string, sendTimeout time.Duration) *outbox.RocketMQSender {
	t.Helper()
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: sendTimeout,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// newKeyOrderStoreOn returns a store in key order for an existing table, on a pool of its
// own, as a second instance would open it.
func newKeyOrderStoreOn(t *testing.T, table, topic string) *outbox.MySQLStore {
	t.Helper()
	store, err := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{Table: table, Ordering: outbox.KeyOrder, Routes: outbox.Routes{Topic: topic}})
	require.NoError(t, err)
	return store
}

// keyFlights watches, across all the senders of a test, that no two sends carrying events
// of one biz no are ever in flight at once.
type keyFlights struct {
	mu         sync.Mutex
	inFlight   map[string]int
	concurrent []string // a key whose send began while another send of it was in flight
}

func (f *keyFlights) begin(evs []outbox.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	for _, ev := range evs {
		if seen[ev.BizNo] {
			continue
		}
		seen[ev.BizNo] = true
		if f.inFlight[ev.BizNo] > 0 {
			f.concurrent = append(f.concurrent, fmt.Sprintf("%s (event %d)", ev.BizNo, ev.ID))
		}
		f.inFlight[ev.BizNo]++
	}
}

func (f *keyFlights) end(evs []outbox.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[string]bool{}
	for _, ev := range evs {
		if !seen[ev.BizNo] {
			seen[ev.BizNo] = true
			f.inFlight[ev.BizNo]--
		}
	}
}

// flakyKeySender is a RocketMQ sender that fails sends with a plain error (retried with
// backoff) before they reach the broker: one batch in ten whole, and in the other batches
// one key in ten, all of that key's events in the batch (the rest of the batch is sent);
// one event in ten sent alone. A key's run is never sent in part, so a failure never leaves
// a gap behind it; whatever fails goes again later, through whichever publisher claims it
// then. It counts the calls that did not ask for key order.
type flakyKeySender struct {
	s         *outbox.RocketMQSender
	flights   *keyFlights
	mu        sync.Mutex
	rng       *rand.Rand
	failed    atomic.Int64 // events failed on purpose
	unordered atomic.Int64 // calls without keyOrder
}

var errInjected = errors.New("injected send failure")

func (f *flakyKeySender) fail() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.IntN(10) == 0
}

func (f *flakyKeySender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	if !keyOrder {
		f.unordered.Add(1)
	}
	f.flights.begin(evs)
	defer f.flights.end(evs)
	errs := make([]error, len(evs))
	if len(evs) == 1 {
		if f.fail() {
			f.failed.Add(1)
			errs[0] = errInjected
			return errs
		}
		return f.s.Send(ctx, evs, keyOrder)
	}
	whole := f.fail()
	failing := map[string]bool{}
	var rest []outbox.Event // in the batch's order
	var restAt []int
	for i, ev := range evs {
		failed, decided := failing[ev.BizNo]
		if !decided {
			failed = whole || f.fail()
			failing[ev.BizNo] = failed
		}
		if failed {
			errs[i] = errInjected
			f.failed.Add(1)
			continue
		}
		rest = append(rest, ev)
		restAt = append(restAt, i)
	}
	if len(rest) > 0 {
		for j, err := range f.s.Send(ctx, rest, keyOrder) {
			errs[restAt[j]] = err
		}
	}
	return errs
}

func (f *flakyKeySender) Info() outbox.SenderInfo { return f.s.Info() }

func (f *flakyKeySender) Check(ctx context.Context, topics []string) error {
	return f.s.Check(ctx, topics)
}

// lostAckStore loses one acknowledgement: the first time a success of one of the events in
// victims is to be recorded (by a claim that carries it, or on its own), it drops it and
// reports it recorded all the same. That event stays SENDING, though the broker has it,
// until its lease runs out; then it is reclaimed and sent again, after which its key goes
// on.
type lostAckStore struct {
	*outbox.MySQLStore
	victims map[int64]bool
	lost    atomic.Int64 // the event whose acknowledgement was lost; 0 until then
}

// drop returns ids without the first victim among them, once in the store's life.
func (s *lostAckStore) drop(ids []int64) ([]int64, bool) {
	if s.lost.Load() != 0 {
		return ids, false
	}
	for i, id := range ids {
		if s.victims[id] && s.lost.CompareAndSwap(0, id) {
			return slices.Delete(slices.Clone(ids), i, i+1), true
		}
	}
	return ids, false
}

func (s *lostAckStore) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	var dropped bool
	req.Succeeded, dropped = s.drop(req.Succeeded)
	res, err := s.MySQLStore.ClaimDue(ctx, req)
	if err == nil && dropped {
		res.Succeeded++
	}
	return res, err
}

func (s *lostAckStore) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	ids, dropped := s.drop(ids)
	var n int64
	var err error
	if len(ids) > 0 {
		n, err = s.MySQLStore.MarkSuccess(ctx, ids, owner)
	}
	if err == nil && dropped {
		n++
	}
	return n, err
}

// Per-key ordering end to end, on a real broker read by a real orderly push consumer: 1,000
// biz nos with 3 to 5 events each, committed in rounds (each key's events in id order,
// interleaved with the other keys', the later rounds while the publishers run); three
// publishers whose stores are in KeyOrder, each with a RocketMQ sender that fails sends at
// random, one of them shut down mid-run and replaced by a fourth; and one acknowledgement
// lost, so that one event stays SENDING until its short lease runs out and is sent again.
// Every event arrives; per key, no event arrives for the first time after a later one of its
// key (a repeat of an event that had arrived is allowed, and the lost acknowledgement makes
// one); no two sends of a key were ever in flight at once.
func TestRocketMQKeyOrderWithFailuresAndALostAck(t *testing.T) {
	t.Parallel()
	const keys, instances = 1000, 3
	const sendTimeout = 500 * time.Millisecond // and the lease 5 s, the shortest it may be
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder})}
	ordering, err := b.store.Check(context.Background())
	require.NoError(t, err, "the schema serves key order")
	require.Equal(t, outbox.KeyOrder, ordering.Ordering)
	topic, _ := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KEYORDER")
	b.routeTo(topic)
	consumer := testsvc.ConsumeOrderly(t, topic)

	eventsOf := func(k int) int { return 3 + k%3 } // 3, 4 or 5
	const rounds = 5
	total := 0
	for k := range keys {
		total += eventsOf(k)
	}
	ids := map[string][]int64{} // per key, its events in id order
	insertRound := func(r int) {
		t.Helper()
		ctx := context.Background()
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		for k := range keys {
			if r >= eventsOf(k) {
				continue
			}
			key := fmt.Sprintf("KEY-%d", k)
			id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: key, EventType: fmt.Sprintf("STEP_%d", r), Payload: fmt.Appendf(nil, `{"key":%d,"step":%d}`, k, r)})
			require.NoError(t, err)
			ids[key] = append(ids[key], id)
		}
		require.NoError(t, tx.Commit())
	}
	insertRound(0)
	insertRound(1)
	victims := map[int64]bool{} // every key's first event: each has others behind it
	for _, keyIDs := range ids {
		victims[keyIDs[0]] = true
	}

	flights := &keyFlights{inFlight: map[string]int{}}
	var senders []*flakyKeySender
	var lossy *lostAckStore
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	// start starts the i-th publisher and returns what stops it.
	start := func(i int) (stop func()) {
		own := newKeyOrderStoreOn(t, outbox.TableForTest(b.store), topic)
		var store outbox.Store = own
		if i == 0 {
			lossy = &lostAckStore{MySQLStore: own, victims: victims}
			store = lossy
		}
		sender := &flakyKeySender{s: newKeyOrderRocketMQSender(t, topic, sendTimeout), flights: flights, rng: rand.New(rand.NewPCG(11, uint64(i)))}
		senders = append(senders, sender)
		cfg := fastConfig(fmt.Sprintf("keyorder-%d", i), &logSink{})
		cfg.MaxAttempts = outbox.RetryForever
		cfg.Backoff = func(int) time.Duration { return 20 * time.Millisecond }
		cfg.Tuning.SendTimeout = sendTimeout
		cfg.Tuning.Lease = 10 * sendTimeout // the lost acknowledgement's event is sent again after it
		cfg.PollInterval = time.Millisecond
		cfg.Tuning.BatchSize = 100 // batch mode: more, smaller batches, so more of them fail
		p := newPublisher(t, store, sender, cfg)
		pctx, pcancel := context.WithCancel(ctx)
		done := make(chan struct{})
		wg.Go(func() {
			defer close(done)
			assert.NoError(t, p.Run(pctx))
		})
		return func() { pcancel(); <-done }
	}
	var stops []func()
	for i := range instances {
		stops = append(stops, start(i))
	}
	for r := 2; r < rounds; r++ {
		time.Sleep(100 * time.Millisecond)
		insertRound(r)
		if r == 3 {
			// One instance shuts down mid-run, returning what it claimed and did not send,
			// and another takes its place.
			stops[instances-1]()
			start(instances)
		}
	}

	// A bound on liveness, not a speed (4,000 events, a statement a claim in per-row mode,
	// beside the rest of the suite): 24-34 s alone on 2 vCPUs, more under the whole suite.
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == total }, 2*time.Minute, 50*time.Millisecond,
		"every event SUCCESS")
	cancel()
	wg.Wait()
	consumer.WaitDistinct(t, total, 30*time.Second)

	rowOf := map[string]int64{} // event id -> row id
	for id, eventID := range b.eventIDs(t) {
		rowOf[eventID] = id
	}
	require.Len(t, rowOf, total)
	inversions := consumer.Inversions(func(eventID string) int64 {
		id, ok := rowOf[eventID]
		require.True(t, ok, "eventId %q is the event id of no row", eventID)
		return id
	})
	assert.Empty(t, len(inversions), "events that arrived after a later event of their key, the first ones: %v",
		inversions[:min(len(inversions), 5)])

	// Every event arrived; per key, the first arrivals are the key's events in id order.
	arrivals := consumer.Arrivals()
	repeated := 0
	var misordered []string // keys whose events did not first arrive in id order
	for key, keyIDs := range ids {
		var first []int64
		seen := map[int64]bool{}
		for _, a := range arrivals[key] {
			id := rowOf[a.EventID]
			if seen[id] {
				repeated++
				continue
			}
			seen[id] = true
			first = append(first, id)
		}
		if !slices.Equal(keyIDs, first) {
			misordered = append(misordered, fmt.Sprintf("%s: %v arrived first as %v", key, keyIDs, first))
		}
	}
	assert.Empty(t, len(misordered), "keys whose events did not all arrive, first, in id order; the first ones: %v",
		misordered[:min(len(misordered), 5)])
	deliveries := consumer.Deliveries()
	assert.Len(t, deliveries, total)

	lost := lossy.lost.Load()
	require.NotZero(t, lost, "an acknowledgement was lost")
	ev := b.get(t, lost)
	assert.Equal(t, outbox.StatusSuccess, ev.Status)
	assert.Positive(t, ev.ReclaimCount, "the event whose acknowledgement was lost was reclaimed")
	assert.GreaterOrEqual(t, deliveries[ev.EventID], 2, "and sent again")

	flights.mu.Lock()
	assert.Empty(t, len(flights.concurrent), "two sends of one key in flight at once; the first ones: %v",
		flights.concurrent[:min(len(flights.concurrent), 5)])
	flights.mu.Unlock()
	failed, unordered := int64(0), int64(0)
	for _, s := range senders {
		failed += s.failed.Load()
		unordered += s.unordered.Load()
	}
	assert.Positive(t, failed, "sends failed")
	assert.Zero(t, unordered, "every send asked for key order, as the stores' ordering says")
	t.Logf("%d keys, %d events, %d sends of an event failed on purpose, %d repeated arrivals (event %d's acknowledgement lost, delivered %d times)",
		keys, total, failed, repeated, lost, deliveries[ev.EventID])
}
