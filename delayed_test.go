package outbox_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// Delayed events (EventInput.Delay and NotBefore, docs/delayed-events.md): their due time by
// the database clock, their bad input, their claims in every mode, their latency, and the
// faults they live through, on the real database and broker.

// lastDue is the latest time next_retry_time, a DATETIME(3), holds.
var lastDue = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)

// insertInput commits one event through the library and returns its row id.
func (b *bundle) insertInput(t testing.TB, in outbox.EventInput) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, in)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return id
}

// delayed is an event of bizNo due d after its insert.
func delayed(bizNo string, d time.Duration) outbox.EventInput {
	return outbox.EventInput{BizNo: bizNo, EventType: "ORDER_EXPIRED", Payload: fmt.Appendf(nil, `{"order":%q}`, bizNo), Delay: d}
}

// dbNow is the database's UTC clock.
func (b *bundle) dbNow(t testing.TB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, b.db.QueryRow("SELECT UTC_TIMESTAMP(3)").Scan(&now))
	return now.UTC()
}

// A negative delay, a delay with a time, and a time past what next_retry_time holds (once
// rounded up to its millisecond, in any time zone) are refused, each saying why, and write
// nothing. The limits are written: the longest time.Duration (about 292 years: no delay
// can pass the column) and the column's last millisecond.
func TestInsertEventRefusesABadDueTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cases := []struct {
		name   string
		mutate func(*outbox.EventInput)
		want   string
	}{
		{"NegativeDelay", func(e *outbox.EventInput) { e.Delay = -time.Second }, "Delay is negative (-1s)"},
		{"NegativeNanosecond", func(e *outbox.EventInput) { e.Delay = -1 }, "Delay is negative (-1ns)"},
		{"DelayAndNotBefore", func(e *outbox.EventInput) { e.Delay, e.NotBefore = time.Minute, time.Now().Add(time.Hour) },
			"both Delay (1m0s) and NotBefore"},
		{"NotBeforePastTheColumn", func(e *outbox.EventInput) { e.NotBefore = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
			"NotBefore 10000-01-01T00:00:00Z is later than 9999-12-31 23:59:59.999 UTC, the latest time next_retry_time (DATETIME(3)) holds"},
		{"NotBeforeRoundsPastTheColumn", func(e *outbox.EventInput) { e.NotBefore = lastDue.Add(time.Microsecond) },
			"NotBefore 9999-12-31T23:59:59.999001Z is later than 9999-12-31 23:59:59.999 UTC"},
		{"NotBeforePastTheColumnInUTC", func(e *outbox.EventInput) {
			e.NotBefore = time.Date(9999, 12, 31, 23, 30, 0, 0, time.FixedZone("UTC-1", -3600))
		}, "NotBefore 10000-01-01T00:30:00Z is later"},
	}
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := delayed("ORD-1", 0)
			c.mutate(&in)
			_, err := tx.InsertEvent(ctx, in)
			require.ErrorIs(t, err, outbox.ErrInvalidEvent)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	var n int
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"`").Scan(&n))
	require.Zero(t, n, "a refused event writes nothing")

	longest, err := outbox.InsertForTest(ctx, tx, delayed("ORD-2", math.MaxInt64))
	require.NoError(t, err)
	last := delayed("ORD-3", 0)
	last.NotBefore = lastDue
	atLast, err := outbox.InsertForTest(ctx, tx, last)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	var us int64
	require.NoError(t, b.db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, create_time, next_retry_time) FROM `"+
		outbox.TableForTest(b.store)+"` WHERE id = ?", longest).Scan(&us))
	assert.Equal(t, int64(math.MaxInt64/int64(time.Millisecond)+1)*1000, us, "the longest delay, rounded up to the millisecond")
	assert.Equal(t, lastDue, b.get(t, atLast).NextRetryTime.UTC(), "the column's last millisecond")
}

