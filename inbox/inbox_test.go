package inbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// fixture is an inbox on tables of the test's own, and an effect table its handler writes.
// The effect table has no unique key, so that an effect done twice shows as two rows.
type fixture struct {
	db      *sql.DB
	in      *inbox.Inbox
	table   string // the inbox table; the rejected one is table + "_rejected"
	effects string
	calls   atomic.Int64 // handler calls
}

func setup(t *testing.T, cfg inbox.Config) *fixture {
	t.Helper()
	return setupOn(t, testsvc.OpenDB(t), cfg)
}

// setupOn makes a fixture on db, creating the tables and dropping them when t ends.
func setupOn(t *testing.T, db *sql.DB, cfg inbox.Config) *fixture {
	t.Helper()
	if cfg.Group == "" {
		cfg.Group = "g_" + randHex(4)
	}
	if cfg.Table == "" {
		cfg.Table = testsvc.UniqueTable("t_inbox")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &fixture{db: db, table: cfg.Table, effects: testsvc.UniqueTable("t_effect")}
	ctx := context.Background()
	var err error
	f.in, err = inbox.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, f.in.CreateSchema(ctx))
	_, err = db.ExecContext(ctx, "CREATE TABLE `"+f.effects+"` (id BIGINT AUTO_INCREMENT PRIMARY KEY, "+
		"grp VARCHAR(255) NOT NULL, event_id VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, table := range []string{f.table, f.table + "_rejected", f.effects} {
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
		}
	})
	return f
}

// other is an inbox of another group, or another instance of the same group on another
// pool, on the fixture's tables.
func (f *fixture) other(t *testing.T, db *sql.DB, group string) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(db, inbox.Config{Group: group, Table: f.table})
	require.NoError(t, err)
	return in
}

// effect is a handler that writes one effect row in tx.
func (f *fixture) effect(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
	f.calls.Add(1)
	_, err := tx.ExecContext(ctx, "INSERT INTO `"+f.effects+"` (grp, event_id) VALUES (?, ?)",
		msg.Properties["group"], msg.EventID)
	return err
}

// failing is a handler that writes its effect and then returns err: the effect must roll back.
func (f *fixture) failing(err error) inbox.Handler {
	return func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		if e := f.effect(ctx, tx, msg); e != nil {
			return e
		}
		return err
	}
}

// effectsOf counts the effect rows of an event.
func (f *fixture) effectsOf(t testing.TB, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow("SELECT COUNT(*) FROM `"+f.effects+"` WHERE event_id = ?", eventID).Scan(&n))
	return n
}

// recorded counts the inbox rows of an event in group.
func (f *fixture) recorded(t testing.TB, group, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, f.db.QueryRow("SELECT COUNT(*) FROM `"+f.table+"` WHERE consumer_group = ? AND event_id = ?",
		group, eventID).Scan(&n))
	return n
}

// count counts the rows of a table.
func count(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+table+"`").Scan(&n))
	return n
}

// rejectedRows is the inbox's rejected messages, all of them.
func rejectedRows(t testing.TB, in *inbox.Inbox) []inbox.RejectedMessage {
	t.Helper()
	rows, err := in.Rejected(context.Background(), 0, 1000)
	require.NoError(t, err)
	return rows
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newMessage is a first delivery of a new event, as the consumer makes it of a RocketMQ
// message the publisher sent.
func newMessage() *inbox.Message {
	return messageFor(uuid.Must(uuid.NewV7()).String())
}

func messageFor(eventID string) *inbox.Message {
	props := map[string]string{
		outbox.PropertyEventType: "ORDER_CREATED",
		outbox.PropertyBizNo:     "订单-1",
		"KEYS":                   "订单-1",
		"TAGS":                   "ORDER_CREATED",
	}
	if eventID != "" {
		props[outbox.PropertyEventID] = eventID
	}
	return &inbox.Message{
		EventID:    eventID,
		EventType:  "ORDER_CREATED",
		BizNo:      "订单-1",
		Body:       []byte(`{"order":"订单-1","amount":10}`),
		Properties: props,
		Topic:      "ORDER_EVENT_TOPIC",
		MsgID:      strings.ToUpper(randHex(16)),
		Deliveries: 1,
		BornAt:     time.Now(),
	}
}

// redelivery is msg delivered once more.
func redelivery(msg *inbox.Message) *inbox.Message {
	m := *msg
	m.Deliveries++
	return &m
}

// eventIDAt is a UUIDv7 whose time is at.
func eventIDAt(at time.Time) string {
	u := uuid.Must(uuid.NewV7())
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		u[i] = byte(ms >> (40 - 8*i))
	}
	return u.String()
}

func TestHandleCommitsEffectWithRecord(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()

	o, err := f.in.Handle(ctx, msg, f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o)
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID), "the effect committed")
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), msg.EventID), "with the inbox record")
	assert.Empty(t, rejectedRows(t, f.in))
}

// An event that another program wrote into the outbox with a plain SQL INSERT carries the
// database's UUID(), a version-1 UUID, as its eventId: the inbox records it and drops its
// redelivery as it does for the UUIDv7 of InsertEvent.
func TestHandleDeduplicatesAVersion1EventID(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := messageFor(uuid.Must(uuid.NewUUID()).String())

	o, err := f.in.Handle(ctx, msg, f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o)
	o, err = f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Duplicate, o)
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID), "one effect")
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), msg.EventID))
	assert.Empty(t, rejectedRows(t, f.in))
}

func TestHandleHandlerErrorRollsBackBoth(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	boom := errors.New("the points service is down")

	o, err := f.in.Handle(ctx, msg, f.failing(boom))
	assert.Equal(t, inbox.Failed, o)
	require.ErrorIs(t, err, boom, "the handler's error is returned")
	assert.Equal(t, 0, f.effectsOf(t, msg.EventID), "the effect rolled back")
	assert.Equal(t, 0, f.recorded(t, f.in.Group(), msg.EventID), "and the record with it")
	assert.Empty(t, rejectedRows(t, f.in), "a failure before the last delivery is not rejected")

	o, err = f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o, "the redelivery handles the event")
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
}

