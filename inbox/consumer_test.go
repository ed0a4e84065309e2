package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The consumer's tests run the whole path: events committed to an outbox table of the
// test's own, published by the real publisher to a real topic, consumed by inbox.Consumer
// in a consumer group of the test's own, whose handler writes an effect row in the inbox's
// transaction. The effects table has no unique key, so an effect done twice is two rows:
// the ledger counts every committed event's effects, and each must have exactly one.

// consRig is one test's outbox, publisher, inbox and effects table.
type consRig struct {
	db      *sql.DB // the outbox's database: the shared test server
	inDB    *sql.DB // the inbox's and the effects' database
	store   *outbox.MySQLStore
	table   string // the outbox table
	topic   string
	ns      string                // the name server of the topic's cluster
	creds   primitive.Credentials // the cluster's user, with ACL on
	group   string
	inTable string
	effects string
	in      *inbox.Inbox
	reader  *sdkmetric.ManualReader
}

type consRigOptions struct {
	ordering      outbox.Ordering
	inDB          *sql.DB // defaults to the shared test server
	maxDeliveries int
	// acl puts the topic on the cluster with ACL 2.0 on (testsvc.RocketMQACL): the
	// publisher and the consumers have its user's credentials.
	acl bool
}

func newConsRig(t *testing.T, o consRigOptions) *consRig {
	t.Helper()
	db := testsvc.OpenDB(t)
	r := &consRig{db: db, inDB: o.inDB, table: testsvc.UniqueTable("t_event"), group: testsvc.UniqueTable("cg_inbox"),
		inTable: testsvc.UniqueTable("t_inbox"), effects: testsvc.UniqueTable("t_effect")}
	if o.acl {
		acl := testsvc.RocketMQACL(t)
		r.topic, r.ns, r.creds = acl.NewTopic(t, "INBOX_ACL"), acl.NameServer, acl.User
	} else {
		r.topic, r.ns = testsvc.NewTopic(t, "INBOX_CONS"), testsvc.RocketMQNameServer(t)
	}
	if r.inDB == nil {
		r.inDB = db
	}
	r.store = testsvc.NewStore(t, db, outbox.MySQLConfig{Table: r.table, Ordering: o.ordering, Routes: outbox.Routes{Topic: r.topic}})
	ctx := context.Background()
	_, err := r.inDB.ExecContext(ctx, "CREATE TABLE `"+r.effects+"` ("+
		"seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "+
		"event_id CHAR(36) NOT NULL, biz_no VARCHAR(64) NOT NULL, deliveries INT NOT NULL, "+
		"handled_by VARCHAR(64) NOT NULL, KEY idx_event (event_id)) ENGINE = InnoDB")
	require.NoError(t, err)
	r.reader = sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	r.in, err = inbox.New(r.inDB, inbox.Config{Group: r.group, Table: r.inTable, MaxDeliveries: o.maxDeliveries,
		Logger: slog.New(slog.DiscardHandler), MeterProvider: mp})
	require.NoError(t, err)
	require.NoError(t, r.in.CreateSchema(ctx))
	t.Cleanup(func() {
		for _, tbl := range []string{r.effects, r.inTable, r.inTable + "_rejected"} {
			_, _ = r.inDB.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+tbl+"`")
		}
	})
	return r
}

// publish starts the real publisher on the rig's table and topic; it stops when t ends.
func (r *consRig) publish(t *testing.T) {
	t.Helper()
	sender := r.sender(t)
	p, err := outbox.NewPublisher(r.store, sender, outbox.Config{
		PollInterval: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
		assert.NoError(t, p.Close()) // closes the sender
	})
}

// sender is a RocketMQ sender of its own on the rig's topic; the caller closes it (a
// publisher given it does).
func (r *consRig) sender(t *testing.T) *outbox.RocketMQSender {
	t.Helper()
	cfg := outbox.RocketMQConfig{NameServers: []string{r.ns}, GroupName: testsvc.UniqueTable("pg")}
	if r.creds.AccessKey != "" {
		cfg.ProducerOptions = []producer.Option{producer.WithCredentials(r.creds)}
	}
	s, err := outbox.NewRocketMQSender(cfg)
	require.NoError(t, err)
	return s
}