// The due time is the database clock's: a delay is added to the insert's UTC_TIMESTAMP(3),
// rounded up to the millisecond; a NotBefore in any zone is that instant in UTC, rounded up;
// one that the database clock has passed, however long ago, is due at the insert.
func TestInsertEventDueTimeIsByTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	at := b.dbNow(t).Add(time.Hour).Add(500 * time.Microsecond).In(time.FixedZone("UTC+5:30", 5*3600+1800))
	cases := []struct {
		name      string
		delay     time.Duration
		notBefore time.Time
		want      time.Duration // next_retry_time - create_time
		wantAt    time.Time     // or next_retry_time itself
	}{
		{name: "None"},
		{name: "Delay", delay: 1500 * time.Millisecond, want: 1500 * time.Millisecond},
		{name: "Nanosecond", delay: 1, want: time.Millisecond},
		{name: "JustOverAMillisecond", delay: 1001 * time.Microsecond, want: 2 * time.Millisecond},
		{name: "Hours", delay: 30 * time.Hour, want: 30 * time.Hour},
		{name: "NotBeforePassed", notBefore: b.dbNow(t).Add(-time.Hour)},
		{name: "NotBeforeLongPassed", notBefore: time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC)},
		{name: "NotBeforeInAnotherZone", notBefore: at, wantAt: at.UTC().Truncate(time.Millisecond).Add(time.Millisecond)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in := delayed("ORD-"+c.name, c.delay)
			in.NotBefore = c.notBefore
			ev := b.get(t, b.insertInput(t, in))
			assert.Equal(t, outbox.StatusWait, ev.Status)
			if !c.wantAt.IsZero() {
				assert.Equal(t, c.wantAt, ev.NextRetryTime.UTC())
				return
			}
			assert.Equal(t, c.want, ev.NextRetryTime.Sub(ev.CreateTime))
		})
	}
}

// claimOnce is one claim of a store in this run's claim mode: per row, the candidates and a
// claim of each; in batches, ClaimDue.
func claimOnce(t *testing.T, store outbox.Store, owner string) []int64 {
	t.Helper()
	ctx := context.Background()
	var ids []int64
	if testPerRow {
		cands, err := store.Candidates(ctx, 100)
		require.NoError(t, err)
		for _, ev := range cands {
			ok, err := store.Claim(ctx, ev, owner)
			require.NoError(t, err)
			if ok {
				ids = append(ids, ev.ID)
			}
		}
		return ids
	}
	res, err := store.ClaimDue(ctx, outbox.ClaimRequest{Owner: owner, Limit: 100, MaxBytes: 1 << 20})
	require.NoError(t, err)
	for _, ev := range res.Events {
		ids = append(ids, ev.ID)
	}
	return ids
}

// A delayed event is claimed by no claim before it is due, in either order and either claim
// mode: not in ClaimDue, not among the candidates, not by Claim given the row itself. The
// table's stats count it waiting, not due. Once due, it is claimed.
func TestDelayedEventIsClaimedOnlyOnceDue(t *testing.T) {
	t.Parallel()
	for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testsvc.OpenDB(t)
			b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: o})}
			later := b.insertInput(t, delayed("ORD-LATER", time.Hour))
			now := b.insertInput(t, delayed("ORD-NOW", 0))

			assert.Equal(t, []int64{now}, claimOnce(t, b.store, "p"), "only the event due now")
			cands, err := b.store.Candidates(ctx, 100)
			require.NoError(t, err)
			assert.Empty(t, cands)
			ok, err := b.store.Claim(ctx, b.get(t, later), "p")
			require.NoError(t, err)
			assert.False(t, ok, "a claim of the row itself")
			got := b.get(t, later)
			assert.Equal(t, outbox.StatusWait, got.Status)
			assert.Empty(t, got.ClaimOwner)
			st, err := b.store.Stats(ctx, outbox.StatsOptions{})
			require.NoError(t, err)
			assert.EqualValues(t, 1, st.Wait, "waiting")
			assert.Zero(t, st.Due, "not due")
			assert.Zero(t, st.OldestDueAge)

			b.makeDue(t, later)
			assert.Equal(t, []int64{later}, claimOnce(t, b.store, "p"), "due now")
		})
	}
}

// In key order, an event not yet due holds back the later events of its biz no, as an
// event waiting for a retry does: they are claimed only after it was, in id order. The
// events before it, and other biz nos, go meanwhile.
func TestDelayedEventHoldsBackItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder})}
	k1 := b.insertInput(t, delayed("ORD-K", 0))
	k2 := b.insertInput(t, delayed("ORD-K", time.Hour))
	k3 := b.insertInput(t, delayed("ORD-K", 0))
	l1 := b.insertInput(t, delayed("ORD-L", 0))

	claimAndSend := func() []int64 {
		ids := claimOnce(t, b.store, "p")
		if len(ids) > 0 {
			n, err := b.store.MarkSuccess(ctx, ids, "p")
			require.NoError(t, err)
			require.EqualValues(t, len(ids), n)
		}
		return ids
	}
	first := claimAndSend()
	assert.ElementsMatch(t, []int64{k1, l1}, first, "the event before the delayed one, and another key")
	for range 3 {
		assert.Empty(t, claimAndSend(), "the key waits behind its delayed event")
	}
	ok, err := b.store.Claim(ctx, b.get(t, k3), "p")
	require.NoError(t, err)
	assert.False(t, ok, "a claim of the later event itself")

	b.makeDue(t, k2)
	var order []int64
	for range 4 {
		order = append(order, claimAndSend()...)
	}
	assert.Equal(t, []int64{k2, k3}, order, "once due, the delayed event, then the rest of its key")
}

