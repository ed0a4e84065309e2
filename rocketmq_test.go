package outbox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// newRocketMQSender is a sender with a producer of its own, closed when t ends.
func newRocketMQSender(t *testing.T, logs *logSink) *outbox.RocketMQSender {
	t.Helper()
	cfg := outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName:   testsvc.UniqueTable("pg"),
	}
	if logs != nil {
		outbox.RouteRocketMQClientLogs(slog.New(logs))
	}
	s, err := outbox.NewRocketMQSender(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// newFastRocketMQSender is newRocketMQSender bounding sends by fastConfig's SendTimeout: a
// publisher refuses a SendTimeout that differs from its sender's.
func newFastRocketMQSender(t *testing.T) *outbox.RocketMQSender {
	t.Helper()
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: fastConfig("", nil).Tuning.SendTimeout,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// Events inserted in a committed transaction arrive at a real consumer once each, with the
// payload as body, the eventId / eventType / bizNo properties, the biz no as key and the
// event type as tag.
func TestRocketMQEventsArriveOnceWithTheirProperties(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_E2E")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	ids := b.insert(t, 20)
	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("order-e2e", &logSink{}))

	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	require.Equal(t, 20, stats.Sent)
	consumer.WaitDistinct(t, 20, 60*time.Second)

	rowOf := map[string]int64{} // event id -> row id
	for id, eventID := range b.eventIDs(t) {
		rowOf[eventID] = id
	}
	byID := map[string]int{}
	for _, m := range consumer.Messages() {
		eventID := m.GetProperty("eventId")
		byID[eventID]++
		id, ok := rowOf[eventID]
		require.True(t, ok, "eventId %q is the event id of no row", eventID)
		ev := b.get(t, id)
		assert.Equal(t, ev.EventID, eventID)
		assert.Equal(t, ev.Payload, m.Body)
		assert.Equal(t, ev.EventType, m.GetProperty("eventType"))
		assert.Equal(t, ev.BizNo, m.GetProperty("bizNo"))
		assert.Equal(t, ev.BizNo, m.GetKeys())
		assert.Equal(t, ev.EventType, m.GetTags())
		assert.Equal(t, topic, m.Topic)
	}
	for _, id := range ids {
		assert.Equal(t, 1, byID[b.get(t, id).EventID], "event %d", id)
	}
}

// Three publishers on one table, each with its own pool and producer, deliver every event
// once: counted by eventId at a real consumer, in a run without faults.
func TestRocketMQThreePublishersDeliverEachEventOnce(t *testing.T) {
	t.Parallel()
	const events, instances = 1000, 3
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_THREE")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	ids := b.insert(t, events)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range instances {
		store := outbox.OnDBForTest(b.store, testsvc.OpenDB(t))
		cfg := fastConfig(fmt.Sprintf("order-%d", i), &logSink{})
		cfg.PollInterval = time.Millisecond
		p := newPublisher(t, store, newFastRocketMQSender(t), cfg)
		wg.Go(func() { assert.NoError(t, p.Run(ctx)) })
	}
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == events }, 2*time.Minute, 50*time.Millisecond)
	cancel()
	wg.Wait()
	consumer.WaitDistinct(t, events, time.Minute)

	got, eventIDs := consumer.Deliveries(), b.eventIDs(t)
	for _, id := range ids {
		assert.Equal(t, 1, got[eventIDs[id]], "event %d", id)
	}
	assert.Len(t, got, events)
}