func TestHandleDuplicateSkipsHandler(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()

	o, err := f.in.Handle(ctx, msg, f.effect)
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)

	// A redelivery, a resend (another broker message id), and the same event through
	// another instance of the group on a pool of its own.
	resend := redelivery(msg)
	resend.MsgID = strings.ToUpper(randHex(16))
	second := f.other(t, testsvc.OpenDB(t), f.in.Group())
	for name, d := range map[string]struct {
		in  *inbox.Inbox
		msg *inbox.Message
	}{
		"redelivery":        {f.in, redelivery(msg)},
		"resend":            {f.in, resend},
		"another instance":  {second, redelivery(msg)},
		"another instance2": {second, msg},
	} {
		o, err := d.in.Handle(ctx, d.msg, f.effect)
		require.NoError(t, err, name)
		assert.Equal(t, inbox.Duplicate, o, name)
	}
	assert.EqualValues(t, 1, f.calls.Load(), "the handler ran for the first delivery only")
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), msg.EventID))
}

func TestHandleOtherGroupHandlesAgain(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	mail := f.other(t, f.db, "mail_service")

	for _, in := range []*inbox.Inbox{f.in, mail} {
		m := *msg
		m.Properties = map[string]string{"group": in.Group()}
		o, err := in.Handle(ctx, &m, f.effect)
		require.NoError(t, err)
		assert.Equal(t, inbox.Handled, o, "group %s", in.Group())
	}
	assert.Equal(t, 2, f.effectsOf(t, msg.EventID), "each group has its own effect")
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), msg.EventID))
	assert.Equal(t, 1, f.recorded(t, "mail_service", msg.EventID))

	o, err := mail.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Duplicate, o, "and deduplicates within itself")
}

// waitingInserts counts the sessions waiting in the inbox's INSERT into table.
func waitingInserts(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?",
		"INSERT INTO `"+table+"` (consumer_group%").Scan(&n))
	return n
}

// N deliveries of one event at once (a rebalance hands a queue to a second consumer while
// the first still handles its messages): the first records the event and runs the handler;
// the others wait on its row lock, and find the row once it commits.
func TestHandleConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	const n = 8
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h := func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		err := f.effect(ctx, tx, m)
		once.Do(func() { close(entered) })
		<-release
		return err
	}
	outcomes := make(chan inbox.Outcome, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			o, err := f.in.Handle(ctx, redelivery(msg), h)
			assert.NoError(t, err)
			outcomes <- o
		})
	}
	<-entered
	// Every other delivery is in the INSERT, waiting on the first one's row lock.
	require.Eventually(t, func() bool { return waitingInserts(t, f.db, f.table) == n-1 }, 30*time.Second, 20*time.Millisecond)
	close(release)
	wg.Wait()
	close(outcomes)
	got := map[inbox.Outcome]int{}
	for o := range outcomes {
		got[o]++
	}
	assert.Equal(t, map[inbox.Outcome]int{inbox.Handled: 1, inbox.Duplicate: n - 1}, got)
	assert.EqualValues(t, 1, f.calls.Load(), "the handler ran once")
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID), "one effect")
}

// The same, with the first delivery's handler failing: the record goes with its rollback,
// a waiting delivery takes its place (or fails, a deadlock victim, and comes again), and
// once every failed delivery has come again the effect has happened exactly once.
func TestHandleConcurrentDeliveriesFirstFails(t *testing.T) {
	t.Parallel()
	const n = 6
	f := setup(t, inbox.Config{MaxDeliveries: outbox.RetryForever})
	ctx := context.Background()
	msg := newMessage()
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	boom := errors.New("first delivery fails")
	h := func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		if err := f.effect(ctx, tx, m); err != nil {
			return err
		}
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release
			return boom
		}
		return nil
	}
	var handled atomic.Int64
	deliver := func(m *inbox.Message) {
		for ; ; m = redelivery(m) {
			o, err := f.in.Handle(ctx, m, h)
			if o == inbox.Handled {
				handled.Add(1)
			}
			if o != inbox.Failed {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			if m.Deliveries > 20 {
				t.Errorf("delivery %d still failing: %v", m.Deliveries, err)
				return
			}
		}
	}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { deliver(msg) })
	}
	<-entered
	require.Eventually(t, func() bool { return waitingInserts(t, f.db, f.table) == n-1 }, 30*time.Second, 20*time.Millisecond)
	close(release)
	wg.Wait()
	assert.EqualValues(t, 1, handled.Load(), "one delivery handled the event")
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID), "one effect")
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), msg.EventID))
}

func TestHandlePanicIsFailed(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	o, err := f.in.Handle(ctx, msg, func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		if err := f.effect(ctx, tx, m); err != nil {
			return err
		}
		panic("nil map in the points service")
	})
	assert.Equal(t, inbox.Failed, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nil map in the points service")
	assert.Equal(t, 0, f.effectsOf(t, msg.EventID), "nothing committed")
	assert.Equal(t, 0, f.recorded(t, f.in.Group(), msg.EventID))

	o, err = f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o, "the redelivery handles it")
}

