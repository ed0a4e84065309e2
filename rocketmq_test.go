package outbox_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
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

// newRocketMQSender is a sender with a producer of its own on a fresh topic, closed when t ends.
func newRocketMQSender(t *testing.T, topic string, logs *logSink) *outbox.RocketMQSender {
	t.Helper()
	cfg := outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)},
		Topic:       topic,
		GroupName:   testsvc.UniqueTable("pg"),
	}
	if logs != nil {
		cfg.Logger = slog.New(logs)
	}
	s, err := outbox.NewRocketMQSender(cfg)
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
	consumer := testsvc.Consume(t, topic)
	ids := b.insert(t, 20)
	p := newPublisher(t, b.store, newRocketMQSender(t, topic, nil), fastConfig("order-e2e", &logSink{}))

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
	consumer := testsvc.Consume(t, topic)
	ids := b.insert(t, events)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range instances {
		store := testsvc.NewStoreOn(t, testsvc.OpenDB(t), b.store.Table())
		cfg := fastConfig(fmt.Sprintf("order-%d", i), &logSink{})
		cfg.PollInterval = time.Millisecond
		p := newPublisher(t, store, newRocketMQSender(t, topic, nil), cfg)
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

	payload := make([]byte, 5<<20)
	_, _ = rand.Read(payload) // incompressible, so the client cannot shrink it under the limit
	ctx := context.Background()
	tx, err := store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-BIG", EventType: "ORDER_CREATED", Payload: payload})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	// The client compresses a body this size before sending, which under -race takes seconds:
	// give the send room, and the lease with it.
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{testsvc.RocketMQNameServer(t)}, Topic: topic,
		GroupName: testsvc.UniqueTable("pg"), SendTimeout: 20 * time.Second, SendAttempts: 1,
	})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, sender.Close()) })
	var dead []error
	cfg := fastConfig("order-big", &logSink{})
	cfg.SendTimeout, cfg.Lease = 20*time.Second, 10*time.Minute
	cfg.OnDeadLetter = func(_ context.Context, _ outbox.Event, cause error) { dead = append(dead, cause) }
	p := newPublisher(t, store, sender, cfg)
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
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
	consumer := testsvc.Consume(t, topic)
	rmq := newRocketMQSender(t, topic, nil)
	ctx := context.Background()
	lostAck := b.insert(t, 1)[0]
	lossy := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		if err := rmq.Send(ctx, ev); err != nil {
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
	evs, err := b.store.ClaimDue(ctx, "dead-holder", 10, 1<<20)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.NoError(t, rmq.Send(ctx, evs[0]))
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
		{"TopicWithSpace", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, Topic: "ORDER EVENTS"}, "topic"},
		{"TopicTooLong", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, Topic: strings.Repeat("T", 128)}, "topic"},
		{"NegativeSendTimeout", outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}, SendTimeout: -time.Second}, "SendTimeout"},
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

// A sender given the caller's producer uses it and leaves its lifecycle to the caller.
func TestRocketMQSenderWithCallersProducer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_OWN")
	consumer := testsvc.Consume(t, topic)
	addrs, err := primitive.NewNamesrvAddr(testsvc.RocketMQNameServer(t))
	require.NoError(t, err)
	prod, err := rocketmq.NewProducer(producer.WithNameServer(addrs), producer.WithGroupName(testsvc.UniqueTable("pg")),
		producer.WithInstanceName(testsvc.UniqueTable("own")))
	require.NoError(t, err)
	require.NoError(t, prod.Start())
	t.Cleanup(func() { _ = prod.Shutdown() })

	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{Producer: prod, Topic: topic})
	require.NoError(t, err)
	ids := b.insert(t, 2)
	p := newPublisher(t, b.store, sender, fastConfig("own", &logSink{}))
	_, err = p.PublishPending(context.Background())
	require.NoError(t, err)
	require.NoError(t, sender.Close())

	// Close left the caller's producer running.
	_, err = prod.SendSync(context.Background(), primitive.NewMessage(topic, []byte("after close")))
	require.NoError(t, err)
	consumer.WaitDistinct(t, 3, time.Minute) // two events, and the message without an eventId
	got := consumer.Deliveries()
	for _, id := range ids {
		assert.Equal(t, 1, got[b.get(t, id).EventID])
	}
}