// A payload the broker refuses (over its 4 MiB message limit) is dead-lettered on the first
// attempt with the broker's reason, instead of burning three retries.
func TestRocketMQOversizePayloadDeadLettersAtOnce(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{MaxPayloadBytes: 6 << 20})
	b := &bundle{db: db, store: store}
	topic := testsvc.NewTopic(t, "OUTBOX_BIG")
	b.routeTo(topic)

	payload := make([]byte, 5<<20)
	_, _ = rand.Read(payload) // incompressible, so the client cannot shrink it under the limit
	ctx := context.Background()
	tx, err := store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "ORD-BIG", EventType: "ORDER_CREATED", Payload: payload})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	// The client compresses a body this size before sending, which under -race takes seconds:
	// give the send room, and the lease with it.
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"), SendTimeout: 20 * time.Second, SendAttempts: 1,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sender.Close()) })
	var dead []error
	cfg := fastConfig("order-big", &logSink{})
	cfg.Tuning.SendTimeout, cfg.Tuning.Lease = 20*time.Second, 10*time.Minute
	cfg.OnDeadLetter = func(_ context.Context, _ outbox.Event, cause error) { dead = append(dead, cause) }
	p := newPublisher(t, store, sender, cfg)
	start := time.Now()
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	t.Logf("oversize message: dead-lettered %s after the round began", time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 1, stats.DeadLettered)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 1, got.RetryCount)
	assert.Contains(t, got.LastError, "CODE: 13", "the broker's reason is recorded")
	require.Len(t, dead, 1)
	assert.True(t, outbox.IsPermanent(dead[0]))
}

// A resend carries the event id of the first send, the one Get shows: after a lost
// acknowledgement (the broker has the message, the publisher records a failure and sends it
// again) and after a reclaim (the holder sent it and died before recording SUCCESS), the
// consumer receives the same eventId twice and can drop the second.
func TestRocketMQResendCarriesTheSameEventID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_RESEND")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	rmq := newRocketMQSender(t, nil)
	ctx := context.Background()
	lostAck := b.insert(t, 1)[0]
	lossy := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		if err := sendAlone(ctx, rmq, ev); err != nil {
			return err
		}
		if ev.ID == lostAck && ev.RetryCount == 0 {
			return errors.New("acknowledgement lost")
		}
		return nil
	})
	p := newPublisher(t, b.store, lossy, fastConfig("resend", &logSink{}))

	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, stats.Retried)
	b.makeDue(t, lostAck)
	stats, err = p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, stats.Sent)

	// A holder that sent and died: its lease expires, the row is reclaimed and sent again.
	reclaimed := b.insert(t, 1)[0]
	evs, _, err := claimDue(ctx, b.store, "dead-holder", 10, 1<<20)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.NoError(t, sendAlone(ctx, rmq, evs[0]))
	b.ageClaim(t, reclaimed, time.Hour)
	n, err := p.Reclaim(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	stats, err = p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, stats.Sent)

	want := []string{b.get(t, lostAck).EventID, b.get(t, reclaimed).EventID}
	require.Eventually(t, func() bool {
		got := consumer.Deliveries()
		return got[want[0]] == 2 && got[want[1]] == 2
	}, time.Minute, 50*time.Millisecond, "each event twice, under its own event id")
	assert.Len(t, consumer.Deliveries(), 2, "no other eventId arrived")
	assert.Equal(t, evs[0].EventID, want[1], "the claim read the stored id")
	for _, id := range []int64{lostAck, reclaimed} {
		assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status)
	}
}

func TestRocketMQSenderRejectsBadConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  outbox.RocketMQConfig
		want string
	}{
		{"NoNameServers", outbox.RocketMQConfig{}, "NameServers is empty"},
		{"NegativeSendTimeout", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, SendTimeout: -time.Second}, "SendTimeout"},
		{"SendTimeoutTooShort", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, SendTimeout: time.Microsecond}, "SendTimeout must be at least 10ms"},
		{"NegativeAttempts", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, SendAttempts: -1}, "SendAttempts"},
		{"BadNameServer", outbox.RocketMQConfig{NameServers: []string{"not an address"}}, "NameServers"},
		{"BatchOverBrokerLimit", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, MaxBatchBytes: 5 << 20}, "MaxBatchBytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := outbox.NewRocketMQSender(c.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// The caller's ProducerOptions reach the producer the sender builds (here an interceptor,