// insert commits n events of bizNo, one transaction each, and returns their event ids.
func (r *consRig) insert(t *testing.T, bizNo string, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for i := range n {
		ids = append(ids, r.insertOne(t, bizNo, fmt.Sprintf(`{"bizNo":%q,"n":%d}`, bizNo, i)))
	}
	return ids
}

func (r *consRig) insertOne(t *testing.T, bizNo, payload string) string {
	t.Helper()
	ctx := context.Background()
	tx, err := r.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(payload)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return id
}

// committed is every event of the outbox table, in id order.
func (r *consRig) committed(t *testing.T) []outbox.Event {
	t.Helper()
	rows, err := r.db.Query("SELECT id, event_id, topic, biz_no, event_type, payload FROM `" + r.table + "` ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var evs []outbox.Event
	for rows.Next() {
		var ev outbox.Event
		require.NoError(t, rows.Scan(&ev.ID, &ev.EventID, &ev.Topic, &ev.BizNo, &ev.EventType, &ev.Payload))
		evs = append(evs, ev)
	}
	require.NoError(t, rows.Err())
	return evs
}

// effectHandler is a handler that writes msg's effect row in tx, marked with by, and then
// calls after (if not nil) with it; after's error is the handler's.
func (r *consRig) effectHandler(by string, after func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error) inbox.Handler {
	q := "INSERT INTO `" + r.effects + "` (event_id, biz_no, deliveries, handled_by) VALUES (?, ?, ?, ?)"
	return func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		if _, err := tx.ExecContext(ctx, q, msg.EventID, msg.BizNo, msg.Deliveries, by); err != nil {
			return err
		}
		if after != nil {
			return after(ctx, tx, msg)
		}
		return nil
	}
}

// consume runs a consumer of the rig's topic in the inbox's group until t ends (or Close).
func (r *consRig) consume(t *testing.T, h inbox.Handler, cfg inbox.ConsumerConfig) *inbox.Consumer {
	t.Helper()
	cfg.NameServers = []string{r.ns}
	cfg.Topic = r.topic
	cfg.Credentials = r.creds
	c, err := inbox.NewConsumer(r.in, h, cfg)
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() { assert.NoError(t, c.Close()) })
	return c
}

// effectRow is one row of the effects table.
type effectRow struct {
	Seq        int64
	EventID    string
	BizNo      string
	Deliveries int
	HandledBy  string
}

func (r *consRig) effectRows(t *testing.T) []effectRow {
	t.Helper()
	rows, err := r.inDB.Query("SELECT seq, event_id, biz_no, deliveries, handled_by FROM `" + r.effects + "` ORDER BY seq")
	require.NoError(t, err)
	defer rows.Close()
	var out []effectRow
	for rows.Next() {
		var e effectRow
		require.NoError(t, rows.Scan(&e.Seq, &e.EventID, &e.BizNo, &e.Deliveries, &e.HandledBy))
		out = append(out, e)
	}
	require.NoError(t, rows.Err())
	return out
}

// countEffects is the number of effect rows committed, or -1 when the database does not
// answer.
func (r *consRig) countEffects() int {
	var n int
	if err := r.inDB.QueryRow("SELECT COUNT(*) FROM `" + r.effects + "`").Scan(&n); err != nil {
		return -1
	}
	return n
}

// waitEffects waits until at least n effect rows are committed; if they are not, it fails t
// with the ledger.
func (r *consRig) waitEffects(t *testing.T, n int, within time.Duration) {
	t.Helper()
	if !assert.Eventually(t, func() bool { return r.countEffects() >= n }, within, 100*time.Millisecond,
		"%d effects wanted within %s", n, within) {
		r.checkLedger(t) // which are missing
		t.FailNow()
	}
}