// A delayed event's commit-to-send latency counts from its due time: an event written an
// hour ago with an hour's delay, due now, is not an hour late, while an event committed an
// hour ago and due then is.
func TestDelayedEventLatencyCountsFromItsDueTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	waited := b.insertInput(t, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_EXPIRED", Payload: []byte("{}"), Delay: time.Hour})
	// As written an hour ago with its delay: create_time = update_time, next_retry_time an
	// hour later, which is now.
	b.exec(t, "UPDATE {t} SET create_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), update_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), "+
		"next_retry_time = UTC_TIMESTAMP(3) WHERE id = ?", waited)
	late := b.insertInput(t, outbox.EventInput{BizNo: "ORD-2", EventType: "ORDER_CREATED", Payload: []byte("{}")})
	b.exec(t, "UPDATE {t} SET create_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), update_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR), "+
		"next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", late)

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	cfg := fastConfig("delay-metrics", &logSink{})
	cfg.MeterProvider = provider
	p := newPublisher(t, b.store, newRecorder(), cfg)
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, stats.Sent)

	c := collect(t, reader)
	assert.Equal(t, map[string]uint64{"event_type=ORDER_EXPIRED,topic=ORDER_EVENT_TOPIC": 1, "event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC": 1}, c.counts["outbox.commit_to_send.duration"])
	assert.Less(t, c.maxima["outbox.commit_to_send.duration"]["event_type=ORDER_EXPIRED,topic=ORDER_EVENT_TOPIC"], 600.0, "from its due time")
	assert.GreaterOrEqual(t, c.maxima["outbox.commit_to_send.duration"]["event_type=ORDER_CREATED,topic=ORDER_EVENT_TOPIC"], 3600.0, "from its commit")
}

// sentWhenDue checks what a delayed run ended with: every event of delays SUCCESS, claimed
// no earlier than it was due (both by the database clock; the claim's time stays in the
// row), due as long after its insert as it was delayed, and arrived at the consumer; with
// inOrder, first arriving in ascending order of their delays.
func sentWhenDue(t *testing.T, b *bundle, consumer *testsvc.Consumer, delays map[int64]time.Duration, inOrder bool) {
	t.Helper()
	rowOf := map[string]int64{}
	for id, eventID := range b.eventIDs(t) {
		rowOf[eventID] = id
	}
	var arrived []time.Duration
	seen := map[int64]bool{}
	for _, m := range consumer.Messages() {
		id := rowOf[m.GetProperty("eventId")]
		if d, ok := delays[id]; ok && !seen[id] {
			seen[id] = true
			arrived = append(arrived, d)
		}
	}
	assert.Len(t, arrived, len(delays), "every delayed event arrived")
	if inOrder {
		assert.True(t, slices.IsSorted(arrived), "first arrivals in the order of their delays: %v", arrived)
	}
	for id, d := range delays {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusSuccess, ev.Status, "event %d", id)
		assert.Equal(t, d, ev.NextRetryTime.Sub(ev.CreateTime), "event %d due %s after its insert", id, d)
		assert.False(t, ev.ClaimedAt.Before(ev.NextRetryTime), "event %d claimed at %s, due at %s", id, ev.ClaimedAt, ev.NextRetryTime)
	}
}

// Events delayed 5 s, 0 s and 2 s, written in that order in one transaction, arrive at a
// real consumer once each, in the order of their delays, none claimed before its time.
func TestRocketMQDelayedEventsArriveInDueOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_DELAY")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	delays := map[int64]time.Duration{}
	for i, d := range []time.Duration{5 * time.Second, 0, 2 * time.Second} {
		id, err := outbox.InsertForTest(ctx, tx, delayed(fmt.Sprintf("ORD-%d", i), d))
		require.NoError(t, err)
		delays[id] = d
	}
	require.NoError(t, tx.Commit())

	runCtx, cancel := context.WithCancel(ctx)
	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("delay-1", &logSink{}))
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	consumer.WaitDistinct(t, len(delays), time.Minute)
	cancel()
	wg.Wait()
	sentWhenDue(t, b, consumer, delays, true)
	for eventID, n := range consumer.Deliveries() {
		assert.Equal(t, 1, n, "event %s delivered once", eventID)
	}
}