// which sees every send), the sender still sends with its own settings, and once closed it
// sends nothing: its producer is not reached again.
func TestRocketMQSenderProducerOptions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_OWN")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	var (
		mu     sync.Mutex
		seen   int      // sends the interceptor saw
		topics []string // their topics
	)
	count := func(ctx context.Context, req, reply any, next primitive.Invoker) error {
		if m, ok := req.(*primitive.Message); ok {
			mu.Lock()
			seen++
			topics = append(topics, m.Topic)
			mu.Unlock()
		}
		return next(ctx, req, reply)
	}
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"),
		SendTimeout:     fastConfig("", nil).Tuning.SendTimeout,
		ProducerOptions: []producer.Option{producer.WithInterceptor(count)},
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sender.Close()) })
	ids := b.insert(t, 2)
	p := newPublisher(t, b.store, sender, fastConfig("own", &logSink{}))
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, stats.Sent)
	consumer.WaitDistinct(t, 2, time.Minute)
	got := consumer.Deliveries()
	for _, id := range ids {
		assert.Equal(t, 1, got[b.get(t, id).EventID])
	}
	mu.Lock()
	before := seen
	assert.Positive(t, before, "the caller's interceptor saw the sends")
	for _, tp := range topics {
		assert.Equal(t, topic, tp)
	}
	mu.Unlock()

	require.NoError(t, sender.Close())
	err = sendAlone(context.Background(), sender, b.get(t, ids[0]))
	require.ErrorIs(t, err, outbox.ErrClosed, "a closed sender sends nothing")
	mu.Lock()
	assert.Equal(t, before, seen, "a closed sender does not reach its producer")
	mu.Unlock()
}

// sendAlone sends one event through s, as the publisher does an event claimed alone, and
// returns its error.
func sendAlone(ctx context.Context, s outbox.Sender, ev outbox.Event) error {
	return s.Send(ctx, []outbox.Event{ev}, false)[0]
}

// A send with no route to any broker (nothing answers at the name server's address) fails
// within the send timeout as Unavailable: the event is not dead-lettered. The client's own
// complaints reach the logger RouteRocketMQClientLogs was given, not stderr.
func TestRocketMQNoNameServerIsUnavailable(t *testing.T) {
	t.Parallel()
	testsvc.RocketMQNameServer(t)
	b := setup(t)
	id := b.insert(t, 1)[0]
	clientLogs := &logSink{}
	outbox.RouteRocketMQClientLogs(slog.New(clientLogs))
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{"127.0.0.1:1"}, // nothing listens there
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: 300 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sender.Close() })

	start := time.Now()
	err = sendAlone(context.Background(), sender, b.get(t, id))
	t.Logf("no name server: error after %s: %v", time.Since(start).Round(time.Millisecond), err)
	require.ErrorContains(t, err, "route info not found")
	assert.True(t, outbox.IsUnavailable(err), "unavailable: %v", err)
	assert.False(t, outbox.IsPermanent(err))

	cfg := fastConfig("p", &logSink{})
	cfg.Tuning.SendTimeout = 0 // the sender's
	p := newPublisher(t, b.store, sender, cfg)
	_, err = p.PublishPending(context.Background())
	require.NoError(t, err)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusWait, got.Status, "not dead-lettered")
	assert.NotEmpty(t, clientLogs.atLeast(slog.LevelDebug), "the client's logs were routed")
}