// checkLedger asserts that every committed event but those of except has exactly one effect
// (lost 0, doubled 0), that no effect belongs to another event, and that the inbox recorded
// exactly the events with an effect. It returns the effects by event id.
func (r *consRig) checkLedger(t *testing.T, except ...string) map[string][]effectRow {
	t.Helper()
	skip := map[string]bool{}
	for _, id := range except {
		skip[id] = true
	}
	byID := map[string][]effectRow{}
	for _, e := range r.effectRows(t) {
		byID[e.EventID] = append(byID[e.EventID], e)
	}
	committed := map[string]bool{}
	var lost, doubled, stray []string
	for _, ev := range r.committed(t) {
		committed[ev.EventID] = true
		switch n := len(byID[ev.EventID]); {
		case skip[ev.EventID]:
			if n != 0 {
				stray = append(stray, ev.EventID)
			}
		case n == 0:
			lost = append(lost, ev.EventID)
		case n > 1:
			doubled = append(doubled, fmt.Sprintf("%s x%d", ev.EventID, n))
		}
	}
	for id := range byID {
		if !committed[id] {
			stray = append(stray, id)
		}
	}
	t.Logf("ledger: %d committed, %d excepted, %d with an effect; lost %d, doubled %d, stray %d",
		len(committed), len(skip), len(byID), len(lost), len(doubled), len(stray))
	assert.Empty(t, lost, "committed events whose effect never happened")
	assert.Empty(t, doubled, "events whose effect happened more than once")
	assert.Empty(t, stray, "effects of events that were not to have one")

	var recorded int
	require.NoError(t, r.inDB.QueryRow("SELECT COUNT(*) FROM `"+r.inTable+"` WHERE consumer_group = ?", r.group).Scan(&recorded))
	assert.Equal(t, len(byID), recorded, "the inbox records exactly the events whose effect committed")
	return byID
}

// outcomes is the inbox.messages counter by outcome.
func (r *consRig) outcomes(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "inbox.messages" {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "inbox.messages is a counter")
			for _, dp := range sum.DataPoints {
				o, _ := dp.Attributes.Value("outcome")
				out[o.AsString()] += dp.Value
			}
		}
	}
	return out
}

// callCount counts a handler's calls per event id.
type callCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *callCount) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *callCount) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// The happy path: events committed while a concurrent consumer runs are each handled
// once, in parallel, and recorded in the inbox.
func TestConsumerHandlesEveryEventOnce(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	var inflight, most atomic.Int32
	h := r.effectHandler("c1", func(context.Context, *sql.Tx, *inbox.Message) error {
		n := inflight.Add(1)
		defer inflight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond) // long enough for deliveries to overlap
		return nil
	})
	r.consume(t, h, inbox.ConsumerConfig{})
	const n = 200
	for i := range 20 {
		r.insert(t, fmt.Sprintf("ORD-%d", i), n/20)
	}
	r.waitEffects(t, n, 45*time.Second)
	r.checkLedger(t)
	o := r.outcomes(t)
	t.Logf("outcomes %v, at most %d handlers at once", o, most.Load())
	assert.Equal(t, int64(n), o["handled"])
	assert.Zero(t, o["failed"]+o["rejected"])
	assert.Greater(t, most.Load(), int32(1), "a concurrent consumer handles messages in parallel")
}

// Every event sent twice more on purpose, straight through a sender (once while the
// first delivery may be in flight, once after every effect is in): the duplicates are
// suppressed and each effect happens once.
func TestConsumerSuppressesDuplicatesSentOnPurpose(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	r.consume(t, r.effectHandler("c1", nil), inbox.ConsumerConfig{})
	const n = 60
	r.insert(t, "ORD-DUP", n)
	resend := r.sender(t)
	defer func() { assert.NoError(t, resend.Close()) }()
	send := func(evs []outbox.Event) {
		for i, err := range resend.Send(context.Background(), evs, false) {
			require.NoError(t, err, "resend event %s", evs[i].EventID)
		}
	}
	evs := r.committed(t)
	require.Len(t, evs, n)
	send(evs) // as the publisher's own sends of them go out
	r.waitEffects(t, n, 45*time.Second)
	send(evs)
	require.Eventually(t, func() bool { return r.outcomes(t)["duplicate"] >= 2*n }, 45*time.Second, 100*time.Millisecond,
		"every copy delivered and suppressed")
	o := r.outcomes(t)
	t.Logf("outcomes %v", o)
	assert.Equal(t, int64(n), o["handled"], "each event handled once")
	assert.Equal(t, int64(2*n), o["duplicate"], "both copies of each event suppressed")
	r.checkLedger(t)
}