// In key order on the real broker, a biz no's event delayed 3 s holds back its later
// events, which arrive after it and in order at an orderly consumer; another biz no goes
// meanwhile.
func TestRocketMQDelayedEventHoldsBackItsKey(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder})}
	topic := testsvc.NewTopic(t, "OUTBOX_DELAY_KEY")
	b.routeTo(topic)
	consumer := testsvc.ConsumeOrderly(t, topic)
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	var ids []int64
	for _, in := range []outbox.EventInput{delayed("ORD-K", 3*time.Second), delayed("ORD-K", 0), delayed("ORD-K", 0),
		delayed("ORD-L", 0), delayed("ORD-L", 0)} {
		id, err := outbox.InsertForTest(ctx, tx, in)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.NoError(t, tx.Commit())

	runCtx, cancel := context.WithCancel(ctx)
	p := newPublisher(t, b.store, newKeyOrderRocketMQSender(t, topic, time.Second), fastConfig("delay-key", &logSink{}))
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	consumer.WaitDistinct(t, len(ids), time.Minute)
	cancel()
	wg.Wait()

	rowOf := map[string]int64{}
	for id, eventID := range b.eventIDs(t) {
		rowOf[eventID] = id
	}
	assert.Empty(t, consumer.Inversions(func(eventID string) int64 { return rowOf[eventID] }), "each biz no in order")
	arrivals := consumer.Arrivals()
	require.NotEmpty(t, arrivals["ORD-K"])
	require.NotEmpty(t, arrivals["ORD-L"])
	assert.Equal(t, ids[0], rowOf[arrivals["ORD-K"][0].EventID], "the delayed event first of its key")
	// By the database clock (the claim's time stays in the row): the key's later events
	// were claimed only once its head was due, the other key's before.
	head := b.get(t, ids[0])
	for _, id := range ids[1:3] {
		assert.False(t, b.get(t, id).ClaimedAt.Before(head.NextRetryTime), "event %d claimed only once its key's head was due", id)
	}
	for _, id := range ids[3:] {
		assert.True(t, b.get(t, id).ClaimedAt.Before(head.NextRetryTime), "event %d of the other key claimed while ORD-K waited", id)
	}
}

// The broker unreachable while delayed events come due: each send fails as unavailable and
// the event goes back to WAIT with no retry counted, none is dead-lettered; once the broker
// answers (a publisher with a sender that reaches it), every event arrives.
func TestRocketMQDelayedEventsWaitOutABrokerOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_DELAY_DOWN")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	delays := map[int64]time.Duration{}
	for i, d := range []time.Duration{time.Second, 1500 * time.Millisecond} {
		delays[b.insertInput(t, delayed(fmt.Sprintf("ORD-%d", i), d))] = d
	}

	down, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers: []string{"127.0.0.1:1"}, // nothing listens there: no route to any broker
		GroupName:   testsvc.UniqueTable("pg"),
		SendTimeout: 300 * time.Millisecond,
	})
	require.NoError(t, err)
	logs := &logSink{}
	cfg := fastConfig("delay-down", logs)
	cfg.Tuning.SendTimeout = 0 // the sender's
	p := newPublisher(t, b.store, down, cfg)
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	var tried int
	require.Eventually(t, func() bool {
		require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+
			"` WHERE last_error LIKE 'broker unavailable%'").Scan(&tried))
		return tried > 0
	}, time.Minute, 20*time.Millisecond, "a due event was tried while the broker was unreachable")
	cancel()
	wg.Wait()
	require.NoError(t, down.Close())
	for id := range delays {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, ev.Status, "event %d waits for the broker", id)
		assert.Zero(t, ev.RetryCount, "no retry spent on an outage")
	}
	assert.Zero(t, b.countStatus(t, outbox.StatusFail))
	assert.Positive(t, logs.count(slog.LevelError, "outbox: broker unavailable"), "the outage was logged")

	runCtx, cancel = context.WithCancel(context.Background())
	p = newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("delay-up", &logSink{}))
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	consumer.WaitDistinct(t, len(delays), time.Minute)
	cancel()
	wg.Wait()
	for id, d := range delays {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusSuccess, ev.Status, "event %d", id)
		assert.Equal(t, "delay-up", ev.ClaimOwner)
		assert.False(t, ev.ClaimedAt.Before(ev.CreateTime.Add(d)), "event %d claimed no earlier than due", id)
	}
}