// Each class of failure, produced by a real name server and broker, is classified as the
// sender's documentation says, and the sender says so within the time logged. (The broker
// being down is in TestRocketMQBrokerOutageLosesNothing and TestRocketMQClusterSurvivesABroker.)
func TestRocketMQFailureClassesOnARealBroker(t *testing.T) {
	t.Parallel()
	ns := testsvc.RocketMQNameServer(t)
	ev := outbox.Event{Topic: "T", ID: 1, EventID: "classes", BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{"order":1}`)}

	// A name server that accepts connections and never answers: the client's route lookup
	// waits its own fixed 6 s per attempt, whatever the send's timeout.
	t.Run("NameServerSilent", func(t *testing.T) {
		t.Parallel()
		addr := silentServer(t)
		sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers: []string{addr}, GroupName: testsvc.UniqueTable("pg"),
			SendTimeout: time.Second, SendAttempts: 1,
		})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, sender.Close()) })
		start := time.Now()
		err = sendAlone(context.Background(), sender, ev)
		t.Logf("silent name server (1 attempt, 1 s timeout): error after %s: %v", time.Since(start).Round(time.Millisecond), err)
		require.ErrorContains(t, err, "route info not found")
		assert.True(t, outbox.IsUnavailable(err))
	})

	// A topic that exists on no broker, on a cluster that does not create topics on first
	// use (the producer's template topic for auto-creation does not exist either).
	t.Run("TopicDoesNotExist", func(t *testing.T) {
		t.Parallel()
		sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers: []string{ns}, GroupName: testsvc.UniqueTable("pg"),
			ProducerOptions: []producer.Option{producer.WithCreateTopicKey(testsvc.UniqueTable("NO_TEMPLATE"))},
		})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, sender.Close()) })
		start := time.Now()
		err = sendAlone(context.Background(), sender, ev)
		t.Logf("topic does not exist: error after %s: %v", time.Since(start).Round(time.Millisecond), err)
		require.ErrorContains(t, err, "route info not found")
		assert.True(t, outbox.IsUnavailable(err))
	})

	// An empty body: the broker fails it on every attempt, so the sender refuses it itself.
	t.Run("EmptyBody", func(t *testing.T) {
		t.Parallel()
		topic := testsvc.NewTopic(t, "OUTBOX_EMPTY")
		addrs, err := primitive.NewNamesrvAddr(ns)
		require.NoError(t, err)
		prod, err := rocketmq.NewProducer(producer.WithNameServer(addrs), producer.WithGroupName(testsvc.UniqueTable("pg")),
			producer.WithInstanceName(testsvc.UniqueTable("eb")), producer.WithRetry(0))
		require.NoError(t, err)
		require.NoError(t, prod.Start())
		t.Cleanup(func() { _ = prod.Shutdown() })
		_, err = prod.SendSync(context.Background(), primitive.NewMessage(topic, nil))
		require.Error(t, err, "the broker refuses a message without a body")
		t.Logf("the broker's answer to an empty body: %v", err)

		sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
			NameServers: []string{ns}, GroupName: testsvc.UniqueTable("pg"), SendAttempts: 1,
		})
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, sender.Close()) })
		empty := ev
		empty.Payload = nil
		err = sendAlone(context.Background(), sender, empty)
		assert.True(t, outbox.IsPermanent(err), "%v", err)
	})
}

// silentServer listens on a free loopback port, accepts connections and never answers.
func silentServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// A producer that cannot start (its group already runs on the client instance it would
// share, same InstanceName) makes NewRocketMQSender fail with a clear error, leaks nothing,
// and leaves the other producer working: shutting the failed one down would unregister the
// group from the shared client and shut that client down under the other sender. Not
// parallel: it looks for goroutines that outlive the failed constructor.
func TestRocketMQSenderWhoseProducerCannotStart(t *testing.T) {
	topic := testsvc.NewTopic(t, "OUTBOX_START")
	cfg := outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, GroupName: testsvc.UniqueTable("pg"), InstanceName: testsvc.UniqueTable("shared"),
	}
	first, err := outbox.NewRocketMQSender(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, first.Close()) })

	before := goleak.IgnoreCurrent()
	_, err = outbox.NewRocketMQSender(cfg)
	require.ErrorIs(t, err, rmqerrors.ErrProducerCreated)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig, "a producer that cannot start with these settings is a configuration error")
	assert.ErrorContains(t, err, "InstanceName")
	require.NoError(t, testsvc.FindLeaks(10*time.Second, append(testsvc.RocketMQClientLifetimes, before)...))

	ev := outbox.Event{ID: 1, EventID: "start", BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{"order":1}`), Topic: topic}
	require.NoError(t, sendAlone(context.Background(), first, ev), "the sender whose client was shared still sends")
}

