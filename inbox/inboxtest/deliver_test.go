package inboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/inbox/inboxtest"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// points is a consumer's effect: a table of points awarded per order, with no unique key,
// so that an effect done twice shows as two rows.
type points struct {
	db    *sql.DB
	table string
	calls atomic.Int64
	fail  func(msg *inbox.Message) error // the handler's error after its effect, if not nil
}

func newPoints(t *testing.T, db *sql.DB) *points {
	t.Helper()
	p := &points{db: db, table: testsvc.UniqueTable("t_points")}
	_, err := db.ExecContext(t.Context(), "CREATE TABLE `"+p.table+"` (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+p.table+"`")
		assert.NoError(t, err)
	})
	return p
}

func (p *points) handle(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
	p.calls.Add(1)
	if _, err := tx.ExecContext(ctx, "INSERT INTO `"+p.table+"` (order_no) VALUES (?)", msg.BizNo); err != nil {
		return err
	}
	if p.fail != nil {
		return p.fail(msg)
	}
	return nil
}

func (p *points) of(t *testing.T, orderNo string) int {
	t.Helper()
	var n int
	require.NoError(t, p.db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM `"+p.table+"` WHERE order_no = ?", orderNo).Scan(&n))
	return n
}

func event(orderNo string) outbox.Event {
	return outbox.Event{EventID: uuid.Must(uuid.NewV7()).String(), BizNo: orderNo, EventType: "ORDER_CREATED", Topic: inboxtest.DefaultTopic, Payload: []byte(`{}`)}
}

// Handled once; the same message delivered again, and the event sent again, are duplicates
// the inbox suppresses: the effect happened once.
func TestDeliverHandlesOnceAndSuppressesDuplicates(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	in, p := newInbox(t, db, inbox.Config{}), newPoints(t, db)
	ev := event("ORD-1")
	msg := inboxtest.Message(ev)

	d := inboxtest.Deliver(t.Context(), in, p.handle, msg)
	require.NoError(t, d.Err)
	assert.Equal(t, inbox.Handled, d.Outcome)
	assert.Equal(t, 1, d.Message.Deliveries)
	d = inboxtest.Deliver(t.Context(), in, p.handle, inboxtest.Redelivery(msg))
	assert.Equal(t, inbox.Duplicate, d.Outcome)
	d = inboxtest.Deliver(t.Context(), in, p.handle, inboxtest.Message(ev))
	assert.Equal(t, inbox.Duplicate, d.Outcome, "the event sent again: another message, the same event id")
	assert.Equal(t, 1, p.of(t, "ORD-1"))
	assert.Equal(t, int64(1), p.calls.Load())
}

// A handler that fails is delivered again until it succeeds; one that always fails is
// rejected at MaxDeliveries, and one that refuses with Permanent at once. Its effects roll
// back every time.
func TestDeliverRetriesAndRejects(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	in, p := newInbox(t, db, inbox.Config{MaxDeliveries: 3}), newPoints(t, db)
	errFlaky := errors.New("flaky")
	p.fail = func(msg *inbox.Message) error {
		switch {
		case msg.BizNo == "ORD-FLAKY" && msg.Deliveries < 3:
			return errFlaky
		case msg.BizNo == "ORD-BAD":
			return errFlaky
		case msg.BizNo == "ORD-REFUSED":
			return outbox.Permanent(errors.New("no such customer"))
		case msg.BizNo == "ORD-DOWN":
			return outbox.Unavailable(errors.New("the points service is down"))
		}
		return nil
	}

	d := inboxtest.Deliver(t.Context(), in, p.handle, inboxtest.Message(event("ORD-FLAKY")))
	assert.Equal(t, inbox.Handled, d.Outcome)
	assert.Equal(t, 3, d.Message.Deliveries, "failed twice, handled at the third delivery")
	assert.Equal(t, 1, p.of(t, "ORD-FLAKY"), "the failed deliveries' effects rolled back")

	bad := event("ORD-BAD")
	d = inboxtest.Deliver(t.Context(), in, p.handle, inboxtest.Message(bad))
	assert.Equal(t, inbox.Rejected, d.Outcome)
	assert.NoError(t, d.Err)
	assert.Equal(t, 3, d.Message.Deliveries, "rejected at MaxDeliveries")
	rejected, err := in.RejectedByEventID(t.Context(), bad.EventID)
	require.NoError(t, err)
	assert.Equal(t, "ORD-BAD", rejected.Message.BizNo)

	d = inboxtest.Deliver(t.Context(), in, p.handle, inboxtest.Message(event("ORD-REFUSED")))
	assert.Equal(t, inbox.Rejected, d.Outcome)
	assert.Equal(t, 1, d.Message.Deliveries)

	d = inboxtest.Deliver(t.Context(), in, p.handle, inboxtest.Message(event("ORD-DOWN")))
	assert.Equal(t, inbox.Failed, d.Outcome, "a fault is never rejected: Deliver gives up")
	assert.True(t, outbox.IsUnavailable(d.Err))
	assert.Equal(t, inboxtest.MaxDeliveries, d.Message.Deliveries)
	for _, no := range []string{"ORD-BAD", "ORD-REFUSED", "ORD-DOWN"} {
		assert.Zero(t, p.of(t, no))
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	d = inboxtest.Deliver(ctx, in, p.handle, inboxtest.Message(event("ORD-LATE")))
	assert.Equal(t, inbox.Failed, d.Outcome)
	assert.ErrorIs(t, d.Err, context.Canceled)
	assert.Equal(t, 1, d.Message.Deliveries, "no redelivery once ctx is done")
	ds, err := inboxtest.DeliverAll(ctx, in, p.handle, []outbox.Event{event("ORD-LATE")})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, ds)
}

// The whole path in one process: the service's transaction, a real publisher over a real
// MySQLStore, a sender that loses an answer (so the event is sent twice), and the
// consumer's handler through a real inbox: the effect happens once.
func TestDeliverAllEndToEnd(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{})
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.LoseAnswer(1, func(ev outbox.Event) bool { return ev.BizNo == "ORD-2" })
	pub, err := outbox.NewPublisher(store, faulty, outbox.Config{PollInterval: 10 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 }, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, pub.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, pub.Close()) })

	for _, no := range []string{"ORD-1", "ORD-2", "ORD-3"} {
		tx, err := store.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		_, err = tx.InsertEvent(t.Context(), outbox.EventInput{BizNo: no, EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	evs, err := sent.WaitFor(ctx, 4)
	require.NoError(t, err)

	in, p := newInbox(t, db, inbox.Config{}), newPoints(t, db)
	ds, err := inboxtest.DeliverAll(ctx, in, p.handle, evs)
	require.NoError(t, err)
	require.Len(t, ds, 4)
	assert.Equal(t, 3, inboxtest.Count(ds, inbox.Handled))
	assert.Equal(t, 1, inboxtest.Count(ds, inbox.Duplicate))
	for i, d := range ds {
		assert.Equal(t, evs[i].EventID, d.Event.EventID)
		assert.Equal(t, evs[i].EventID, d.Message.EventID)
	}
	for _, no := range []string{"ORD-1", "ORD-2", "ORD-3"} {
		assert.Equal(t, 1, p.of(t, no), "one award for %s", no)
	}
}

// Many goroutines deliver the same events at once, as consumers of one group would, under
// -race: each effect happens once.
func TestDeliverAllConcurrently(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	in, p := newInbox(t, db, inbox.Config{}), newPoints(t, db)
	var evs []outbox.Event
	for i := range 20 {
		evs = append(evs, event(fmt.Sprintf("ORD-%d", i)))
	}
	var wg sync.WaitGroup
	handled := make([]int, 4)
	for g := range handled {
		wg.Go(func() {
			ds, err := inboxtest.DeliverAll(t.Context(), in, p.handle, evs)
			assert.NoError(t, err)
			handled[g] = inboxtest.Count(ds, inbox.Handled)
			assert.Equal(t, len(evs), inboxtest.Count(ds, inbox.Handled)+inboxtest.Count(ds, inbox.Duplicate))
		})
	}
	wg.Wait()
	assert.Equal(t, len(evs), handled[0]+handled[1]+handled[2]+handled[3])
	for i := range evs {
		assert.Equal(t, 1, p.of(t, fmt.Sprintf("ORD-%d", i)))
	}
}

// A nil inbox is a failure naming it, not a panic.
func TestDeliverNilInbox(t *testing.T) {
	t.Parallel()
	d := inboxtest.Deliver(t.Context(), nil, func(context.Context, *sql.Tx, *inbox.Message) error { return nil }, inboxtest.Message(event("ORD-1")))
	assert.Equal(t, inbox.Failed, d.Outcome)
	assert.ErrorIs(t, d.Err, outbox.ErrInvalidConfig)
}

// A Consumer delivers what the publisher sends as it is sent: the service's transactions,
// a real publisher over a real MySQLStore through a sender that loses an answer, and the
// handler through a real inbox; each effect happens once.
func TestConsumeAsSent(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{})
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.LoseAnswer(1, func(ev outbox.Event) bool { return ev.BizNo == "ORD-2" })
	pub, err := outbox.NewPublisher(store, faulty, outbox.Config{PollInterval: 10 * time.Millisecond,
		Backoff: func(int) time.Duration { return 0 }, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, pub.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, pub.Close()) })
	in, p := newInbox(t, db, inbox.Config{}), newPoints(t, db)
	c := inboxtest.Consume(in, p.handle, sent)
	defer c.Close()

	for _, no := range []string{"ORD-1", "ORD-2", "ORD-3"} {
		tx, err := store.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		_, err = tx.InsertEvent(t.Context(), outbox.EventInput{BizNo: no, EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ds, err := c.WaitFor(ctx, 4)
	require.NoError(t, err)
	assert.Equal(t, 3, inboxtest.Count(ds, inbox.Handled))
	assert.Equal(t, 1, inboxtest.Count(ds, inbox.Duplicate))
	for i, ev := range sent.Events() {
		assert.Equal(t, ev.EventID, ds[i].Event.EventID, "delivered in the order sent")
	}
	for _, no := range []string{"ORD-1", "ORD-2", "ORD-3"} {
		assert.Equal(t, 1, p.of(t, no))
	}
	assert.Len(t, c.Close(), 4)
	assert.Len(t, c.Close(), 4, "Close again")

	short, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = c.WaitFor(short, 5)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "waited for 5 deliveries, 4 done")
}

// Close with a handler in progress cancels it: its transaction rolls back, and the
// delivery is left out.
func TestConsumeCloseCancelsAHandlerInProgress(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	in, p := newInbox(t, db, inbox.Config{}), newPoints(t, db)
	sent := outboxtest.NewMemorySender()
	entered := make(chan struct{})
	h := func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO `"+p.table+"` (order_no) VALUES (?)", msg.BizNo); err != nil {
			return err
		}
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	c := inboxtest.Consume(in, h, sent)
	require.Equal(t, []error{nil}, sent.Send(t.Context(), []outbox.Event{event("ORD-1")}, false))
	<-entered
	assert.Empty(t, c.Close(), "the cancelled delivery is left out")
	assert.Zero(t, p.of(t, "ORD-1"), "its effect rolled back")
}