func TestHandlePermanentIsRejected(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	// The reason and the properties are not ASCII: the handler's own words about the order.
	refusal := outbox.Permanent(errors.New("订单 订单-1 不存在"))

	o, err := f.in.Handle(ctx, msg, f.failing(refusal))
	require.NoError(t, err, "a rejected message is acknowledged")
	assert.Equal(t, inbox.Rejected, o)
	assert.Equal(t, 0, f.effectsOf(t, msg.EventID), "the handler's effect rolled back")
	assert.Equal(t, 0, f.recorded(t, f.in.Group(), msg.EventID), "and the event is not recorded as handled")

	rows := rejectedRows(t, f.in)
	require.Len(t, rows, 1)
	r := rows[0]
	assert.Equal(t, msg.EventID, r.Key)
	assert.Equal(t, "permanent", r.ReasonClass)
	assert.Contains(t, r.Reason, "订单 订单-1 不存在")
	assert.Equal(t, msg.Properties, r.Message.Properties, "the properties are stored")
	assert.Equal(t, msg.Body, r.Message.Body, "the body is stored")
	assert.Equal(t, msg.EventID, r.Message.EventID)
	assert.Equal(t, msg.MsgID, r.Message.MsgID)
	assert.Equal(t, msg.Topic, r.Message.Topic)
	assert.Equal(t, "ORDER_CREATED", r.Message.EventType)
	assert.Equal(t, "订单-1", r.Message.BizNo)
	assert.Equal(t, 1, r.Message.Deliveries)
	assert.WithinDuration(t, time.Now(), r.FirstAt, time.Minute)
	assert.Equal(t, r.FirstAt, r.LastAt)

	// The event resent (the same event id), refused again: the row counts a delivery more
	// and keeps the latest reason.
	again := messageFor(msg.EventID) // another broker message, delivered for the first time
	again.Deliveries = 1
	o, err = f.in.Handle(ctx, again, f.failing(outbox.Permanent(errors.New("still no such order"))))
	require.NoError(t, err)
	assert.Equal(t, inbox.Rejected, o)
	rows = rejectedRows(t, f.in)
	require.Len(t, rows, 1, "one row per event")
	assert.Equal(t, r.ID, rows[0].ID)
	assert.Equal(t, 2, rows[0].Message.Deliveries, "a delivery more")
	assert.Contains(t, rows[0].Reason, "still no such order")
	assert.False(t, rows[0].LastAt.Before(r.LastAt))
}

func TestHandleMaxDeliveries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	boom := errors.New("the points service is down")
	for _, tc := range []struct {
		name string
		max  int // Config.MaxDeliveries
		last int // the delivery that is rejected
	}{
		{"default", 0, 5},
		{"three", 3, 3},
		{"one", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t, inbox.Config{MaxDeliveries: tc.max})
			msg := newMessage()
			for d := 1; d < tc.last; d++ {
				msg.Deliveries = d
				o, err := f.in.Handle(ctx, msg, f.failing(boom))
				assert.Equal(t, inbox.Failed, o, "delivery %d", d)
				require.ErrorIs(t, err, boom)
				assert.Empty(t, rejectedRows(t, f.in), "delivery %d", d)
			}
			msg.Deliveries = tc.last
			o, err := f.in.Handle(ctx, msg, f.failing(boom))
			require.NoError(t, err, "the last delivery is acknowledged")
			assert.Equal(t, inbox.Rejected, o)
			rows := rejectedRows(t, f.in)
			require.Len(t, rows, 1)
			assert.Equal(t, "max_deliveries", rows[0].ReasonClass)
			assert.Contains(t, rows[0].Reason, boom.Error(), "the reason says what failed")
			assert.Equal(t, tc.last, rows[0].Message.Deliveries)
			assert.Equal(t, 0, f.effectsOf(t, msg.EventID))
			assert.Equal(t, 0, f.recorded(t, f.in.Group(), msg.EventID))
		})
	}
}

// A failure that is the infrastructure's never counts towards MaxDeliveries: a deadlock, a
// lost connection or an error the handler marks Unavailable, at the last allowed delivery,
// is Failed (delivered again), never Rejected; the message's own failure there is.
func TestHandleFaultsNeverReject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t, inbox.Config{MaxDeliveries: 2})
	for _, fault := range []error{
		outbox.Unavailable(errors.New("the points service's downstream is down")),
		fmt.Errorf("award points: %w", &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}),
		fmt.Errorf("award points: %w", &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}),
		fmt.Errorf("award points: %w", mysql.ErrInvalidConn),
		fmt.Errorf("award points: %w", driver.ErrBadConn),
	} {
		msg := newMessage()
		msg.Deliveries = 7 // past MaxDeliveries
		o, err := f.in.Handle(ctx, msg, f.failing(fault))
		assert.Equal(t, inbox.Failed, o, "%v", fault)
		assert.ErrorIs(t, err, fault)
	}
	assert.Empty(t, rejectedRows(t, f.in), "a fault alone rejects nothing")
	msg := newMessage()
	msg.Deliveries = 2
	o, err := f.in.Handle(ctx, msg, f.failing(errors.New("the payload names no user")))
	require.NoError(t, err)
	assert.Equal(t, inbox.Rejected, o, "the message's own failure is rejected at the last delivery")
}

func TestHandleRetryForeverNeverRejects(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{MaxDeliveries: outbox.RetryForever})
	ctx := context.Background()
	msg := newMessage()
	boom := errors.New("the points service is down")
	for _, d := range []int{1, 5, 16, 1000, math.MaxInt32} {
		msg.Deliveries = d
		o, err := f.in.Handle(ctx, msg, f.failing(boom))
		assert.Equal(t, inbox.Failed, o, "delivery %d", d)
		require.ErrorIs(t, err, boom)
	}
	assert.Empty(t, rejectedRows(t, f.in))
	o, err := f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o)
}

