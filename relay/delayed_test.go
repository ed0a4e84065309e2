package relay_test

import (
	"context"
	"database/sql"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// clockedSender is a sender that records, for each event's first send, the database's
// clock when the send began: to check by that clock that nothing was sent before it was due.
type clockedSender struct {
	outbox.Sender
	db *sql.DB

	mu sync.Mutex
	at map[string]time.Time // eventId -> the database's UTC clock at its first send
}

func (s *clockedSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	var now time.Time
	if err := s.db.QueryRowContext(ctx, "SELECT UTC_TIMESTAMP(3)").Scan(&now); err == nil {
		s.mu.Lock()
		for _, ev := range evs {
			if _, ok := s.at[ev.EventID]; !ok {
				s.at[ev.EventID] = now
			}
		}
		s.mu.Unlock()
	}
	return s.Sender.Send(ctx, evs, keyOrder)
}

// sentAt is when the event was first sent, by the database clock.
func (s *clockedSender) sentAt(eventID string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.at[eventID]
	return at, ok
}

// insertDelayed commits one transaction of events (biz no, delay) and returns their event
// ids in order.
func (e *env) insertDelayed(t *testing.T, evs ...outbox.EventInput) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := e.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	var ids []string
	for _, in := range evs {
		if in.EventType == "" {
			in.EventType, in.Payload = "ORDER_EXPIRED", []byte(in.BizNo)
		}
		id, err := tx.InsertEvent(ctx, in)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.NoError(t, tx.Commit())
	return ids
}

// sentWhenDue checks that every event of ids is SUCCESS, sent by the relay no earlier than
// it was due (by the database clock), and returns them by event id.
func (e *env) sentWhenDue(t *testing.T, s *clockedSender, ids []string) map[string]outbox.Event {
	t.Helper()
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	evs, err := outbox.NewAdmin(e.store).List(context.Background(), outbox.Filter{Limit: 100})
	require.NoError(t, err)
	out := map[string]outbox.Event{}
	for _, le := range evs {
		out[le.EventID] = le.Event
	}
	for _, id := range ids {
		ev, ok := out[id]
		require.True(t, ok, "event %s in the table", id)
		at, sent := s.sentAt(id)
		require.True(t, sent, "event %s sent", id)
		assert.False(t, at.Before(ev.NextRetryTime), "event %s sent at %s, due at %s", id, at, ev.NextRetryTime)
		assert.Equal(t, "relay-1", ev.ClaimOwner)
	}
	return out
}

// Rows inserted with a delay reach the relay through the binlog as inserts that are not due
// yet (next_retry_time after create_time): it reads them again from the table when they
// are due, and sends them then. Delayed 4 s, 0 s and 2 s in one transaction, and 1 s in
// another, they arrive in the order of their delays, once each, none sent early.
func TestRelaySendsDelayedEventsWhenDue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-delay")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	sender := &clockedSender{Sender: rocketSender(t), db: e.db, at: map[string]time.Time{}}
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)

	ids := e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-4", Delay: 4 * time.Second}, outbox.EventInput{BizNo: "ORD-0"},
		outbox.EventInput{BizNo: "ORD-2", Delay: 2 * time.Second})
	ids = append(ids, e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-1", Delay: time.Second})...)
	delayOf := map[string]int{ids[0]: 4, ids[1]: 0, ids[2]: 2, ids[3]: 1}
	c.WaitDistinct(t, len(ids), 60*time.Second)
	e.sentWhenDue(t, sender, ids)

	var arrived []int
	seen := map[string]bool{}
	for _, m := range c.Messages() {
		if id := m.GetProperty("eventId"); !seen[id] {
			seen[id] = true
			arrived = append(arrived, delayOf[id])
		}
	}
	assert.True(t, slices.IsSorted(arrived), "first arrivals in the order of their delays: %v", arrived)
	for id, n := range c.Deliveries() {
		assert.Equal(t, 1, n, "event %s", id)
	}
}

// In key order, a row inserted not due yet holds back the later events of its biz no,
// those of its own transaction and of later ones alike: they stay WAIT until it is due,
// then go after it, in order. Another biz no goes meanwhile.
func TestRelayDelayedEventHoldsBackItsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.KeyOrder)
	topic := testsvc.NewTopic(t, "relay-delay-key")
	e.routeTo(t, topic)
	c := testsvc.ConsumeOrderly(t, topic)
	sender := &clockedSender{Sender: rocketSender(t), db: e.db, at: map[string]time.Time{}}
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)

	ids := e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-K", Delay: 3 * time.Second}, outbox.EventInput{BizNo: "ORD-K"},
		outbox.EventInput{BizNo: "ORD-L"})
	ids = append(ids, e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-K"})...)
	rank := map[string]int64{}
	for i, id := range ids {
		rank[id] = int64(i)
	}
	c.WaitDistinct(t, len(ids), 60*time.Second)
	evs := e.sentWhenDue(t, sender, ids)

	assert.Empty(t, c.Inversions(func(id string) int64 { return rank[id] }), "each biz no in order")
	arrivals := c.Arrivals()
	require.NotEmpty(t, arrivals["ORD-K"])
	require.Len(t, arrivals["ORD-L"], 1)
	assert.Equal(t, ids[0], arrivals["ORD-K"][0].EventID, "the delayed event first of its key")
	head := evs[ids[0]]
	for _, id := range []string{ids[1], ids[3]} {
		at, _ := sender.sentAt(id)
		assert.False(t, at.Before(head.NextRetryTime), "event %s sent at %s, before its key's delayed head was due at %s", id, at, head.NextRetryTime)
	}
	at, _ := sender.sentAt(ids[2])
	assert.True(t, at.Before(head.NextRetryTime), "the other key sent at %s, while ORD-K waited until %s", at, head.NextRetryTime)
}