// fakeProducer answers SendSync with a fixed result (or respond's), for the classification
// and batching logic alone.
type fakeProducer struct {
	rocketmq.Producer
	res     *primitive.SendResult
	err     error
	respond func(msgs []*primitive.Message) (*primitive.SendResult, error)
	msgs    []*primitive.Message
	calls   []int // messages per call
}

func (f *fakeProducer) SendSync(_ context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	f.msgs = append(f.msgs, msgs...)
	f.calls = append(f.calls, len(msgs))
	if f.respond != nil {
		return f.respond(msgs)
	}
	return f.res, f.err
}

// SendBatch packs events into as few sends as fit under MaxBatchBytes.
func TestRocketMQSendBatchChunksBySize(t *testing.T) {
	t.Parallel()
	fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
	s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{MaxBatchBytes: 1 << 20}, fp)
	require.NoError(t, err)
	evs := make([]outbox.Event, 5)
	for i := range evs {
		evs[i] = outbox.Event{Topic: "T", ID: int64(i + 1), EventID: fmt.Sprintf("event-%d", i+1), BizNo: "ORD", EventType: "E", Payload: make([]byte, 400<<10)}
	}
	errs := s.Send(context.Background(), evs, false)
	assert.Equal(t, []error{nil, nil, nil, nil, nil}, errs)
	assert.Equal(t, []int{2, 2, 1}, fp.calls, "400 KiB events, 1 MiB batches")
	for i, m := range fp.msgs {
		assert.Equal(t, fmt.Sprintf("event-%d", i+1), m.GetProperty(outbox.PropertyEventID), "order kept")
	}
}

// A batch the broker refuses as illegal is sent again one by one, so that only the illegal
// event is dead-lettered; a broker that is unavailable fails the whole batch, unavailable.
func TestRocketMQSendBatchIsolatesAnIllegalMessage(t *testing.T) {
	t.Parallel()
	illegal := errors.New("CODE: 13, DESC: the message is illegal")
	fp := &fakeProducer{respond: func(msgs []*primitive.Message) (*primitive.SendResult, error) {
		for _, m := range msgs {
			if m.GetProperty(outbox.PropertyEventID) == "event-2" {
				return &primitive.SendResult{Status: primitive.SendUnknownError}, illegal
			}
		}
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}}
	s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, fp)
	require.NoError(t, err)
	body := []byte("{}")
	evs := []outbox.Event{
		{Topic: "T", ID: 1, EventID: "event-1", BizNo: "A", EventType: "E", Payload: body},
		{Topic: "T", ID: 2, EventID: "event-2", BizNo: "B", EventType: "E", Payload: body},
		{Topic: "T", ID: 3, EventID: "event-3", BizNo: "C", EventType: "E", Payload: body},
	}
	errs := s.Send(context.Background(), evs, false)
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	assert.True(t, outbox.IsPermanent(errs[1]))
	assert.NoError(t, errs[2])
	assert.Equal(t, []int{3, 1, 1, 1}, fp.calls)

	fp = &fakeProducer{err: errors.New("CODE: 14, DESC: service not available now")}
	s, err = outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, fp)
	require.NoError(t, err)
	errs = s.Send(context.Background(), evs, false)
	for _, err := range errs {
		require.ErrorContains(t, err, "CODE: 14")
		assert.False(t, outbox.IsPermanent(err))
		assert.True(t, outbox.IsUnavailable(err))
	}
	assert.Equal(t, []int{3}, fp.calls, "unavailable: no one-by-one resend")
}

