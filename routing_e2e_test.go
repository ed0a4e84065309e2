package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// sendLog is a Sender that passes every call on to a real sender and records, in the order
// the publisher handed them over, the events that sender accepted.
type sendLog struct {
	outbox.Sender
	mu   sync.Mutex
	sent []outbox.Event
}

func (l *sendLog) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	errs := l.Sender.Send(ctx, evs, keyOrder)
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, err := range errs {
		if err == nil {
			l.sent = append(l.sent, evs[i])
		}
	}
	return errs
}

func (l *sendLog) events() []outbox.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]outbox.Event(nil), l.sent...)
}

// Routing, key order and delays together, from the table to the broker: events written
// with a topic of the store's set (by InsertEvent and by a plain SQL INSERT), routed by
// their type, or left to the default, each reach their topic once; a topic outside the set
// is refused at insert, writing nothing; a biz no's events go out in the order they were
// written, across topics, and a delayed one holds back its key's later events whatever
// their topic, and is not sent before it is due.
func TestRoutingWithKeyOrderAndDelaysEndToEnd(t *testing.T) {
	t.Parallel()
	def, orders, payments := testsvc.NewTopic(t, "OUTBOX_E2E_DEF"), testsvc.NewTopic(t, "OUTBOX_E2E_ORD"), testsvc.NewTopic(t, "OUTBOX_E2E_PAY")
	consumers := map[string]*testsvc.Consumer{}
	for _, topic := range []string{def, orders, payments} {
		consumers[topic] = testsvc.Consume(t, topic)
	}
	db := testsvc.OpenDB(t)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{Ordering: outbox.KeyOrder, Routes: outbox.Routes{Topic: def,
		Topics: []string{orders, payments}, ByType: map[string]string{"PAYMENT_DONE": payments}}})}
	h := newHandoffs()
	sender := &sendLog{Sender: plainSender(t, producer.WithInterceptor(h.interceptor))}
	ctx := context.Background()

	// A typo is refused at insert, naming the known topics, and the transaction goes on.
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "ORD-X", EventType: "ORDER_PAID", Payload: []byte(`{}`), Topic: orders + "_TYPO"})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	assert.ErrorContains(t, err, orders)
	assert.ErrorContains(t, err, payments)
	require.NoError(t, tx.Commit())
	assert.Zero(t, b.countStatus(t, outbox.StatusWait), "the refused event wrote nothing")

	const orderCount = 12
	const delay = 3 * time.Second
	want := map[string]string{}    // event id -> topic
	order := map[string][]string{} // biz no -> its event ids in id order
	var delayedIDs []int64
	for o := range orderCount {
		bizNo := fmt.Sprintf("ORD-%02d", o)
		inputs := []outbox.EventInput{
			{BizNo: bizNo, EventType: "ORDER_CREATED"},                // the default topic
			{BizNo: bizNo, EventType: "ORDER_PAID", Topic: orders},    // its own
			{BizNo: bizNo, EventType: "PAYMENT_DONE"},                 // by its type
			{BizNo: bizNo, EventType: "ORDER_SHIPPED", Topic: orders}, // its own again
		}
		wantTopics := []string{def, orders, payments, orders}
		if o%3 == 0 {
			// A delayed event in the middle: it holds back the key's later events.
			inputs[1].Delay = delay
		}
		for i, in := range inputs {
			in.Payload = fmt.Appendf(nil, `{"order":%q,"step":%d}`, bizNo, i)
			id := b.insertInput(t, in)
			if in.Delay > 0 {
				delayedIDs = append(delayedIDs, id)
			}
			eventID := b.get(t, id).EventID
			want[eventID] = wantTopics[i]
			order[bizNo] = append(order[bizNo], eventID)
		}
	}
	// Another program's plain INSERT names a topic of the set.
	_, err = b.db.ExecContext(ctx, fmt.Sprintf("INSERT INTO %s (biz_no, event_type, payload, topic) VALUES ('ORD-SQL', 'REFUND', '{}', ?)", "`"+outbox.TableForTest(b.store)+"`"), payments)
	require.NoError(t, err)
	var plainID string
	require.NoError(t, b.db.QueryRowContext(ctx, fmt.Sprintf("SELECT event_id FROM %s WHERE biz_no = 'ORD-SQL'", "`"+outbox.TableForTest(b.store)+"`")).Scan(&plainID))
	want[plainID] = payments

	cfg := fastConfig("e2e", &logSink{})
	cfg.Tuning.SendTimeout, cfg.Tuning.Lease = 0, 2*time.Minute // the sender's own, and a lease ten times that
	p := newPublisher(t, b.store, sender, cfg)
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { assert.NoError(t, p.Close()) })

	counts := map[string]int{}
	for _, topic := range want {
		counts[topic]++
	}
	for topic, c := range consumers {
		c.WaitDistinct(t, counts[topic], 2*time.Minute)
	}
	for topic, c := range consumers {
		for _, m := range c.Messages() {
			id := m.GetProperty(outbox.PropertyEventID)
			assert.Equal(t, want[id], topic, "event %s arrived in topic %s", id, topic)
		}
		for id, n := range c.Deliveries() {
			assert.Equal(t, 1, n, "event %s arrived once", id)
		}
	}

	// The order of the sends: by id within each biz no, across its topics, at the wire: none
	// handed to the broker before the biz no's earlier one was stored.
	assert.Empty(t, h.inversions(order), "a biz no's event handed over before its earlier one was stored")
	last := map[string]int64{}
	for _, ev := range sender.events() {
		assert.Greater(t, ev.ID, last[ev.BizNo], "%s's event %d (topic %q) was sent after a later one", ev.BizNo, ev.ID, ev.Topic)
		last[ev.BizNo] = max(last[ev.BizNo], ev.ID)
	}
	// A delayed event was claimed no earlier than its due time, by the database clock.
	for _, id := range delayedIDs {
		ev := b.get(t, id)
		require.Equal(t, outbox.StatusSuccess, ev.Status)
		assert.False(t, ev.ClaimedAt.Before(ev.CreateTime.Add(delay)), "event %d claimed at %v, due %v", id, ev.ClaimedAt, ev.CreateTime.Add(delay))
	}
}