// A handler that fails the first delivery of some events, after writing their effect:
// the effect is rolled back, the message comes again through the group's retry topic, and
// the effect happens once, on the second delivery.
func TestConsumerRedeliversAFailedDelivery(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	var c callCount
	h := r.effectHandler("c1", func(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
		c.add(msg.EventID)
		if strings.HasPrefix(msg.BizNo, "FLAKY") && msg.Deliveries == 1 {
			return errors.New("the first delivery fails")
		}
		return nil
	})
	r.consume(t, h, inbox.ConsumerConfig{})
	ok := r.insert(t, "ORD-OK", 20)
	flaky := r.insert(t, "FLAKY-1", 3)
	flaky = append(flaky, r.insert(t, "FLAKY-2", 2)...)
	// The redeliveries wait for RocketMQ's first retry level, 10 s.
	r.waitEffects(t, len(ok)+len(flaky), 50*time.Second)
	byID := r.checkLedger(t)
	for _, id := range flaky {
		require.Len(t, byID[id], 1)
		assert.Equal(t, 2, byID[id][0].Deliveries, "event %s: effect on its second delivery", id)
		assert.Equal(t, 2, c.get(id), "event %s: handler ran twice, once failing", id)
	}
	for _, id := range ok {
		assert.Equal(t, 1, byID[id][0].Deliveries)
	}
	o := r.outcomes(t)
	t.Logf("outcomes %v", o)
	assert.Equal(t, int64(len(flaky)), o["failed"])
	assert.Equal(t, int64(len(ok)+len(flaky)), o["handled"])
}

// A handler that refuses an event with outbox.Permanent: the event is recorded in the
// rejected table with its reason, properties and body, acknowledged, and never delivered
// again (checked once a canary that failed its first delivery, at the same time, has come
// back through the retry topic: a redelivery of the rejected one would have come too).
func TestConsumerRejectsAPermanentFailureOnce(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	var c callCount
	h := r.effectHandler("c1", func(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
		c.add(msg.EventID)
		switch {
		case msg.BizNo == "BAD":
			return outbox.Permanent(errors.New("order BAD has no customer"))
		case msg.BizNo == "CANARY" && msg.Deliveries == 1:
			return errors.New("the canary's first delivery fails")
		}
		return nil
	})
	r.consume(t, h, inbox.ConsumerConfig{})
	ok := r.insert(t, "ORD-OK", 10)
	bad := r.insertOne(t, "BAD", `{"bizNo":"BAD"}`)
	canary := r.insertOne(t, "CANARY", `{"bizNo":"CANARY"}`)
	r.waitEffects(t, len(ok)+1, 50*time.Second)
	byID := r.checkLedger(t, bad)
	require.Len(t, byID[canary], 1)
	assert.Equal(t, 2, byID[canary][0].Deliveries, "the canary came back through the retry topic")
	// The rejected event was delivered before the canary's failed first delivery: had it
	// been sent back, its redelivery would be due by now.
	assert.Never(t, func() bool { return c.get(bad) > 1 }, 3*time.Second, 100*time.Millisecond,
		"the rejected message was delivered again")
	assert.Equal(t, 1, c.get(bad), "the rejected message was delivered once")

	rej, err := r.in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	require.Len(t, rej, 1)
	got := rej[0]
	assert.Equal(t, bad, got.Key)
	assert.Equal(t, bad, got.Message.EventID)
	assert.Equal(t, "permanent", got.ReasonClass)
	assert.Contains(t, got.Reason, "order BAD has no customer")
	assert.Equal(t, 1, got.Message.Deliveries, "acknowledged on its first delivery")
	assert.Equal(t, `{"bizNo":"BAD"}`, string(got.Message.Body))
	assert.Equal(t, "BAD", got.Message.BizNo)
	assert.Equal(t, "ORDER_CREATED", got.Message.EventType)
	assert.Equal(t, bad, got.Message.Properties[outbox.PropertyEventID])
	assert.Equal(t, r.topic, got.Message.Topic)
	assert.NotEmpty(t, got.Message.MsgID)
	o := r.outcomes(t)
	t.Logf("outcomes %v", o)
	assert.Equal(t, int64(1), o["rejected"])
}