// A send with no route to any broker (the name server does not answer) fails within the send
// timeout as a transient error: the event goes back to WAIT with backoff, not to FAIL. The
// client's own complaints reach the sender's logger, not stderr.
func TestRocketMQNoRouteIsTransient(t *testing.T) {
	t.Parallel()
	testsvc.RocketMQNameServer(t)
	b := setup(t)
	id := b.insert(t, 1)[0]
	clientLogs := &logSink{}
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{"127.0.0.1:1"}, // nothing listens there
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: 300 * time.Millisecond,
		Logger:      slog.New(clientLogs),
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sender.Close() })
	p := newPublisher(t, b.store, sender, fastConfig("p", &logSink{}))
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 1, stats.Retried)
	got := b.get(t, id)
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Equal(t, 1, got.RetryCount)
	assert.Contains(t, got.LastError, "route")
	assert.NotEmpty(t, clientLogs.atLeast(slog.LevelDebug), "the client's logs were routed to the sender's logger")
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
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{Producer: fp, Topic: "T", MaxBatchBytes: 1 << 20})
	require.NoError(t, err)
	evs := make([]outbox.Event, 5)
	for i := range evs {
		evs[i] = outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("event-%d", i+1), BizNo: "ORD", EventType: "E", Payload: make([]byte, 400<<10)}
	}
	errs := s.SendBatch(context.Background(), evs)
	assert.Equal(t, []error{nil, nil, nil, nil, nil}, errs)
	assert.Equal(t, []int{2, 2, 1}, fp.calls, "400 KiB events, 1 MiB batches")
	for i, m := range fp.msgs {
		assert.Equal(t, fmt.Sprintf("event-%d", i+1), m.GetProperty(outbox.PropertyEventID), "order kept")
	}
}

// A batch the broker refuses as illegal is sent again one by one, so that only the illegal
// event is dead-lettered; a transient error fails the whole batch, to be retried.
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
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{Producer: fp, Topic: "T"})
	require.NoError(t, err)
	evs := []outbox.Event{
		{ID: 1, EventID: "event-1", BizNo: "A", EventType: "E"},
		{ID: 2, EventID: "event-2", BizNo: "B", EventType: "E"},
		{ID: 3, EventID: "event-3", BizNo: "C", EventType: "E"},
	}
	errs := s.SendBatch(context.Background(), evs)
	require.Len(t, errs, 3)
	assert.NoError(t, errs[0])
	assert.True(t, outbox.IsPermanent(errs[1]))
	assert.NoError(t, errs[2])
	assert.Equal(t, []int{3, 1, 1, 1}, fp.calls)

	fp = &fakeProducer{err: errors.New("CODE: 14, DESC: service not available now")}
	s, err = outbox.NewRocketMQSender(outbox.RocketMQConfig{Producer: fp, Topic: "T"})
	require.NoError(t, err)
	errs = s.SendBatch(context.Background(), evs)
	for _, err := range errs {
		require.ErrorContains(t, err, "CODE: 14")
		assert.False(t, outbox.IsPermanent(err))
	}
	assert.Equal(t, []int{3}, fp.calls, "transient: no one-by-one resend")
}