func TestHandleWithoutValidEventIDIsRejected(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	for _, tc := range []struct {
		name, eventID, class string
	}{
		{"none", "", "no_event_id"},
		{"not a UUID", "ORD-1-CREATED", "invalid_event_id"},
		{"a UUID without dashes", strings.ReplaceAll(uuid.NewString(), "-", ""), "invalid_event_id"},
		{"a UUID in braces", "{" + uuid.NewString() + "}", "invalid_event_id"},
		{"36 characters with a quote", "0190a0c0-0000-7000-8000-00000000000'", "invalid_event_id"},
		{"SQL", "x', UTC_TIMESTAMP(3)); DROP TABLE t; --", "invalid_event_id"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := messageFor(tc.eventID)
			var ran bool
			o, err := f.in.Handle(ctx, msg, func(context.Context, *sql.Tx, *inbox.Message) error {
				ran = true
				return nil
			})
			require.NoError(t, err)
			assert.Equal(t, inbox.Rejected, o)
			assert.False(t, ran, "the handler did not run")
			var r *inbox.RejectedMessage
			for _, row := range rejectedRows(t, f.in) {
				if row.Message.MsgID == msg.MsgID {
					r = &row
				}
			}
			require.NotNil(t, r, "the message is in the rejected table")
			assert.Equal(t, tc.class, r.ReasonClass)
			assert.Equal(t, "msgId:"+msg.MsgID, r.Key, "keyed by the broker's message id")
			assert.Equal(t, msg.Body, r.Message.Body)
			assert.Equal(t, msg.Properties, r.Message.Properties)
			assert.Equal(t, tc.eventID, r.Message.EventID, "the event id as the message carried it")

			o, err = f.in.Handle(ctx, redelivery(msg), f.effect)
			require.NoError(t, err)
			assert.Equal(t, inbox.Rejected, o)
			var deliveries int
			require.NoError(t, f.db.QueryRow("SELECT deliveries FROM `"+f.table+"_rejected` WHERE id = ?", r.ID).Scan(&deliveries))
			assert.Equal(t, 2, deliveries, "rejected again: a delivery more on the same row")
		})
	}
	assert.Zero(t, f.calls.Load())
	assert.Zero(t, count(t, f.db, f.table), "nothing recorded as handled")
}

func TestHandleNilHandlerOrMessage(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	o, err := f.in.Handle(ctx, newMessage(), nil)
	assert.Equal(t, inbox.Failed, o)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "handler is nil")

	o, err = f.in.Handle(ctx, nil, f.effect)
	assert.Equal(t, inbox.Failed, o)
	require.ErrorIs(t, err, outbox.ErrInvalidInput)
	assert.Zero(t, f.calls.Load())
	assert.Empty(t, rejectedRows(t, f.in))
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	for _, tc := range []struct {
		name string
		db   *sql.DB
		cfg  inbox.Config
		want string
	}{
		{"nil db", nil, inbox.Config{Group: "g"}, "db is nil"},
		{"empty group", db, inbox.Config{}, "Group is empty"},
		{"group with a space", db, inbox.Config{Group: "points service"}, "Group"},
		{"group with a quote", db, inbox.Config{Group: "g'; DROP TABLE t; --"}, "Group"},
		{"group too long", db, inbox.Config{Group: strings.Repeat("g", 256)}, "Group"},
		{"table with a dash", db, inbox.Config{Group: "g", Table: "t-inbox"}, "Table"},
		{"table with a backtick", db, inbox.Config{Group: "g", Table: "t`inbox"}, "Table"},
		{"table too long", db, inbox.Config{Group: "g", Table: strings.Repeat("t", 56)}, "Table"},
		{"negative MaxDeliveries", db, inbox.Config{Group: "g", MaxDeliveries: -1}, "MaxDeliveries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := inbox.New(tc.db, tc.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), tc.want)
			assert.Nil(t, in)
		})
	}
	for _, cfg := range []inbox.Config{
		{Group: strings.Repeat("g", 255)},
		{Group: "CID_points-service|%RETRY%", Table: "T_" + strings.Repeat("x", 53)},
		{Group: "g", MaxDeliveries: outbox.RetryForever},
		{Group: "g", Table: "1inbox"},
		{Group: "g", Table: "order"},
	} {
		_, err := inbox.New(db, cfg)
		assert.NoError(t, err, "%+v", cfg)
	}
}

func TestCreateSchemaIsIdempotent(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{}) // created once
	ctx := context.Background()
	msg := newMessage()
	_, err := f.in.Handle(ctx, msg, f.effect)
	require.NoError(t, err)
	_, err = f.in.Handle(ctx, messageFor(""), f.effect)
	require.NoError(t, err)

	require.NoError(t, f.in.CreateSchema(ctx), "a second time")
	require.NoError(t, f.other(t, f.db, "other_group").CreateSchema(ctx), "by another group's inbox")
	assert.Equal(t, 1, count(t, f.db, f.table), "the rows are kept")
	assert.Equal(t, 1, count(t, f.db, f.table+"_rejected"))
	o, err := f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Duplicate, o)
}