// Rebalance: a second consumer of the group joins while events flow, and the first
// leaves (Close). Both handle some; whatever the handover delivered twice is suppressed,
// and every effect happens once.
func TestConsumerRebalanceJoinAndLeave(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	slow := func(context.Context, *sql.Tx, *inbox.Message) error {
		time.Sleep(5 * time.Millisecond)
		return nil
	}
	first := r.consume(t, r.effectHandler("first", slow), inbox.ConsumerConfig{})

	const total = 240
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := range total / 4 {
			for k := range 4 {
				r.insertOne(t, fmt.Sprintf("ORD-%d", k), fmt.Sprintf(`{"n":%d}`, i))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	r.waitEffects(t, total/6, 30*time.Second)
	r.consume(t, r.effectHandler("second", slow), inbox.ConsumerConfig{})
	handledBy := func(by string) int {
		var n int
		_ = r.inDB.QueryRow("SELECT COUNT(*) FROM `"+r.effects+"` WHERE handled_by = ?", by).Scan(&n)
		return n
	}
	require.Eventually(t, func() bool { return handledBy("second") > 0 }, 30*time.Second, 100*time.Millisecond,
		"the second consumer is given queues")
	require.NoError(t, first.Close())
	before := handledBy("first")
	<-produced
	r.waitEffects(t, total, 45*time.Second)
	r.checkLedger(t)
	assert.Equal(t, before, handledBy("first"), "nothing handled by the first consumer after Close")
	o := r.outcomes(t)
	t.Logf("outcomes %v; handled by the first %d, by the second %d", o, handledBy("first"), handledBy("second"))
	assert.Equal(t, int64(total), o["handled"])
}

// The inbox's database goes away while handlers run: some are in the middle of their
// transaction when the server stops, more messages arrive while it is down. Nothing is
// acknowledged without its effect: once the server is back, every message comes again
// and its effect happens once.
func TestConsumerDatabaseOutageRestart(t *testing.T) {
	t.Parallel()
	srv := testsvc.PrivateMySQL(t)
	inDB := srv.OpenDB(t)
	r := newConsRig(t, consRigOptions{inDB: inDB})
	r.publish(t)
	gate := make(chan struct{})
	var gated atomic.Int32
	h := r.effectHandler("c1", func(context.Context, *sql.Tx, *inbox.Message) error {
		return nil
	})
	gatedHandler := func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
		if err := h(ctx, tx, msg); err != nil {
			return err
		}
		if strings.HasPrefix(msg.BizNo, "GATE") && msg.Deliveries == 1 {
			gated.Add(1)
			<-gate // the transaction is open, its effect written, when the server stops
		}
		return nil
	}
	r.consume(t, gatedHandler, inbox.ConsumerConfig{})
	before := r.insert(t, "ORD-BEFORE", 20)
	gates := append(r.insert(t, "GATE-1", 2), r.insert(t, "GATE-2", 2)...)
	r.waitEffects(t, len(before), 30*time.Second)
	require.Eventually(t, func() bool { return gated.Load() == int32(len(gates)) }, 30*time.Second, 50*time.Millisecond)

	srv.Stop(t)
	during := r.insert(t, "ORD-DURING", 10)
	require.Eventually(t, func() bool { return r.outcomes(t)["failed"] >= int64(len(during)) }, 30*time.Second, 100*time.Millisecond,
		"deliveries fail while the database is down")
	close(gate) // the open transactions' commits fail
	require.Eventually(t, func() bool { return r.outcomes(t)["failed"] >= int64(len(during)+len(gates)) }, 30*time.Second, 100*time.Millisecond)
	down := r.outcomes(t)
	srv.Start(t)
	after := r.insert(t, "ORD-AFTER", 10)

	r.waitEffects(t, len(before)+len(gates)+len(during)+len(after), 60*time.Second)
	byID := r.checkLedger(t)
	for _, id := range append(append([]string(nil), gates...), during...) {
		require.Len(t, byID[id], 1)
		assert.GreaterOrEqual(t, byID[id][0].Deliveries, 2, "event %s failed while the database was down and came again", id)
	}
	o := r.outcomes(t)
	t.Logf("outcomes while down %v, at the end %v", down, o)
	assert.Equal(t, int64(len(before)), down["handled"], "nothing handled while the database was down")
}

// Close lets a delivery in progress finish before it returns: the handler is not cut off,
// its effect commits, and a consumer of the group started afterwards does not do it again.
func TestConsumerCloseWaitsForTheHandlerInProgress(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	gate, in := make(chan struct{}), make(chan string, 1)
	var running atomic.Bool
	h := r.effectHandler("first", func(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
		if msg.BizNo == "SLOW" {
			running.Store(true)
			defer running.Store(false)
			in <- msg.EventID
			<-gate
		}
		return nil
	})
	started := time.Now()
	first := r.consume(t, h, inbox.ConsumerConfig{})
	ok := r.insert(t, "ORD-A", 5)
	r.waitEffects(t, len(ok), 30*time.Second)
	// Past the first 3 s, within which Close waits for the client's start to settle
	// whatever runs.
	time.Sleep(time.Until(started.Add(4 * time.Second)))
	slow := r.insertOne(t, "SLOW", `{"slow":true}`)
	select {
	case id := <-in:
		require.Equal(t, slow, id)
	case <-time.After(30 * time.Second):
		t.Fatal("the slow handler never ran")
	}
	closed := make(chan bool, 1)
	go func() {
		assert.NoError(t, first.Close())
		closed <- running.Load()
	}()
	assert.Never(t, func() bool { return len(closed) > 0 }, 3*time.Second, 50*time.Millisecond,
		"Close returned while a handler ran")
	close(gate)
	select {
	case stillRunning := <-closed:
		assert.False(t, stillRunning, "Close returned while a handler ran")
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after the handler did")
	}
	r.waitEffects(t, len(ok)+1, time.Second)

	// A second consumer of the group: whatever the first handled and the broker redelivers
	// (the client stores its offsets at shutdown one way, so they may be lost) is
	// suppressed.
	r.consume(t, r.effectHandler("second", nil), inbox.ConsumerConfig{})
	more := r.insert(t, "ORD-B", 3)
	r.waitEffects(t, len(ok)+1+len(more), 30*time.Second)
	byID := r.checkLedger(t)
	require.Len(t, byID[slow], 1)
	assert.Equal(t, "first", byID[slow][0].HandledBy)
	t.Logf("outcomes %v", r.outcomes(t))
}

// NewConsumer refuses a configuration it cannot run, naming what is wrong.
func TestNewConsumerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none") // never dialled
	require.NoError(t, err)
	defer db.Close()
	in, err := inbox.New(db, inbox.Config{Group: "cg_config"})
	require.NoError(t, err)
	h := func(context.Context, *sql.Tx, *inbox.Message) error { return nil }
	ns := []string{"127.0.0.1:9876"}
	for _, c := range []struct {
		name string
		in   *inbox.Inbox
		h    inbox.Handler
		cfg  inbox.ConsumerConfig
		want string
	}{
		{"nil inbox", nil, h, inbox.ConsumerConfig{NameServers: ns, Topic: "T"}, "inbox is nil"},
		{"nil handler", in, nil, inbox.ConsumerConfig{NameServers: ns, Topic: "T"}, "handler is nil"},
		{"empty topic", in, h, inbox.ConsumerConfig{NameServers: ns}, "Topic is empty"},
		{"no name servers", in, h, inbox.ConsumerConfig{Topic: "T"}, "NameServers is empty"},
		{"bad name server", in, h, inbox.ConsumerConfig{NameServers: []string{"not an address"}, Topic: "T"}, "NameServers"},
		{"negative pause", in, h, inbox.ConsumerConfig{NameServers: ns, Topic: "T", RetryPause: -time.Second}, "RetryPause"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := inbox.NewConsumer(c.in, c.h, c.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			assert.Contains(t, err.Error(), c.want)
			assert.Nil(t, got)
		})
	}
}