func TestRocketMQSendOutcomes(t *testing.T) {
	t.Parallel()
	const eventID = "01960b3e-8f1c-7a2b-9c3d-4e5f60718293"
	ev := outbox.Event{ID: 7, EventID: eventID, BizNo: "ORD-7", EventType: "ORDER_PAID", Payload: []byte("{}")}
	cases := []struct {
		name      string
		res       *primitive.SendResult
		err       error
		wantErr   string
		permanent bool
	}{
		{"SendOK", &primitive.SendResult{Status: primitive.SendOK}, nil, "", false},
		{"FlushDiskTimeout", &primitive.SendResult{Status: primitive.SendFlushDiskTimeout}, nil, "FLUSH_DISK_TIMEOUT", false},
		{"SlaveNotAvailable", &primitive.SendResult{Status: primitive.SendSlaveNotAvailable}, nil, "SLAVE_NOT_AVAILABLE", false},
		{"MessageIllegal", nil, errors.New("CODE: 13, DESC: the message body size over max value, MAX: 4194304"), "CODE: 13", true},
		{"MessageIllegalTyped", nil, primitive.MQBrokerErr{ResponseCode: 13, ErrorMessage: "illegal"}, "CODE: 13", true},
		{"BrokerBusy", nil, errors.New("CODE: 2, DESC: [TIMEOUT_CLEAN_QUEUE]broker busy"), "broker busy", false},
		{"ServiceNotAvailable", nil, errors.New("CODE: 14, DESC: service not available now"), "CODE: 14", false},
		{"NoRoute", nil, errors.New("the topic=T route info not found"), "route info not found", false},
		{"Timeout", nil, context.DeadlineExceeded, "deadline exceeded", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fp := &fakeProducer{res: c.res, err: c.err}
			s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{Producer: fp, Topic: "T"})
			require.NoError(t, err)
			err = s.Send(context.Background(), ev)
			if c.wantErr == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, c.wantErr)
			}
			assert.Equal(t, c.permanent, outbox.IsPermanent(err))
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

// The broker stops mid-run: sends fail, rows go back to WAIT with backoff (none is
// dead-lettered); once the broker is back every event arrives, none lost. Not parallel: it
// stops the broker the other tests use.
func TestRocketMQBrokerOutageLosesNothing(t *testing.T) {
	const before, during = 100, 100
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_OUTAGE")
	consumer := testsvc.Consume(t, topic)
	ids := b.insert(t, before)

	logs := &logSink{}
	cfg := fastConfig("order-outage", logs)
	cfg.PollInterval = 20 * time.Millisecond
	cfg.Backoff = outbox.ConstantBackoff(300 * time.Millisecond)
	cfg.MaxRetry = 10_000 // an outage must not dead-letter anything
	p := newPublisher(t, b.store, newRocketMQSender(t, topic, nil), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	consumer.WaitDistinct(t, before, time.Minute)
	testsvc.StopBroker(t)
	ids = append(ids, b.insert(t, during)...)

	var retried int
	require.Eventually(t, func() bool {
		require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+b.store.Table()+"` WHERE status = 'WAIT' AND retry_count > 0").Scan(&retried))
		return retried == during
	}, time.Minute, 100*time.Millisecond, "every event written during the outage fails and waits for its retry")
	var lastErr string
	require.NoError(t, b.db.QueryRow("SELECT last_error FROM `"+b.store.Table()+"` WHERE retry_count > 0 LIMIT 1").Scan(&lastErr))
	t.Logf("during the outage: %d events back in WAIT, e.g. %q", retried, lastErr)
	assert.Zero(t, b.countStatus(t, outbox.StatusFail))
	assert.Positive(t, logs.count(slog.LevelWarn, "will retry"))

	outage := time.Now()
	testsvc.StartBroker(t)
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == before+during },
		3*time.Minute, 100*time.Millisecond)
	consumer.WaitDistinct(t, before+during, 2*time.Minute)
	t.Logf("all %d events delivered %s after the broker was started again", before+during, time.Since(outage).Round(time.Millisecond))

	got, eventIDs := consumer.Deliveries(), b.eventIDs(t)
	dups := 0
	for _, id := range ids {
		n := got[eventIDs[id]]
		assert.Positive(t, n, "event %d lost", id)
		dups += max(n-1, 0)
	}
	t.Logf("duplicate deliveries across the outage: %d", dups)
}