// gateSender holds the first send that carries an event of its biz no until open is closed,
// and counts the sends of each event id.
type gateSender struct {
	outbox.Sender
	key        string
	held, open chan struct{}
	once       sync.Once

	mu    sync.Mutex
	sends map[string]int
}

func (s *gateSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	for _, ev := range evs {
		if ev.BizNo == s.key {
			first := false
			s.once.Do(func() { first = true })
			if first {
				close(s.held)
				select {
				case <-s.open:
				case <-ctx.Done():
				}
			}
			break
		}
	}
	errs := s.Sender.Send(ctx, evs, keyOrder)
	s.mu.Lock()
	for i, ev := range evs {
		if errs[i] == nil {
			s.sends[ev.EventID]++
		}
	}
	s.mu.Unlock()
	return errs
}

func (s *gateSender) sent(eventID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sends[eventID]
}

// In key order, a delayed row that is due by the time the relay reads it from the table
// sends its key's waiting events with it, read from the table; a later event of the key
// whose transaction the binlog hands over after that read is one of them, and is not sent a
// second time when its insert comes from the binlog.
func TestRelayResumedKeySendsEachEventOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.KeyOrder)
	topic := testsvc.NewTopic(t, "relay-resume-once")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	gate := &gateSender{Sender: rocketSender(t), key: "ORD-G", held: make(chan struct{}), open: make(chan struct{}),
		sends: map[string]int{}}
	r, _ := start(t, e.dsn, gate, e.config("relay-1"))
	waitLeader(t, r)

	// One transaction: an event the sender holds, and a delayed event of ORD-K that is due
	// before the sender lets the batch go on.
	ids := e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-G"}, outbox.EventInput{BizNo: "ORD-K", Delay: time.Millisecond})
	select {
	case <-gate.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay never sent the held event")
	}
	// While the batch waits on the sender: a later event of ORD-K, committed.
	ids = append(ids, e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-K"})...)
	waitFor(t, 10*time.Second, "the delayed event due", func() bool {
		var due int
		require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE biz_no = 'ORD-K' AND next_retry_time <= UTC_TIMESTAMP(3)").Scan(&due))
		return due == 2
	})
	close(gate.open)
	// Items are delivered in commit order: once a later transaction's event is sent and
	// marked, every send of the earlier ones is done.
	ids = append(ids, e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-Z"})...)
	waitFor(t, 30*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	c.WaitDistinct(t, len(ids), 60*time.Second)
	for _, id := range ids {
		assert.Equal(t, 1, gate.sent(id), "sends of event %s", id)
	}
}

// A row due at the latest time the table holds (NotBefore 9999-12-31 23:59:59.999 UTC) is
// due further ahead than a time.Duration reaches: the relay holds it, and sends what comes
// after it.
func TestRelayHoldsAnEventDueAtTheLastTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-delay-far")
	e.routeTo(t, topic)
	sender := &clockedSender{Sender: rocketSender(t), db: e.db, at: map[string]time.Time{}}
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)

	last := time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC)
	far := e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-FAR", NotBefore: last})
	// Items are delivered in commit order, a batch's rows read from the table after its
	// inserts: once an event committed after the first later one was marked is marked
	// too, the relay has read the far one and sent whatever it would send.
	now := e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-NOW"})
	sentKey := func(key string) func() bool {
		return func() bool {
			var n int
			require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE biz_no = ? AND status = 'SUCCESS'", key).Scan(&n))
			return n == 1
		}
	}
	waitFor(t, 30*time.Second, "the later event SUCCESS", sentKey("ORD-NOW"))
	now = append(now, e.insertDelayed(t, outbox.EventInput{BizNo: "ORD-NEXT"})...)
	waitFor(t, 30*time.Second, "the next event SUCCESS", sentKey("ORD-NEXT"))
	for _, id := range now {
		_, sent := sender.sentAt(id)
		assert.True(t, sent, "event %s sent", id)
	}
	_, sent := sender.sentAt(far[0])
	assert.False(t, sent, "the event due in 9999 sent")
	assert.Equal(t, map[string]int{"SUCCESS": 2, "WAIT": 1}, e.statuses(t))
}