// Run on a topic that does not exist returns an error that names it; a closed consumer
// cannot be run.
func TestConsumerRunOnAMissingTopic(t *testing.T) {
	t.Parallel()
	ns := testsvc.RocketMQNameServer(t)
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none") // never dialled
	require.NoError(t, err)
	defer db.Close()
	in, err := inbox.New(db, inbox.Config{Group: testsvc.UniqueTable("cg_inbox")})
	require.NoError(t, err)
	topic := testsvc.UniqueTable("INBOX_NO_SUCH_TOPIC")
	c, err := inbox.NewConsumer(in, func(context.Context, *sql.Tx, *inbox.Message) error { return nil },
		inbox.ConsumerConfig{NameServers: []string{ns}, Topic: topic})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = c.Start(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), topic, "Start says which topic")
	err = c.Run(ctx)
	require.Error(t, err)
	t.Logf("Run: %v", err)
	assert.Contains(t, err.Error(), topic)
	assert.NoError(t, ctx.Err(), "Run returned the error, not the deadline")
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close twice")
	assert.ErrorIs(t, c.Run(context.Background()), outbox.ErrClosed, "Run after Close")
}

// A consumer of an inbox with Retention purges the rows older than it, and only those, while
// it runs; without Retention nothing is purged.
func TestConsumerRetention(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	ctx := context.Background()
	table := testsvc.UniqueTable("t_inbox")
	var logs warnings
	in, err := inbox.New(db, inbox.Config{Group: testsvc.UniqueTable("cg_ret"), Table: table,
		Retention: time.Hour, RetentionInterval: 20 * time.Millisecond, Logger: slog.New(&logs)})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(ctx))
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`") })
	noop := func(context.Context, *sql.Tx, *inbox.Message) error { return nil }
	var old, fresh []string
	for i := range 6 {
		id := uuid.Must(uuid.NewV7()).String()
		o, err := in.Handle(ctx, &inbox.Message{EventID: id, Deliveries: 1}, noop)
		require.NoError(t, err)
		require.Equal(t, inbox.Handled, o)
		if i%2 == 0 {
			old = append(old, id)
		} else {
			fresh = append(fresh, id)
		}
	}
	for _, id := range old {
		_, err := db.Exec("UPDATE `"+table+"` SET consumed_at = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 2 HOUR) WHERE event_id = ?", id)
		require.NoError(t, err)
	}
	count := func() int {
		var n int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+table+"`").Scan(&n))
		return n
	}
	require.Equal(t, 6, count())

	// Another instance's purge holds the table's lock: the consumer's retention leaves the
	// table to it, quietly (Purge's ErrPurgeBusy is no failure), and purges once it is free.
	holder, err := db.Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	var got int
	require.NoError(t, holder.QueryRowContext(ctx, "SELECT GET_LOCK("+inbox.RetentionLockForTest(in)+", 0)").Scan(&got))
	require.Equal(t, 1, got)
	c, err := inbox.NewConsumer(in, noop, inbox.ConsumerConfig{NameServers: []string{testsvc.RocketMQNameServer(t)},
		Topic: testsvc.NewTopic(t, "INBOX_RET")})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	busy := func() bool {
		n, err := in.Purge(ctx, time.Hour, 0)
		return n == 0 && errors.Is(err, outbox.ErrPurgeBusy)
	}
	require.Eventually(t, busy, 10*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond) // ten retention intervals
	assert.Equal(t, 6, count(), "nothing purged while another purge holds the table")
	_, err = holder.ExecContext(ctx, "DO RELEASE_LOCK("+inbox.RetentionLockForTest(in)+")")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return count() == len(fresh) }, 30*time.Second, 10*time.Millisecond)
	assert.Empty(t, logs.get(), "a purge another instance runs is not worth a warning")
	require.NoError(t, c.Close())
	for _, id := range fresh {
		o, err := in.Handle(ctx, &inbox.Message{EventID: id, Deliveries: 1}, noop)
		require.NoError(t, err)
		assert.Equal(t, inbox.Duplicate, o, "a row younger than Retention is kept")
	}
	_, err = inbox.New(db, inbox.Config{Group: "g", Retention: -time.Hour})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

