package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// A topic on two brokers of one cluster, broker-a and broker-b. broker-b is killed (SIGKILL:
// no shutdown, nothing unregistered) while a publisher with the default sender and a short
// poll interval sends a steady stream. The client's own retry moves each send that picks one
// of broker-b's queues to broker-a, so sends go on: nothing is dead-lettered, and every event
// arrives at a real consumer (those broker-b stored before it died once it is back). The
// longest pause between successive successful sends is logged, not asserted. Meanwhile a
// topic on broker-b alone is Unavailable, and sends to it work again once broker-b is back.
// Not parallel: it kills broker-b.
func TestRocketMQClusterSurvivesABroker(t *testing.T) {
	testsvc.RocketMQBrokerB(t)
	b := setup(t)
	topic := testsvc.NewClusterTopic(t, "OUTBOX_CLUSTER")
	b.routeTo(topic)
	onlyB := testsvc.NewTopicOnBrokerB(t, "OUTBOX_ONLY_B")
	consumer := testsvc.Consume(t, topic)

	clientLogs := &logSink{}
	sender := &watchedSender{RocketMQSender: newRocketMQSender(t, clientLogs)}
	onlyBSender := newRocketMQSender(t, nil)
	cfg := outbox.Config{
		InstanceID:   "cluster",
		PollInterval: 20 * time.Millisecond,
		Logger:       slog.New(&logSink{}),
		Tuning:       outbox.Tuning{ClaimPerRow: testPerRow},
	}
	p := newPublisher(t, b.store, sender, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The stream: two events every 20 ms, each committed on its own.
	var written atomic.Int64
	stopWriting := make(chan struct{})
	var writer sync.WaitGroup
	writer.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopWriting:
				return
			case <-tick.C:
			}
			for range 2 {
				tx, err := b.store.BeginTx(ctx, nil)
				if !assert.NoError(t, err) {
					return
				}
				n := written.Add(1)
				_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", n), EventType: "ORDER_CREATED",
					Payload: fmt.Appendf(nil, `{"order":%d}`, n)})
				if !assert.NoError(t, err) || !assert.NoError(t, tx.Commit()) {
					return
				}
			}
		}
	})
	streamStart := time.Now()
	defer func() {
		select {
		case <-stopWriting:
		default:
			close(stopWriting)
		}
		writer.Wait()
	}()

	require.Eventually(t, func() bool { return len(consumer.StoreHosts()) >= 2 }, time.Minute, 100*time.Millisecond,
		"both brokers store events before the crash")
	// The sender of the topic on broker-b alone has its route, as a running one would
	// (without one it would fall back to the template route for auto-created topics, and
	// this broker-a creates topics on first use).
	ev := outbox.Event{ID: 1, EventID: "only-b", BizNo: "ORD-B", EventType: "ORDER_CREATED", Payload: []byte(`{"order":"b"}`), Topic: onlyB}
	require.NoError(t, sendAlone(ctx, onlyBSender, ev))

	testsvc.KillBrokerB(t)
	killed := time.Now()
	t.Logf("broker-b killed after %s of the stream, %d events written", killed.Sub(streamStart).Round(time.Millisecond), written.Load())

	start := time.Now()
	err := sendAlone(ctx, onlyBSender, ev)
	t.Logf("topic on broker-b alone, broker-b down: error after %s: %v", time.Since(start).Round(time.Millisecond), err)
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "a dead broker is Unavailable: %v", err)

	// Past the client's 30 s route refresh, which drops broker-b from the route.
	time.Sleep(40 * time.Second)
	close(stopWriting)
	writer.Wait()
	streamEnd := time.Now()
	total := int(written.Load())
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == total }, 2*time.Minute, 100*time.Millisecond,
		"every event of the stream is sent")
	assert.Zero(t, b.countStatus(t, outbox.StatusFail), "nothing dead-lettered")

	before, _ := sender.longestPause(streamStart, killed)
	pause, at := sender.longestPause(killed, streamEnd)
	t.Logf("longest pause between successful sends: %s before the crash, %s after it (beginning %s after the kill)",
		before.Round(time.Millisecond), pause.Round(time.Millisecond), at.Sub(killed).Round(time.Millisecond))
	fails := sender.failures(killed)
	t.Logf("%d events in %s; sends the client moved to another broker: %d; failed sends reaching the publisher: %d",
		total, streamEnd.Sub(streamStart).Round(time.Millisecond), clientLogs.count(slog.LevelWarn, "start retrying to send"), len(fails))
	for _, f := range fails {
		t.Logf("  failed send %s after the kill: %v", f.at.Sub(killed).Round(time.Millisecond), f.err)
	}

	testsvc.StartBrokerB(t)
	restarted := time.Now()
	require.Eventually(t, func() bool { return sendAlone(ctx, onlyBSender, ev) == nil }, 2*time.Minute, 200*time.Millisecond,
		"the topic on broker-b alone works again")
	t.Logf("topic on broker-b alone: first send %s after broker-b registered again", time.Since(restarted).Round(time.Millisecond))

	consumer.WaitDistinct(t, total, 3*time.Minute)
	t.Logf("all %d events consumed %s after broker-b registered again", total, time.Since(restarted).Round(time.Millisecond))
	byBizNo := map[string]int{}
	for _, m := range consumer.Messages() {
		byBizNo[m.GetProperty(outbox.PropertyBizNo)]++
	}
	dups := 0
	for n := 1; n <= total; n++ {
		got := byBizNo["ORD-"+strconv.Itoa(n)]
		assert.Positive(t, got, "event ORD-%d lost", n)
		dups += max(got-1, 0)
	}
	t.Logf("duplicate deliveries: %d", dups)
}