// The mapping from what the client returns to the sender's error classes, with each class's
// real texts (read from rocketmq-client-go and the broker's SendMessageProcessor; the
// real-broker tests below produce most of them for real).
func TestRocketMQSendOutcomes(t *testing.T) {
	t.Parallel()
	const eventID = "01960b3e-8f1c-7a2b-9c3d-4e5f60718293"
	ev := outbox.Event{Topic: "T", ID: 7, EventID: eventID, BizNo: "ORD-7", EventType: "ORDER_PAID", Payload: []byte("{}")}
	const (
		ok = iota
		unconfirmed
		plain
		permanent
		unavailable
		closed
	)
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	cases := []struct {
		name    string
		res     *primitive.SendResult
		err     error
		wantErr string
		class   int
	}{
		{"SendOK", &primitive.SendResult{Status: primitive.SendOK}, nil, "", ok},
		// The broker stored the message but did not confirm it durable: sent, not again.
		{"FlushDiskTimeout", &primitive.SendResult{Status: primitive.SendFlushDiskTimeout}, nil, "FLUSH_DISK_TIMEOUT", unconfirmed},
		{"FlushSlaveTimeout", &primitive.SendResult{Status: primitive.SendFlushSlaveTimeout}, nil, "FLUSH_SLAVE_TIMEOUT", unconfirmed},
		{"SlaveNotAvailable", &primitive.SendResult{Status: primitive.SendSlaveNotAvailable}, nil, "SLAVE_NOT_AVAILABLE", unconfirmed},
		// The message itself.
		{"MessageIllegal", nil, errors.New("CODE: 13, DESC: the message is illegal, maybe msg body or properties length not matched. msg body length limit 4194304B, msg properties length limit 32KB."), "CODE: 13", permanent},
		{"MessageIllegalTyped", nil, primitive.MQBrokerErr{ResponseCode: 13, ErrorMessage: "illegal"}, "CODE: 13", permanent},
		// The broker, its route, the way to it.
		{"BrokerBusy", nil, errors.New("CODE: 2, DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while, period in queue: 1001ms"), "broker busy", unavailable},
		{"PageCacheBusy", nil, errors.New("CODE: 1, DESC: [PC_SYNCHRONIZED]broker busy, start flow control for a while"), "PC_SYNCHRONIZED", unavailable},
		{"MappedFileFailed", nil, errors.New("CODE: 1, DESC: create mapped file failed, server is busy or broken."), "mapped file", unavailable},
		{"InSyncReplicas", nil, errors.New("CODE: 1, DESC: in-sync replicas not enough"), "in-sync", unavailable},
		{"ServiceNotAvailable", nil, errors.New("CODE: 14, DESC: service not available now. It may be caused by one of the following reasons: the broker's disk is full"), "CODE: 14", unavailable},
		{"ServiceNotAvailableTyped", nil, primitive.MQBrokerErr{ResponseCode: 14, ErrorMessage: "service not available now"}, "CODE: 14", unavailable},
		{"NoPermission", nil, errors.New("CODE: 16, DESC: the broker[127.0.0.1] sending message is forbidden"), "forbidden", unavailable},
		{"TopicNotExist", nil, errors.New("CODE: 17, DESC: topic[T] not exist, apply first please!"), "CODE: 17", unavailable},
		{"TopicNotExistClientErr", nil, primitive.NewMQClientErr(17, "No topic route info in name server for the topic: T"), "CODE: 17", unavailable},
		{"NoRoute", nil, errors.New("the topic=T route info not found"), "route info not found", unavailable},
		{"NoBrokerAddress", nil, errors.New("topic=T route info not found"), "route info not found", unavailable},
		{"NameServerUnreachable", nil, primitive.NewRemotingErr("dial tcp 127.0.0.1:1: connect: connection refused"), "connection refused", unavailable},
		{"ConnectionRefused", nil, refused, "connection refused", unavailable},
		{"ConnectionReset", nil, reset, "connection reset", unavailable},
		{"ConnectionClosed", nil, io.EOF, "EOF", unavailable},
		{"NoAnswer", nil, rmqerrors.ErrRequestTimeout, "request timeout", unavailable},
		{"Timeout", nil, context.DeadlineExceeded, "deadline exceeded", unavailable},
		// The producer: a caller's producer not started, or shut down.
		{"ProducerNotStarted", nil, rmqerrors.ErrNotRunning, "producer not started", closed},
		{"ClientShutDown", nil, rmqerrors.ErrService, "service close", closed},
		// Anything else.
		{"SystemError", nil, errors.New("CODE: 1, DESC: UNKNOWN_ERROR"), "UNKNOWN_ERROR", plain},
		{"RequestCodeNotSupported", nil, errors.New("CODE: 3, DESC: request type 310 not supported"), "CODE: 3", plain},
		{"Unknown", nil, errors.New("something unexpected"), "something unexpected", plain},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fp := &fakeProducer{res: c.res, err: c.err}
			s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, fp)
			require.NoError(t, err)
			err = sendAlone(context.Background(), s, ev)
			assert.Equal(t, c.class == unconfirmed, errors.Is(err, outbox.ErrUnconfirmed), "unconfirmed: %v", err)
			if c.class == ok {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, c.wantErr)
				if c.err != nil {
					require.ErrorIs(t, err, c.err, "the client's error is kept")
				}
			}
			assert.Equal(t, c.class == permanent, outbox.IsPermanent(err), "permanent: %v", err)
			assert.Equal(t, c.class == unavailable, outbox.IsUnavailable(err), "unavailable: %v", err)
			assert.Equal(t, c.class == closed, errors.Is(err, outbox.ErrClosed), "closed: %v", err)
			require.Len(t, fp.msgs, 1)
			m := fp.msgs[0]
			assert.Equal(t, "T", m.Topic)
			assert.Equal(t, eventID, m.GetProperty(outbox.PropertyEventID), "the event id, not the row id")
			assert.Equal(t, "ORDER_PAID", m.GetProperty(outbox.PropertyEventType))
			assert.Equal(t, "ORD-7", m.GetProperty(outbox.PropertyBizNo))
			assert.Equal(t, "ORD-7", m.GetKeys())
			assert.Equal(t, "ORDER_PAID", m.GetTags())
		})
	}
}