// The broker restarts while the consumer consumes and the publisher publishes: every
// committed event's effect happens once. Not parallel: it stops broker-a, under this
// package's other tests otherwise (the CI runs packages one at a time, -p 1).
func TestConsumerBrokerRestart(t *testing.T) {
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	r.consume(t, r.effectHandler("c1", nil), inbox.ConsumerConfig{})
	const before, during = 50, 50
	r.insert(t, "ORD-B", before)
	r.waitEffects(t, before, 60*time.Second)
	testsvc.StopBroker(t)
	for i := range 10 { // committed while the broker is down, a few at a time
		r.insert(t, fmt.Sprintf("ORD-D%d", i), during/10)
		time.Sleep(300 * time.Millisecond)
	}
	testsvc.StartBroker(t)
	r.waitEffects(t, before+during, 3*time.Minute)
	r.checkLedger(t)
	o := r.outcomes(t)
	t.Logf("outcomes %v", o)
	assert.Equal(t, int64(before+during), o["handled"])
	assert.Zero(t, o["rejected"])
}

// warnings is a slog handler that keeps the messages logged at warn and above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}

func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// A delivery that fails for a fault comes again past the client's default of 16
// redeliveries, after which RocketMQ would move it to the group's dead-letter queue
// (%DLQ%), acknowledged with no effect and no rejected row: the consumer raises the
// client's MaxReconsumeTimes, so that the inbox alone gives a message up. An interceptor
// asks for RocketMQ's shortest redelivery delay (level 1, 1 s) so that the test does not
// wait for the growing ones (10 s, 30 s, ... 2 h).
func TestConsumerRedeliversAFaultPastTheClientsDeadLetterLimit(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	const fails = 20 // the client's default limit is 16
	var c callCount
	h := r.effectHandler("c1", func(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
		c.add(msg.EventID)
		if msg.Deliveries <= fails {
			return outbox.Unavailable(fmt.Errorf("delivery %d: the downstream service is down", msg.Deliveries))
		}
		return nil
	})
	soon := func(ctx context.Context, req, reply any, next primitive.Invoker) error {
		if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
			cc.DelayLevelWhenNextConsume = 1
		}
		return next(ctx, req, reply)
	}
	r.consume(t, h, inbox.ConsumerConfig{ConsumerOptions: []consumer.Option{consumer.WithInterceptor(soon)}})
	id := r.insertOne(t, "ORD-FAULT", `{"fault":true}`)
	r.waitEffects(t, 1, 3*time.Minute)
	byID := r.checkLedger(t)
	require.Len(t, byID[id], 1)
	assert.Equal(t, fails+1, byID[id][0].Deliveries, "handled on the delivery after the last failure")
	assert.Equal(t, fails+1, c.get(id))
	rej, err := r.in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	assert.Empty(t, rej, "a fault never rejects")
}