// The database crashes (SIGKILL) while delayed events wait, and stays down past their due
// time under a running publisher. Once it is back, the same publisher sends them: each due
// as written (the crash lost nothing committed), none claimed early. (Both are due by then,
// and may go in one batch: their arrival order is not asserted.)
func TestRocketMQDelayedEventsOutliveADatabaseCrash(t *testing.T) {
	t.Parallel()
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{})}
	topic := testsvc.NewTopic(t, "OUTBOX_DELAY_DB")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	delays := map[int64]time.Duration{}
	for i, d := range []time.Duration{3 * time.Second, 2 * time.Second} {
		id, err := outbox.InsertForTest(ctx, tx, delayed(fmt.Sprintf("ORD-%d", i), d))
		require.NoError(t, err)
		delays[id] = d
	}
	require.NoError(t, tx.Commit())

	logs := &logSink{}
	runCtx, cancel := context.WithCancel(ctx)
	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("delay-db", logs))
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	srv.Kill(t)
	time.Sleep(4 * time.Second) // down past both due times; the publisher keeps trying
	srv.Start(t)
	consumer.WaitDistinct(t, len(delays), 2*time.Minute)
	cancel()
	wg.Wait()
	assert.Positive(t, claimFailuresLogged(logs), "the publisher logged the failed claims")
	sentWhenDue(t, b, consumer, delays, false)
}

// A publisher process on the real broker is SIGKILLed while it holds nothing: it has sent
// what was due, and the delayed events wait (due 10 to 12 s after their insert, well after
// the kill). They stay as they were (WAIT, never claimed),
// and another publisher sends every one once it is due, none twice and none early.
func TestRocketMQPublisherKilledHoldingNothingLosesNoDelayedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_DELAY_KILL")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	due := b.insert(t, 2)
	delays := map[int64]time.Duration{}
	for i, d := range []time.Duration{12 * time.Second, 10 * time.Second, 11 * time.Second} {
		delays[b.insertInput(t, delayed(fmt.Sprintf("ORD-LATER-%d", i), d))] = d
	}

	child := childCmd(t, "rocketmq", "proc-delay", outbox.TableForTest(b.store))
	child.Env = append(child.Env, "OUTBOX_CHILD_TOPIC="+topic, "OUTBOX_CHILD_NAMESRV="+testsvc.RocketMQNameServer(t))
	stdout, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the publisher process never got ready")
	require.Equal(t, "READY 0\n", line)
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(due) }, time.Minute, 10*time.Millisecond,
		"the publisher process sends the events due at once")
	require.NoError(t, child.Process.Signal(syscall.SIGKILL))
	werr := child.Wait()
	var exitErr *exec.ExitError
	require.ErrorAs(t, werr, &exitErr)
	require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())
	for id := range delays {
		ev := b.get(t, id)
		require.Equal(t, outbox.StatusWait, ev.Status, "event %d as it was", id)
		require.Empty(t, ev.ClaimOwner, "event %d never claimed", id)
		require.Positive(t, b.secondsFromNow(t, id, "next_retry_time"), "event %d not yet due when its publisher died", id)
	}

	runCtx, cancel := context.WithCancel(context.Background())
	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("delay-after", &logSink{}))
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	consumer.WaitDistinct(t, len(due)+len(delays), time.Minute)
	cancel()
	wg.Wait()
	sentWhenDue(t, b, consumer, delays, true)
	for eventID, n := range consumer.Deliveries() {
		assert.Equal(t, 1, n, "event %s delivered once", eventID)
	}
	for id := range delays {
		assert.Equal(t, "delay-after", b.get(t, id).ClaimOwner)
	}
}