// A table made by hand, or by an older version, without a column the inbox writes.
func TestCreateSchemaReportsMissingColumn(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name, create, column string
		rejected             bool
	}{
		{"inbox without consumed_at", "CREATE TABLE `%s` (consumer_group VARCHAR(255) NOT NULL, event_id CHAR(36) NOT NULL, " +
			"PRIMARY KEY (consumer_group, event_id))", "consumed_at", false},
		{"inbox without consumer_group", "CREATE TABLE `%s` (event_id CHAR(36) NOT NULL PRIMARY KEY, consumed_at DATETIME(3) NOT NULL)",
			"consumer_group", false},
		{"rejected without reason_class", "CREATE TABLE `%s` (id BIGINT AUTO_INCREMENT PRIMARY KEY, consumer_group VARCHAR(255) NOT NULL, " +
			"msg_key VARCHAR(128) NOT NULL, event_id CHAR(36) NOT NULL, msg_id VARCHAR(128) NOT NULL, topic VARCHAR(255) NOT NULL, " +
			"reason VARCHAR(1024) NOT NULL, properties TEXT NOT NULL, body MEDIUMBLOB NOT NULL, deliveries INT NOT NULL, " +
			"first_rejected DATETIME(3) NOT NULL, last_rejected DATETIME(3) NOT NULL)", "reason_class", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			table := testsvc.UniqueTable("t_inbox")
			t.Cleanup(func() {
				_, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`")
				_, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "_rejected`")
			})
			made := table
			if tc.rejected {
				made = table + "_rejected"
			}
			_, err := db.ExecContext(ctx, fmt.Sprintf(tc.create, made))
			require.NoError(t, err)
			in, err := inbox.New(db, inbox.Config{Group: "g", Table: table})
			require.NoError(t, err)
			err = in.CreateSchema(ctx)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), made+" has no "+tc.column+" column")
			assert.Contains(t, err.Error(), "schema.sql")

			// Handle on that table says so too, rather than the server's bare error.
			o, err := in.Handle(ctx, newMessage(), func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
			if !tc.rejected {
				assert.Equal(t, inbox.Failed, o)
				require.ErrorIs(t, err, outbox.ErrInvalidConfig)
				assert.Contains(t, err.Error(), tc.column)
				assert.Contains(t, err.Error(), "CreateSchema")
				return
			}
			require.NoError(t, err, "the inbox table itself is whole")
			assert.Equal(t, inbox.Handled, o)
			o, err = in.Handle(ctx, messageFor(""), func(context.Context, *sql.Tx, *inbox.Message) error { return nil })
			assert.Equal(t, inbox.Failed, o, "a rejection cannot be recorded")
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), "reason_class")
			assert.Contains(t, err.Error(), "CreateSchema")
		})
	}
}

// Handle on tables that were never created fails (the message comes again) with an error
// that says how to create them.
func TestHandleMissingTableNamesCreateSchema(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	ctx := context.Background()
	table := testsvc.UniqueTable("t_inbox")
	in, err := inbox.New(db, inbox.Config{Group: "g", Table: table, MaxDeliveries: 2})
	require.NoError(t, err)
	h := func(context.Context, *sql.Tx, *inbox.Message) error { return nil }

	msg := newMessage()
	o, err := in.Handle(ctx, msg, h)
	assert.Equal(t, inbox.Failed, o)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), table)
	assert.Contains(t, err.Error(), "CreateSchema")

	// The last delivery cannot be rejected either: the rejected table is missing too.
	msg.Deliveries = 2
	o, err = in.Handle(ctx, msg, h)
	assert.Equal(t, inbox.Failed, o)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "CreateSchema")
	assert.Contains(t, err.Error(), table+"_rejected")

	o, err = in.Handle(ctx, messageFor(""), h)
	assert.Equal(t, inbox.Failed, o, "a message without event id cannot be recorded as rejected")
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "CreateSchema")

	_, err = in.Rejected(ctx, 0, 10)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "CreateSchema")
}

// The duplicate check is the INSERT itself: one statement, on the primary key. EXPLAIN of
// the lookup the INSERT's duplicate check does (the row by (consumer_group, event_id)) shows
// the key.
func TestDuplicateCheckIsOneIndexedStatement(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	// Rows of other events and another group, so that the plan is not a table of one row.
	other := f.other(t, f.db, "other_group")
	for range 50 {
		for _, in := range []*inbox.Inbox{f.in, other} {
			_, err := in.Handle(ctx, newMessage(), f.effect)
			require.NoError(t, err)
		}
	}
	msg := newMessage()
	_, err := f.in.Handle(ctx, msg, f.effect)
	require.NoError(t, err)

	record := inbox.RecordForTest(f.in, msg.EventID)
	assert.True(t, strings.HasPrefix(record, "INSERT INTO `"+f.table+"` "), record)
	assert.NotContains(t, record, "?", "the values are in the text: one statement on the wire")

	// The duplicate path: the INSERT finds the row by the primary key. (MariaDB's EXPLAIN of
	// an INSERT ... VALUES plans no read at all; the lookup its unique check does is this.)
	lookup := "SELECT 1 FROM `" + f.table + "` WHERE consumer_group = '" + f.in.Group() + "' AND event_id = '" + msg.EventID + "'"
	rows, err := f.db.QueryContext(ctx, "EXPLAIN "+lookup)
	require.NoError(t, err)
	cols, err := rows.Columns()
	require.NoError(t, err)
	require.True(t, rows.Next())
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	require.NoError(t, rows.Scan(ptrs...))
	require.False(t, rows.Next(), "one table, one row of plan")
	require.NoError(t, rows.Close())
	got := map[string]string{}
	for i, c := range cols {
		got[c] = vals[i].String
	}
	t.Logf("EXPLAIN %s\n%v", lookup, got)
	assert.Equal(t, "const", got["type"], "one row by a unique key")
	assert.Equal(t, "PRIMARY", got["key"])
	assert.Equal(t, "1", got["rows"])

	// The statement the duplicate runs is that INSERT, and it fails on that key.
	_, err = f.db.ExecContext(ctx, record)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1062")
	assert.Contains(t, err.Error(), "PRIMARY")
}