// outageEnv sets how long TestRocketMQBrokerOutageLosesNothing keeps the broker down, as a
// Go duration; docs/guarantees.md's figure for a 10-minute outage is OUTBOX_TEST_OUTAGE=10m.
const outageEnv = "OUTBOX_TEST_OUTAGE"

// The only broker stops mid-run, with the library's defaults but for the poll interval
// (MaxRetry 3, MaxProbeDelay 15 s): every send fails as Unavailable, the publisher pauses and
// probes, no retry is spent and nothing is dead-lettered, however long the outage; once the
// broker is back every event arrives, none lost. Not parallel: it stops the broker the other
// tests use.
func TestRocketMQBrokerOutageLosesNothing(t *testing.T) {
	const before, during = 100, 100
	outage := 5 * time.Second
	if v := os.Getenv(outageEnv); v != "" {
		var err error
		outage, err = time.ParseDuration(v)
		require.NoError(t, err, "%s", outageEnv)
	}
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_OUTAGE")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	ids := b.insert(t, before)

	logs := &logSink{}
	cfg := outbox.Config{InstanceID: "order-outage", PollInterval: 20 * time.Millisecond, Logger: slog.New(logs),
		Tuning: outbox.Tuning{ClaimPerRow: testPerRow}}
	sender := &watchedSender{RocketMQSender: newRocketMQSender(t, nil)}
	p := newPublisher(t, b.store, sender, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	consumer.WaitDistinct(t, before, time.Minute)
	testsvc.StopBroker(t)
	stopped := time.Now()
	for range 10 { // committed during the outage, a few at a time
		ids = append(ids, b.insert(t, during/10)...)
		time.Sleep(outage / 20)
	}
	require.Eventually(t, func() bool { return p.Health().BrokerUnavailable }, time.Minute, 10*time.Millisecond, "the publisher notices the outage")
	time.Sleep(time.Until(stopped.Add(outage)))

	fails := sender.failures(stopped)
	require.NotEmpty(t, fails)
	t.Logf("first failed send %s after the broker stopped: %v", fails[0].at.Sub(stopped).Round(time.Millisecond), fails[0].err)
	for _, f := range fails {
		assert.True(t, outbox.IsUnavailable(f.err) || notSentErr(f.err), "an outage is Unavailable: %v", f.err)
		assert.False(t, outbox.IsPermanent(f.err), "%v", f.err)
	}
	assert.Zero(t, b.countStatus(t, outbox.StatusFail))
	assert.Zero(t, b.retried(t), "an outage spends no retry")
	assert.Zero(t, b.countStatus(t, outbox.StatusSending), "probed events went back to WAIT")
	t.Logf("%s outage: %d send attempts failed (%d probes), %d events waiting", outage, len(fails),
		logs.count(slog.LevelWarn, "broker still unavailable"), b.countStatus(t, outbox.StatusWait))

	// The broker answers some time after its restart begins (the JVM boots, the store
	// loads), and before the script has seen it registered: times are measured from the
	// restart's beginning, an upper bound of the time since the broker answered.
	restart := time.Now()
	testsvc.StartBroker(t)
	t.Logf("the script restarted the broker and saw it registered in %s", time.Since(restart).Round(time.Millisecond))
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) },
		3*time.Minute, 100*time.Millisecond)
	consumer.WaitDistinct(t, len(ids), 2*time.Minute)
	t.Logf("since the restart began: first successful send %s, all %d events consumed %s",
		sender.firstSuccess(restart).Sub(restart).Round(time.Millisecond), len(ids), time.Since(restart).Round(time.Millisecond))
	assert.Zero(t, b.countStatus(t, outbox.StatusFail))
	assert.Zero(t, b.retried(t))
	assert.False(t, p.Health().BrokerUnavailable)

	got, eventIDs := consumer.Deliveries(), b.eventIDs(t)
	dups := 0
	for _, id := range ids {
		n := got[eventIDs[id]]
		assert.Positive(t, n, "event %d lost", id)
		dups += max(n-1, 0)
	}
	t.Logf("duplicate deliveries across the outage: %d", dups)
}