// In key order, a broker of two away (SIGKILLed, so its queues stay in the route) for
// longer than the whole retry schedule (MaxAttempts 3, 200 ms apart) spends no attempt and
// dead-letters nothing: the sends to its queues fail as unavailable, the publisher pauses
// and probes, and once the broker is back every event is sent, each biz no in order at an
// orderly consumer. Not parallel: it kills broker-b.
func TestKeyOrderSurvivesABrokerAwayLongerThanItsRetries(t *testing.T) {
	testsvc.RocketMQBrokerB(t)
	db := testsvc.OpenDB(t)
	topic, brokers := testsvc.NewTopicOnEveryBroker(t, "OUTBOX_KEY_AWAY")
	require.Equal(t, 2, brokers, "the topic is on both brokers")
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder, Routes: outbox.Routes{Topic: topic}})}
	consumer := testsvc.ConsumeOrderly(t, topic)
	logs := &logSink{}
	cfg := outbox.Config{
		InstanceID: "key-away", PollInterval: 20 * time.Millisecond, Logger: slog.New(logs),
		MaxAttempts: 3, Backoff: func(int) time.Duration { return 200 * time.Millisecond },
		Tuning: outbox.Tuning{ClaimPerRow: testPerRow, MaxProbeDelay: time.Second},
	}
	p := newPublisher(t, b.store, newRocketMQSender(t, nil), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()

	const keys, per = 30, 6
	rank := map[string]int64{} // event id -> its place in its biz no
	insertStep := func(step int) {
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		for k := range keys {
			id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", k), EventType: fmt.Sprintf("STEP_%d", step),
				Payload: fmt.Appendf(nil, `{"key":%d,"step":%d}`, k, step)})
			require.NoError(t, err)
			rank[id] = int64(step + 1)
		}
		require.NoError(t, tx.Commit())
	}
	insertStep(0)
	consumer.WaitDistinct(t, keys, time.Minute)
	testsvc.KillBrokerB(t)
	killed := time.Now()
	for step := 1; step < per; step++ {
		insertStep(step)
		time.Sleep(2 * time.Second)
	}
	// Away far longer than the retries, and past the client's 30 s route refresh, which
	// drops broker-b from the route: its keys must wait for it, not move to broker-a.
	time.Sleep(max(0, 40*time.Second-time.Since(killed)))
	assert.Zero(t, b.countStatus(t, outbox.StatusFail), "nothing dead-lettered while the broker is away")
	assert.Positive(t, b.countStatus(t, outbox.StatusWait), "the away broker's keys wait")
	t.Logf("broker-b away for %s; sends that found its queues out of the route: %d", time.Since(killed).Round(time.Second),
		logs.mentioning("route info not found"))
	testsvc.StartBrokerB(t)

	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == keys*per }, 3*time.Minute, 100*time.Millisecond,
		"every event sent once the broker is back")
	assert.Zero(t, b.countStatus(t, outbox.StatusFail))
	var spent int
	require.NoError(t, db.QueryRow("SELECT COALESCE(SUM(retry_count), 0) FROM `"+outbox.TableForTest(b.store)+"`").Scan(&spent))
	if !assert.Zero(t, spent, "no attempt spent on the broker's absence") {
		for _, m := range logs.atLeast(slog.LevelWarn) {
			t.Log(m)
		}
	}
	consumer.WaitDistinct(t, keys*per, 3*time.Minute)
	assert.Empty(t, consumer.Inversions(func(eventID string) int64 { return rank[eventID] }), "each biz no in order")
}