// A delivery whose record fails (here a lock wait timeout: another session holds the
// event's row) on its last allowed delivery is rejected. The rejection is written on
// another connection than the delivery's: the delivery's must be given back first, or a
// pool of one connection (or a full pool) waits for itself until the context ends.
func TestHandleLastDeliveryRejectsOnPoolOfOne(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t, "innodb_lock_wait_timeout=1")
	db.SetMaxOpenConns(1)
	f := setupOn(t, db, inbox.Config{MaxDeliveries: 2})
	ctx := context.Background()
	msg := newMessage()

	holder := testsvc.OpenDB(t)
	tx, err := holder.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	_, err = tx.ExecContext(ctx, inbox.RecordForTest(f.in, msg.EventID))
	require.NoError(t, err)

	msg.Deliveries = 1
	o, err := f.in.Handle(ctx, msg, f.effect)
	assert.Equal(t, inbox.Failed, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1205", "a lock wait timeout")

	// The last allowed delivery meets the same lock wait timeout: a fault, so it is not
	// rejected (a fault alone never rejects) but Failed, and at once: the failed insert's
	// transaction gave the pool's one connection back first.
	msg.Deliveries = 2
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	o, err = f.in.Handle(dctx, msg, f.effect)
	assert.Equal(t, inbox.Failed, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1205")
	require.NoError(t, dctx.Err(), "not by waiting for the context to end")
	assert.Empty(t, rejectedRows(t, f.in), "a lock wait timeout is a fault: nothing rejected")

	// Once the lock is gone, a failure of the message's own at the last delivery is
	// rejected, on the same pool of one.
	require.NoError(t, tx.Rollback())
	o, err = f.in.Handle(dctx, msg, f.failing(errors.New("the payload names no user")))
	require.NoError(t, err)
	assert.Equal(t, inbox.Rejected, o)
	rows := rejectedRows(t, f.in)
	require.Len(t, rows, 1)
	assert.Equal(t, "max_deliveries", rows[0].ReasonClass)
	assert.Contains(t, rows[0].Reason, "the payload names no user")
	assert.Equal(t, int64(1), f.calls.Load(), "the handler ran only when the record went in")
}

// comCounters reads the server's Com_* counters: how many statements of each kind it ran.
func comCounters(t testing.TB, db *sql.DB) map[string]int64 {
	t.Helper()
	return testsvc.ServerStatus(t, db, `SHOW GLOBAL STATUS LIKE 'Com\_%'`)
}

// statements is the statements the server ran during fn, by kind, the SHOW STATUS that
// reads them left out. Nothing else may use the server meanwhile.
func statements(t testing.TB, db *sql.DB, fn func()) map[string]int64 {
	t.Helper()
	before := comCounters(t, db)
	fn()
	after := comCounters(t, db)
	delta := map[string]int64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 && k != "Com_show_status" {
			delta[k] = d
		}
	}
	return delta
}

// What one message costs the database, counted by the server itself on a server of the
// test's own: a delivery with the inbox is the plain transaction of its handler (BEGIN, the
// handler's statement, COMMIT) and one statement more, the INSERT that records the event and
// is the duplicate check. A duplicate is that INSERT, refused, and a ROLLBACK. Purge deletes
// in statements of 500 rows.
func TestStatementsPerMessage(t *testing.T) {
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	f := setupOn(t, db, inbox.Config{})
	ctx := context.Background()
	// The handler's statement has its values in the text, as the inbox's has: one statement.
	h := func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO `"+f.effects+"` (grp, event_id) VALUES ('', '"+msg.EventID+"')")
		return err
	}
	_, err := f.in.Handle(ctx, newMessage(), h) // the pool's connection open
	require.NoError(t, err)

	plain := statements(t, db, func() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, h(ctx, tx, newMessage()))
		require.NoError(t, tx.Commit())
	})
	t.Logf("a plain consumer's transaction: %v", plain)
	require.Equal(t, map[string]int64{"Com_begin": 1, "Com_insert": 1, "Com_commit": 1}, plain)

	msg := newMessage()
	handled := statements(t, db, func() {
		o, err := f.in.Handle(ctx, msg, h)
		require.NoError(t, err)
		require.Equal(t, inbox.Handled, o)
	})
	t.Logf("a delivery through the inbox: %v", handled)
	assert.Equal(t, map[string]int64{"Com_begin": 1, "Com_insert": 2, "Com_commit": 1}, handled,
		"the inbox adds one statement, its INSERT, besides BEGIN and COMMIT")
	added := map[string]int64{}
	for k, v := range handled {
		if d := v - plain[k]; d != 0 {
			added[k] = d
		}
	}
	assert.Equal(t, map[string]int64{"Com_insert": 1}, added)

	duplicate := statements(t, db, func() {
		o, err := f.in.Handle(ctx, redelivery(msg), h)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, o)
	})
	t.Logf("a duplicate: %v", duplicate)
	assert.Equal(t, map[string]int64{"Com_begin": 1, "Com_insert": 1, "Com_rollback": 1}, duplicate)

	// 1200 rows past the retention and 5 within it: three DELETEs (500, 500, 200).
	_, err = db.ExecContext(ctx, "INSERT INTO `"+f.table+"` (consumer_group, event_id, consumed_at) "+
		"SELECT 'old', UUID(), UTC_TIMESTAMP(3) - INTERVAL 2 DAY FROM seq_1_to_1200")
	require.NoError(t, err)
	for range 5 {
		_, err := f.in.Handle(ctx, newMessage(), h)
		require.NoError(t, err)
	}
	var purged int64
	purge := statements(t, db, func() {
		purged, err = f.in.Purge(ctx, 24*time.Hour, 0)
		require.NoError(t, err)
	})
	t.Logf("a purge of 1200 rows: %v", purge)
	assert.EqualValues(t, 1200, purged)
	assert.EqualValues(t, 3, purge["Com_delete"], "in batches of 500")
	assert.Equal(t, 1+1+5, count(t, db, f.table), "the rows within the retention stay")
}

// The database unreachable from the start: every delivery fails, to come again, and the
// handler never runs; so does the last allowed one, whose rejection cannot be written.
func TestHandleDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/outbox_test?parseTime=true&timeout=2s")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	in, err := inbox.New(db, inbox.Config{Group: "g"})
	require.NoError(t, err)
	ctx := context.Background()
	var ran bool
	h := func(context.Context, *sql.Tx, *inbox.Message) error { ran = true; return nil }
	for _, msg := range []*inbox.Message{newMessage(), {EventID: uuid.NewString(), Deliveries: 5}, messageFor("")} {
		o, err := in.Handle(ctx, msg, h)
		assert.Equal(t, inbox.Failed, o, "delivery %d of %q", msg.Deliveries, msg.EventID)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "connection refused")
	}
	assert.False(t, ran)
	_, err = in.Rejected(ctx, 0, 10)
	require.Error(t, err)
	_, err = in.Replay(ctx, 1, h)
	require.Error(t, err)
	_, err = in.Purge(ctx, time.Hour, 0)
	require.Error(t, err)
	require.Error(t, in.CreateSchema(ctx))
}