// watchedSender is a RocketMQ sender that records the outcome of every event it sends.
type watchedSender struct {
	*outbox.RocketMQSender
	mu    sync.Mutex
	sends []sendRecord
}

type sendRecord struct {
	at  time.Time
	err error
}

func (w *watchedSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	errs := w.RocketMQSender.Send(ctx, evs, keyOrder)
	w.record(errs...)
	return errs
}

func (w *watchedSender) record(errs ...error) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, err := range errs {
		w.sends = append(w.sends, sendRecord{at: now, err: err})
	}
}

// failures returns the failed sends since from.
func (w *watchedSender) failures(from time.Time) []sendRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []sendRecord
	for _, r := range w.sends {
		if r.err != nil && !r.at.Before(from) {
			out = append(out, r)
		}
	}
	return out
}

// firstSuccess returns when the first successful send since from returned.
func (w *watchedSender) firstSuccess(from time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.sends {
		if r.err == nil && !r.at.Before(from) {
			return r.at
		}
	}
	return time.Time{}
}

// longestPause returns the longest time between successive successful sends in [from, to],
// and when it began.
func (w *watchedSender) longestPause(from, to time.Time) (pause time.Duration, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := from
	for _, r := range w.sends {
		if r.err != nil || r.at.Before(from) || r.at.After(to) {
			continue
		}
		if d := r.at.Sub(last); d > pause {
			pause, at = d, last
		}
		last = r.at
	}
	if d := to.Sub(last); d > pause {
		pause, at = d, last
	}
	return pause, at
}

// notSentErr reports whether err is a batch's "not sent" error: the event was never tried.
func notSentErr(err error) bool { return strings.HasPrefix(err.Error(), "not sent") }