// A commit of delayed events wakes this process's publishers when they are due: with a poll
// interval of an hour, events delayed half a second and a second are sent, each once due,
// with no other commit to wake the publisher.
func TestDelayedEventWakesThePublisherWhenDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := newRecorder()
	cfg := fastConfig("delay-wake", &logSink{})
	cfg.PollInterval = time.Hour
	p := newPublisher(t, b.store, rec, cfg)
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, p.Run(runCtx)) })
	defer func() { cancel(); wg.Wait() }()

	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	first, err := outbox.InsertForTest(ctx, tx, delayed("ORD-1", 500*time.Millisecond))
	require.NoError(t, err)
	second, err := outbox.InsertForTest(ctx, tx, delayed("ORD-2", time.Second))
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Eventually(t, func() bool { return rec.count(first) == 1 && rec.count(second) == 1 }, 30*time.Second, 10*time.Millisecond,
		"both sent long before the next poll")
	for _, id := range []int64{first, second} {
		ev := b.get(t, id)
		assert.False(t, ev.ClaimedAt.Before(ev.NextRetryTime), "event %d claimed at %s, due at %s", id, ev.ClaimedAt, ev.NextRetryTime)
	}
}

// Any delay and any instant, through the real database: refused exactly when the
// documentation says (a negative delay, both given, an instant past the column once rounded
// up), writing nothing then; otherwise due as documented, by the database clock: the delay
// rounded up to the millisecond after the insert, or the later of the insert and the
// instant rounded up.
func FuzzInsertEventDueTime(f *testing.F) {
	db := testsvc.NewDatabase(f)
	b := &bundle{db: db, store: testsvc.NewStore(f, db, outbox.MySQLConfig{})}
	for _, s := range []struct {
		delay     int64
		useNB     bool
		sec, nsec int64
	}{
		{0, false, 0, 0},
		{-1, false, 0, 0},
		{int64(1500 * time.Millisecond), false, 0, 0},
		{1, false, 0, 0},
		{math.MaxInt64, false, 0, 0},
		{0, true, time.Now().Add(time.Hour).Unix(), 123456789},
		{0, true, lastDue.Unix(), 999000000},
		{0, true, lastDue.Unix(), 999000001},
		{0, true, -62135596800, 0}, // the zero time: not given
		{0, true, -62135596800, 1},
		{0, true, 0, 0},
		{int64(time.Second), true, time.Now().Unix(), 0},
	} {
		f.Add(s.delay, s.useNB, s.sec, s.nsec)
	}
	f.Fuzz(func(t *testing.T, delay int64, useNB bool, sec, nsec int64) {
		in := delayed("ORD-FUZZ", time.Duration(delay))
		if useNB {
			in.NotBefore = time.Unix(sec%400_000_000_000, nsec%2_000_000_000) // years within about ±12,000
		}
		ceil := func(t time.Time) time.Time {
			if r := t.Truncate(time.Millisecond); r.Before(t) {
				return r.Add(time.Millisecond)
			}
			return t
		}
		ctx := context.Background()
		tx, err := b.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		count := func() (n int) {
			require.NoError(t, tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"`").Scan(&n))
			return n
		}
		before := count()
		id, insertErr := outbox.InsertForTest(ctx, tx, in)
		written := count() - before
		require.NoError(t, tx.Commit())

		nb := !in.NotBefore.IsZero()
		if in.Delay < 0 || (in.Delay > 0 && nb) || (nb && ceil(in.NotBefore.UTC()).After(lastDue)) {
			require.ErrorIs(t, insertErr, outbox.ErrInvalidEvent, "delay %s, not before %s", in.Delay, in.NotBefore)
			assert.Zero(t, written, "nothing written")
			return
		}
		require.NoError(t, insertErr, "delay %s, not before %s", in.Delay, in.NotBefore)
		assert.Equal(t, 1, written)
		ev := b.get(t, id)
		switch {
		case in.Delay > 0:
			wantUS := int64(in.Delay/time.Millisecond) * 1000 // in µs: the delay rounded up to the millisecond
			if in.Delay%time.Millisecond != 0 {
				wantUS += 1000
			}
			var us int64
			require.NoError(t, b.db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, create_time, next_retry_time) FROM `"+
				outbox.TableForTest(b.store)+"` WHERE id = ?", id).Scan(&us))
			assert.Equal(t, wantUS, us, "delay %s", in.Delay)
		case nb && ceil(in.NotBefore.UTC()).After(ev.CreateTime):
			assert.Equal(t, ceil(in.NotBefore.UTC()), ev.NextRetryTime.UTC(), "not before %s", in.NotBefore)
		default:
			assert.Equal(t, ev.CreateTime, ev.NextRetryTime, "due at the insert")
		}
	})
}