// The database killed in the middle of a handler, down for a while, then restarted while
// deliveries run: every delivery that did not commit fails (nothing acknowledged), its
// redelivery after the recovery handles the event, and each event's effect happens once.
func TestHandleDatabaseGoesAway(t *testing.T) {
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	f := setupOn(t, db, inbox.Config{MaxDeliveries: outbox.RetryForever})
	ctx := context.Background()

	t.Run("killed mid-handler", func(t *testing.T) {
		msg := newMessage()
		entered, release := make(chan struct{}), make(chan struct{})
		type result struct {
			o   inbox.Outcome
			err error
		}
		done := make(chan result, 1)
		go func() {
			o, err := f.in.Handle(ctx, msg, func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
				err := f.effect(ctx, tx, m)
				close(entered)
				<-release
				return err
			})
			done <- result{o, err}
		}()
		<-entered
		srv.Kill(t)
		close(release)
		r := <-done
		assert.Equal(t, inbox.Failed, r.o)
		require.Error(t, r.err)
		t.Logf("the delivery whose server was killed: %v", r.err)

		down := redelivery(msg)
		o, err := f.in.Handle(ctx, down, f.effect)
		assert.Equal(t, inbox.Failed, o, "the server is down")
		require.Error(t, err)

		srv.Start(t)
		assert.Equal(t, 0, f.effectsOf(t, msg.EventID), "crash recovery rolled the effect back")
		assert.Equal(t, 0, f.recorded(t, f.in.Group(), msg.EventID))
		o, err = f.in.Handle(ctx, redelivery(down), f.effect)
		require.NoError(t, err)
		assert.Equal(t, inbox.Handled, o)
		assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
		o, err = f.in.Handle(ctx, redelivery(down), f.effect)
		require.NoError(t, err)
		assert.Equal(t, inbox.Duplicate, o)
		assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
	})

	t.Run("restarted under load", func(t *testing.T) {
		const workers = 4
		var (
			mu                       sync.Mutex
			events                   []string
			handled, dups, failed    atomic.Int64
			stop                     = make(chan struct{})
			wg                       sync.WaitGroup
			deadline, cancelDeadline = context.WithTimeout(ctx, 5*time.Minute)
		)
		defer cancelDeadline()
		slow := func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
			if err := f.effect(ctx, tx, m); err != nil {
				return err
			}
			time.Sleep(5 * time.Millisecond) // deliveries in flight when the server goes
			return nil
		}
		for range workers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					msg := newMessage()
					mu.Lock()
					events = append(events, msg.EventID)
					mu.Unlock()
					for ; ; msg = redelivery(msg) { // as RocketMQ redelivers a failed message
						dctx, cancel := context.WithTimeout(deadline, 15*time.Second)
						o, err := f.in.Handle(dctx, msg, slow)
						cancel()
						if o == inbox.Handled {
							handled.Add(1)
						}
						if o == inbox.Duplicate {
							dups.Add(1) // a commit whose outcome the client never saw
						}
						if o != inbox.Failed {
							assert.NoError(t, err)
							break
						}
						failed.Add(1)
						if deadline.Err() != nil {
							t.Errorf("event %s never handled: %v", msg.EventID, err)
							return
						}
						time.Sleep(50 * time.Millisecond)
					}
				}
			})
		}
		require.Eventually(t, func() bool { return handled.Load() >= 50 }, time.Minute, 10*time.Millisecond)
		srv.Restart(t)
		after := handled.Load()
		require.Eventually(t, func() bool { return handled.Load() >= after+50 }, time.Minute, 10*time.Millisecond)
		close(stop)
		wg.Wait()
		t.Logf("%d events: %d handled, %d duplicates, %d failed deliveries", len(events), handled.Load(), dups.Load(), failed.Load())
		assert.Positive(t, failed.Load(), "the restart failed deliveries in flight")
		assert.EqualValues(t, len(events), handled.Load()+dups.Load())

		var lost, doubled int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM (SELECT event_id FROM `"+f.effects+"` GROUP BY event_id HAVING COUNT(*) > 1) d").Scan(&doubled))
		require.NoError(t, db.QueryRow("SELECT ? - COUNT(DISTINCT event_id) FROM `"+f.effects+"` WHERE event_id IN ('"+
			strings.Join(events, "','")+"')", len(events)).Scan(&lost))
		assert.Zero(t, lost, "events without their effect")
		assert.Zero(t, doubled, "events with their effect twice")
	})
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	f := setup(t, inbox.Config{MeterProvider: mp, MaxDeliveries: 2})
	ctx := context.Background()
	boom := errors.New("the points service is down")

	// An event written 30 s ago (the time in its UUIDv7 id), handled now, then a duplicate.
	late := messageFor(eventIDAt(time.Now().Add(-30 * time.Second)))
	handle := func(msg *inbox.Message, h inbox.Handler, want inbox.Outcome) {
		t.Helper()
		o, _ := f.in.Handle(ctx, msg, h)
		require.Equal(t, want, o)
	}
	handle(late, f.effect, inbox.Handled)
	handle(redelivery(late), f.effect, inbox.Duplicate)
	poison := newMessage()
	handle(poison, f.failing(boom), inbox.Failed)
	handle(redelivery(poison), f.failing(boom), inbox.Rejected)
	handle(newMessage(), f.failing(outbox.Permanent(boom)), inbox.Rejected)
	handle(messageFor(""), f.effect, inbox.Rejected)
	handle(messageFor("ORD-1"), f.effect, inbox.Rejected)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, "github.com/go-outbox/outbox/inbox", sm.Scope.Name)
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	byAttr := func(name, key string) map[string]int64 {
		t.Helper()
		sum, ok := got[name].Data.(metricdata.Sum[int64])
		require.True(t, ok, "%s is a counter: %T", name, got[name].Data)
		out := map[string]int64{}
		for _, dp := range sum.DataPoints {
			v, _ := dp.Attributes.Value(attribute.Key(key))
			assert.Equal(t, 1, dp.Attributes.Len(), "%s has only %s", name, key)
			out[v.AsString()] += dp.Value
		}
		return out
	}
	assert.Equal(t, map[string]int64{"handled": 1, "duplicate": 1, "failed": 1, "rejected": 4},
		byAttr("inbox.messages", "outcome"))
	assert.Equal(t, map[string]int64{"max_deliveries": 1, "permanent": 1, "no_event_id": 1, "invalid_event_id": 1},
		byAttr("inbox.rejected", "reason"))

	lag, ok := got["inbox.lag"].Data.(metricdata.Histogram[float64])
	require.True(t, ok, "inbox.lag is a histogram: %T", got["inbox.lag"].Data)
	require.Len(t, lag.DataPoints, 1)
	dp := lag.DataPoints[0]
	assert.EqualValues(t, 1, dp.Count, "recorded for the handled delivery only")
	low, _ := dp.Min.Value()
	assert.GreaterOrEqual(t, low, 30.0, "from the event's own time")
	assert.Less(t, low, 30.0+120, "not from the epoch")
	assert.Equal(t, "s", got["inbox.lag"].Unit)

	dur, ok := got["inbox.handle.duration"].Data.(metricdata.Histogram[float64])
	require.True(t, ok)
	var n uint64
	for _, dp := range dur.DataPoints {
		n += dp.Count
	}
	assert.EqualValues(t, 7, n, "one per delivery")
}

func TestTracingContinuesTheProducersTrace(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	f := setup(t, inbox.Config{TracerProvider: tp})
	ctx := context.Background()

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	msg := newMessage()
	msg.Properties["traceparent"] = "00-" + traceID + "-" + parentID + "-01"
	var inHandler trace.SpanContext
	o, err := f.in.Handle(ctx, msg, func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		inHandler = trace.SpanContextFromContext(ctx)
		return f.effect(ctx, tx, m)
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)

	spans := sr.Ended()
	require.Len(t, spans, 1)
	s := spans[0]
	assert.Equal(t, trace.SpanKindConsumer, s.SpanKind())
	assert.Equal(t, "process ORDER_EVENT_TOPIC", s.Name())
	assert.Equal(t, traceID, s.SpanContext().TraceID().String(), "the producer's trace")
	assert.Equal(t, parentID, s.Parent().SpanID().String(), "a child of the producer's span")
	assert.True(t, s.Parent().IsRemote())
	assert.Equal(t, s.SpanContext().SpanID(), inHandler.SpanID(), "the handler runs in the span")
	attrs := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value.String()
	}
	assert.Equal(t, "handled", attrs["outbox.inbox.outcome"])
	assert.Equal(t, f.in.Group(), attrs["messaging.consumer.group.name"])
	assert.Equal(t, msg.MsgID, attrs["messaging.message.id"])
	assert.Equal(t, codes.Unset, s.Status().Code)

	// A failed delivery's span says so; a message without trace context starts a trace.
	plain := newMessage()
	_, err = f.in.Handle(ctx, plain, f.failing(errors.New("boom")))
	require.Error(t, err)
	spans = sr.Ended()
	require.Len(t, spans, 2)
	s = spans[1]
	assert.Equal(t, codes.Error, s.Status().Code)
	assert.False(t, s.Parent().IsValid(), "a root span")
	assert.NotEqual(t, traceID, s.SpanContext().TraceID().String())
}

// The handler's transaction has the session's isolation level unless TxOptions says
// otherwise, and TxOptions is applied to it: a handler reading twice sees a row another
// session committed in between under READ COMMITTED, not under REPEATABLE READ.
// (information_schema.INNODB_TRX is no witness: MariaDB 10.11 shows there the level of the
// connection's first transaction.)
func TestHandleTxOptions(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	other := testsvc.OpenDB(t)
	var session string
	require.NoError(t, db.QueryRow("SELECT @@tx_isolation").Scan(&session))
	ctx := context.Background()
	for _, tc := range []struct {
		opts      *sql.TxOptions
		seesOther bool
	}{
		{nil, session == "READ-COMMITTED" || session == "READ-UNCOMMITTED"},
		{&sql.TxOptions{Isolation: sql.LevelReadCommitted}, true},
		{&sql.TxOptions{Isolation: sql.LevelRepeatableRead}, false},
	} {
		f := setupOn(t, db, inbox.Config{TxOptions: tc.opts})
		var before, after int
		o, err := f.in.Handle(ctx, newMessage(), func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
			if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.effects+"`").Scan(&before); err != nil {
				return err
			}
			if _, err := other.ExecContext(ctx, "INSERT INTO `"+f.effects+"` (grp, event_id) VALUES ('other', '')"); err != nil {
				return err
			}
			if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+f.effects+"`").Scan(&after); err != nil {
				return err
			}
			return f.effect(ctx, tx, m)
		})
		require.NoError(t, err)
		assert.Equal(t, inbox.Handled, o)
		assert.Equal(t, tc.seesOther, after > before, "TxOptions %+v, session %s", tc.opts, session)
	}

	// A read-only transaction refuses the record itself: a failed delivery.
	f := setupOn(t, db, inbox.Config{TxOptions: &sql.TxOptions{ReadOnly: true}})
	o, err := f.in.Handle(ctx, newMessage(), f.effect)
	assert.Equal(t, inbox.Failed, o)
	require.Error(t, err)
	assert.Zero(t, f.calls.Load())
}
