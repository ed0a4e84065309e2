package outbox_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// topicSetup is setup with a store whose events may name the topics given besides the
// default one, defaultTopic.
func topicSetup(t *testing.T, cfg outbox.MySQLConfig, topics ...string) *bundle {
	t.Helper()
	db := testsvc.OpenDB(t)
	cfg.Routes.Topics = topics
	return &bundle{db: db, store: testsvc.NewStore(t, db, cfg)}
}

// defaultTopic is the default of Routes.Topic.
const defaultTopic = "ORDER_EVENT_TOPIC"

// insertTopic commits one event of bizNo to topic and returns its id.
func (b *bundle) insertTopic(t testing.TB, bizNo, topic string) int64 {
	t.Helper()
	return b.insertInput(t, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(`{}`), Topic: topic})
}

// The topic an event names, or its default when it names none, is written with its row and
// read back by every read of it: the claims (batch and per row, at a steady rate and in a
// backlog), Admin's Get, GetByEventID and List, and a dead letter's reclaim.
func TestEventTopicIsStoredAndReadByEveryRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{}, "orders", "pay-ments_%|1")
	topics := []string{"", "orders", "pay-ments_%|1"}
	want := map[int64]string{}
	for i, topic := range topics {
		want[b.insertTopic(t, fmt.Sprintf("ORD-%d", i), topic)] = cmp.Or(topic, defaultTopic)
	}
	for id, topic := range want {
		assert.Equal(t, topic, b.column(t, id, "topic"), "the row of %d", id)
	}

	cands, err := b.store.Candidates(ctx, 10)
	require.NoError(t, err)
	require.Len(t, cands, 3)
	for _, ev := range cands {
		assert.Equal(t, want[ev.ID], ev.Topic, "candidate %d", ev.ID)
	}
	listed, err := b.admin().List(ctx, outbox.Filter{})
	require.NoError(t, err)
	require.Len(t, listed, 3)
	for _, ev := range listed {
		assert.Equal(t, want[ev.ID], ev.Topic, "listed %d", ev.ID)
	}
	for id, topic := range want {
		ev := b.get(t, id)
		assert.Equal(t, topic, ev.Topic, "Get %d", id)
		byEventID, err := b.admin().GetByEventID(ctx, ev.EventID)
		require.NoError(t, err)
		assert.Equal(t, topic, byEventID.Topic, "GetByEventID %d", id)
	}

	// The batch claim in a backlog (the first), then at a steady rate (from the floor).
	evs, _, err := claimDue(ctx, b.store, "a", 10, 1<<20)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	for _, ev := range evs {
		assert.Equal(t, want[ev.ID], ev.Topic, "claimed %d", ev.ID)
	}
	later := b.insertTopic(t, "ORD-LATER", "orders")
	evs, _, err = claimDue(ctx, b.store, "a", 10, 1<<20)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, later, evs[0].ID)
	assert.Equal(t, "orders", evs[0].Topic, "claimed at a steady rate")

	// A dead letter of the reclaim (past MaxReclaims) reaches OnDeadLetter with its topic.
	b.exec(t, "UPDATE {t} SET reclaim_count = 100 WHERE id = ?", later)
	b.ageClaim(t, later, time.Hour)
	dead := make(chan outbox.Event, 1)
	cfg := fastConfig("reclaimer", &logSink{})
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, _ error) { dead <- ev }
	p := newPublisher(t, b.store, newRecorder(), cfg)
	_, err = p.Reclaim(ctx)
	require.NoError(t, err)
	select {
	case ev := <-dead:
		assert.Equal(t, later, ev.ID)
		assert.Equal(t, "orders", ev.Topic, "the reclaim's dead letter")
	case <-time.After(30 * time.Second):
		t.Fatal("no dead letter from the reclaim")
	}
	require.NoError(t, p.Close())
}

// The per-row claim (ClaimPerRow) reads the topic too, unordered and in key order.
func TestPerRowCandidatesCarryTheTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
		b := topicSetup(t, outbox.MySQLConfig{Ordering: o}, "orders")
		id := b.insertTopic(t, "ORD-1", "orders")
		cands, err := b.store.Candidates(ctx, 10)
		require.NoError(t, err)
		require.Len(t, cands, 1)
		assert.Equal(t, id, cands[0].ID)
		assert.Equal(t, "orders", cands[0].Topic, "ordering %v", o)
		res := orderedClaimOrNot(t, b.store, o)
		require.Len(t, res, 1)
		assert.Equal(t, "orders", res[0].Topic, "batch claim, ordering %v", o)
	}
}

func orderedClaimOrNot(t *testing.T, s *outbox.MySQLStore, o outbox.Ordering) []outbox.Event {
	if o == outbox.Unordered {
		evs, _, err := claimDue(context.Background(), s, "a", 10, 1<<20)
		require.NoError(t, err)
		return evs
	}
	return orderedClaim(t, s, "a", o, 10).Events
}

// A topic outside MySQLConfig.Routes.Topics is refused at insert with an error wrapping
// ErrInvalidEvent that names it and the known topics; nothing is written, and the
// transaction goes on as after any invalid event: its other events commit.
func TestInsertEventRefusesATopicOutsideTheSet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		topics []string
		known  string
	}{
		{"with topics", []string{"orders", "payments"}, "ORDER_EVENT_TOPIC, orders, payments"},
		{"without topics", nil, "(ORDER_EVENT_TOPIC)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := topicSetup(t, outbox.MySQLConfig{}, c.topics...)
			tx, err := b.store.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{}`), Topic: "ordres"})
			require.ErrorIs(t, err, outbox.ErrInvalidEvent)
			t.Logf("InsertEvent: %v", err)
			assert.Contains(t, err.Error(), `"ordres"`)
			assert.Contains(t, err.Error(), c.known)
			_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-2", EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
			require.NoError(t, err, "the transaction is still usable")
			require.NoError(t, tx.Commit())
			evs, err := b.admin().List(ctx, outbox.Filter{})
			require.NoError(t, err)
			require.Len(t, evs, 1, "the refused event was not written")
			assert.Equal(t, "ORD-2", evs[0].BizNo)
		})
	}
}

// MySQLConfig.Routes' topics are RocketMQ topic names, none of the broker's own, none
// twice: anything else is refused by NewMySQLStore with an error wrapping ErrInvalidConfig
// that names the topic.
func TestMySQLConfigTopicsAreValidated(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:1)/none")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	for _, c := range []struct {
		topics []string
		names  string
	}{
		{[]string{""}, `""`},
		{[]string{"orders", "order.created"}, `"order.created"`},
		{[]string{"has space"}, `"has space"`},
		{[]string{strings.Repeat("t", 128)}, "1 to 127"},
		{[]string{"orders", "payments", "orders"}, `"orders" twice`},
		{[]string{"ORDER_EVENT_TOPIC"}, `"ORDER_EVENT_TOPIC" twice`},
		{[]string{"TBW102"}, "RocketMQ's own"},
		{[]string{"%RETRY%group"}, "RocketMQ's own"},
	} {
		_, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Routes: outbox.Routes{Topics: c.topics}})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "%q", c.topics)
		assert.Contains(t, err.Error(), c.names)
	}
	_, err = outbox.NewMySQLStore(db, outbox.MySQLConfig{Routes: outbox.Routes{Topics: []string{strings.Repeat("t", 127), "a%|_-Z9"}}})
	assert.NoError(t, err, "RocketMQ's longest name and every character it allows")
}

// checkingSender is a recorder whose Check answers err, and records the topics it was asked.
type checkingSender struct {
	*recorder
	err   error
	asked *[]string
}

func (s checkingSender) Check(_ context.Context, topics []string) error {
	*s.asked = append(*s.asked, topics...)
	return s.err
}

// Start asks the sender about every topic of the store (the default first), and refuses
// the start, with the sender's error, when the sender cannot send to one; a sender that
// cannot be asked (its broker down) is logged, and the publisher starts.
func TestStartAsksTheSenderAboutTheStoresTopics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{}, "orders", "payments")
	refusal := fmt.Errorf("%w: no broker has topic payments", outbox.ErrInvalidConfig)
	for _, c := range []struct {
		name    string
		err     error
		refused bool
	}{
		{"refused", refusal, true},
		{"cannot tell", errors.New("the name server does not answer"), false},
		{"fine", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var asked []string
			logs := &logSink{}
			p := newPublisher(t, b.store, checkingSender{newRecorder(), c.err, &asked}, fastConfig("topics-"+strings.ReplaceAll(c.name, " ", "-"), logs))
			defer func() { require.NoError(t, p.Close()) }()
			err := p.Start(ctx)
			assert.Equal(t, []string{defaultTopic, "orders", "payments"}, asked)
			if c.refused {
				require.ErrorIs(t, err, refusal)
				assert.Equal(t, 1, strings.Count(err.Error(), "payments"), "named once: %v", err)
				return
			}
			require.NoError(t, err)
			if c.err != nil {
				assert.Equal(t, 1, logs.count(slog.LevelWarn, "outbox: could not check the sender's topics"))
			}
		})
	}
	// The kit's sender made with topics refuses the others as the broker would.
	mem := outboxtest.NewMemorySender(defaultTopic, "orders")
	p := newPublisher(t, b.store, mem, fastConfig("topics-mem", &logSink{}))
	err := p.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "no topic payments")
	require.NoError(t, p.Close())
}

// A table made before the topic column is refused by Check (so by Start) and CreateSchema
// with an error wrapping ErrInvalidConfig that gives the ALTER TABLE; the ALTER, run as the
// error gives it, is instant (the server accepts it with ALGORITHM=INSTANT), and the table
// then serves the store: the old rows go to the default topic, which their claim writes on
// them, new ones carry theirs.
func TestTableWithoutTopicColumnGetsItsAlterFromCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{}, "orders")
	old := b.insert(t, 1)[0]
	b.exec(t, "ALTER TABLE {t} DROP COLUMN topic") // the layout before topics

	_, err := b.store.Check(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	t.Logf("Check: %v", err)
	assert.Contains(t, err.Error(), "docs/upgrading.md")
	require.ErrorIs(t, b.store.CreateSchema(ctx), outbox.ErrInvalidConfig)
	rec := newRecorder()
	p := newPublisher(t, b.store, rec, fastConfig("old-table", &logSink{}))
	require.ErrorIs(t, p.Start(ctx), outbox.ErrInvalidConfig, "Start refuses the table")

	_, alter, ok := strings.Cut(err.Error(), "run: ")
	require.True(t, ok)
	alter, _, ok = strings.Cut(alter, ";")
	require.True(t, ok)
	table := outbox.TableForTest(b.store)
	assert.Equal(t, "ALTER TABLE `"+table+"` ADD COLUMN topic VARCHAR(127) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '' AFTER trace_state",
		alter, "docs/upgrading.md's statement")
	_, err = b.db.ExecContext(ctx, alter+", ALGORITHM=INSTANT")
	require.NoError(t, err)

	_, err = b.store.Check(ctx)
	require.NoError(t, err)
	require.NoError(t, b.store.CreateSchema(ctx))
	later := b.insertTopic(t, "ORD-NEW", "orders")
	require.NoError(t, p.Start(ctx))
	require.Eventually(t, func() bool { return rec.count(old) == 1 && rec.count(later) == 1 }, 30*time.Second, 5*time.Millisecond)
	require.NoError(t, p.Close())
	topics := map[int64]string{}
	for _, ev := range rec.evs {
		topics[ev.ID] = ev.Topic
	}
	assert.Equal(t, map[int64]string{old: defaultTopic, later: "orders"}, topics)
	assert.Equal(t, defaultTopic, b.column(t, old, "topic"), "the claim wrote the old row's topic")
}

// Filter.Topics selects by topic for List, RequeueFailed and its dry run's count; a row a
// plain INSERT wrote without a topic is selected by the topic its routes give it; a topic
// that is no topic name ("" among them) is refused with ErrInvalidInput.
func TestFilterTopics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{Routes: outbox.Routes{ByType: map[string]string{"PAID": "payments"}}}, "orders", "payments")
	ids := map[string]int64{}
	for _, topic := range []string{"", "orders", "payments"} {
		ids[topic] = b.insertTopic(t, "ORD-"+topic, topic)
	}
	// A plain INSERT of a routed type that names no topic: the filter resolves it.
	b.exec(t, "INSERT INTO {t} (biz_no, event_type, payload) VALUES ('ORD-PLAIN', 'PAID', '{}')")
	ids["plain"] = b.lastID(t)
	b.exec(t, "UPDATE {t} SET status = 'FAIL'")
	list := func(f outbox.Filter) []int64 {
		evs, err := b.admin().List(ctx, f)
		require.NoError(t, err)
		var got []int64
		for _, ev := range evs {
			got = append(got, ev.ID)
		}
		return got
	}
	assert.Equal(t, []int64{ids["orders"]}, list(outbox.Filter{Topics: []string{"orders"}}))
	assert.Equal(t, []int64{ids["plain"], ids["payments"], ids[""]}, list(outbox.Filter{Topics: []string{defaultTopic, "payments"}}))
	assert.Equal(t, []int64{ids["plain"], ids["payments"]}, list(outbox.Filter{Topics: []string{"payments"}}), "the plain INSERT by its type's route")
	assert.Len(t, list(outbox.Filter{}), 4)
	assert.Empty(t, list(outbox.Filter{Topics: []string{"shipments"}}))
	assert.Equal(t, "payments", b.get(t, ids["plain"]).Topic, "Get resolves it too")

	n, err := b.admin().RequeueFailed(ctx, outbox.Filter{Topics: []string{"payments", defaultTopic}}, outbox.RequeueOptions{DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the dry run's count")
	n, err = b.admin().RequeueFailed(ctx, outbox.Filter{Topics: []string{"payments"}}, outbox.RequeueOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, outbox.StatusWait, b.get(t, ids["payments"]).Status)
	assert.Equal(t, outbox.StatusWait, b.get(t, ids["plain"]).Status)
	assert.Equal(t, outbox.StatusFail, b.get(t, ids["orders"]).Status)
	assert.Equal(t, outbox.StatusFail, b.get(t, ids[""]).Status)

	for _, bad := range []string{"no.dots", ""} {
		_, err = b.admin().List(ctx, outbox.Filter{Topics: []string{bad}})
		assert.ErrorIs(t, err, outbox.ErrInvalidInput, "%q", bad)
	}
}

// Key order is per biz no across topics: a key's events are claimed in id order whatever
// topic each names, and a later event of another topic waits for the key's earlier one.
func TestKeyOrderSpansTopics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder}, "orders", "payments")
	var ids []int64
	for _, topic := range []string{"orders", "payments", "orders", "payments"} {
		ids = append(ids, b.insertTopic(t, "ORD-1", topic))
	}
	// One at a time: each claim may take only the key's head, whatever its topic.
	for i, id := range ids {
		res := orderedClaim(t, b.store, "a", outbox.KeyOrder, 1)
		require.Len(t, res.Events, 1, "claim %d", i)
		assert.Equal(t, id, res.Events[0].ID, "claim %d takes the key's next event", i)
		// While it is SENDING, nothing of the key is claimed, in either topic.
		more := orderedClaim(t, b.store, "b", outbox.KeyOrder, 10)
		assert.Empty(t, more.Events, "claim %d: the key's next event waits for %d", i, id)
		_, err := b.store.MarkSuccess(ctx, []int64{id}, "a")
		require.NoError(t, err)
	}
	// All at once: the key's events in id order, both topics in one run.
	b2 := topicSetup(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder}, "orders", "payments")
	var want []int64
	for _, topic := range []string{"payments", "orders", "payments"} {
		want = append(want, b2.insertTopic(t, "ORD-2", topic))
	}
	res := orderedClaim(t, b2.store, "a", outbox.KeyOrder, 10)
	assert.Equal(t, want, idsOf(res.Events))
	assert.Equal(t, []string{"payments", "orders", "payments"}, []string{res.Events[0].Topic, res.Events[1].Topic, res.Events[2].Topic})
}

// A dead letter can be requeued to another topic of the store's set, one by id or all a
// filter selects: it goes out to that topic, and its row says so; a topic outside the set
// is refused, naming the set, and nothing changes. In key order it keeps its place: it is
// sent before the events of its biz no behind it, which then follow.
func TestRequeueToAnotherTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder}, "orders", "payments")
	// A plain INSERT's typo, dead-lettered at its send, with an event of its key behind it.
	b.exec(t, "INSERT INTO {t} (biz_no, event_type, payload, topic) VALUES ('ORD-1', 'ORDER_PAID', '{}', 'paymnets')")
	typo := b.lastID(t)
	behind := b.insertTopic(t, "ORD-1", "orders")
	other := b.insertTopic(t, "ORD-2", "orders")
	rec := newRecorder()
	p := newPublisher(t, b.store, rec, fastConfig("requeue-to", &logSink{}))
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, stats.DeadLettered)
	require.Equal(t, outbox.StatusFail, b.get(t, typo).Status)
	assert.Equal(t, outbox.StatusWait, b.get(t, behind).Status, "the key stops at its dead letter")
	assert.Equal(t, outbox.StatusSuccess, b.get(t, other).Status)

	admin := b.admin()
	err = admin.RequeueTo(ctx, typo, "paymentz")
	require.ErrorIs(t, err, outbox.ErrInvalidInput)
	assert.ErrorContains(t, err, "ORDER_EVENT_TOPIC, orders, payments")
	_, err = admin.RequeueFailed(ctx, outbox.Filter{IDs: []int64{typo}}, outbox.RequeueOptions{Topic: "paymentz"})
	require.ErrorIs(t, err, outbox.ErrInvalidInput)
	require.Equal(t, outbox.StatusFail, b.get(t, typo).Status, "a refused requeue changes nothing")
	require.ErrorIs(t, admin.RequeueTo(ctx, other, "payments"), outbox.ErrNotDeadLetter)
	assert.Equal(t, "orders", b.get(t, other).Topic, "nothing changed")

	require.NoError(t, admin.RequeueTo(ctx, typo, "payments"))
	ev := b.get(t, typo)
	assert.Equal(t, outbox.StatusWait, ev.Status)
	assert.Equal(t, "payments", ev.Topic)
	for range 3 { // the requeued one, then the one behind it (due before it, now its key's head)
		_, err = p.PublishPending(ctx)
		require.NoError(t, err)
	}
	assert.Equal(t, outbox.StatusSuccess, b.get(t, behind).Status)
	var order []int64
	for _, e := range rec.events() {
		if e.BizNo == "ORD-1" {
			order = append(order, e.ID)
			if e.ID == typo {
				assert.Equal(t, "payments", e.Topic, "sent to the topic it was requeued to")
			}
		}
	}
	assert.Equal(t, []int64{typo, behind}, order, "key order kept")

	// By filter: every dead letter it selects goes to the topic.
	b.exec(t, "UPDATE {t} SET status = 'FAIL' WHERE id IN (?, ?)", behind, other)
	n, err := admin.RequeueFailed(ctx, outbox.Filter{Topics: []string{"orders"}}, outbox.RequeueOptions{Topic: "payments"})
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, "payments", b.get(t, behind).Topic)
	assert.Equal(t, "payments", b.get(t, other).Topic)
	_, err = admin.SkipFailed(ctx, outbox.Filter{}, outbox.RequeueOptions{Topic: "payments"})
	require.ErrorIs(t, err, outbox.ErrInvalidInput, "a skip sends nothing")
}

// Under KeyOrder a dead letter stops its biz no in every topic: PAID (its own topic) is
// refused for good, and SHIPPED (another topic), written after it, waits for a person,
// whether it was claimed with it or later; other biz nos go on. Under
// KeyOrderSkipDeadLetters the dead letter blocks nothing: SHIPPED goes on without it.
func TestDeadLetterStopsItsKeyInEveryTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		b := topicSetup(t, outbox.MySQLConfig{Ordering: o, Routes: outbox.Routes{ByType: map[string]string{"ORDER_PAID": "PAY", "ORDER_SHIPPED": "SHIP"}}},
			"PAY", "SHIP")
		ids := map[string]int64{}
		for _, biz := range []string{"ORD-1", "ORD-2"} {
			for _, typ := range []string{"ORDER_CREATED", "ORDER_PAID", "ORDER_SHIPPED"} {
				ids[biz+"/"+typ] = b.insertInput(t, outbox.EventInput{BizNo: biz, EventType: typ, Payload: []byte("{}")})
			}
		}
		later := b.insertInput(t, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_SHIPPED", Payload: []byte(`{"again":1}`)})
		rec := newRecorder()
		rec.fail = func(ev outbox.Event) error {
			if ev.BizNo == "ORD-1" && ev.EventType == "ORDER_PAID" {
				return outbox.Permanent(errors.New("the broker refused the message"))
			}
			return nil
		}
		p := newPublisher(t, b.store, rec, fastConfig("dead-key-"+o.String(), &logSink{}))
		for range 5 {
			_, err := p.PublishPending(ctx)
			require.NoError(t, err)
		}
		assert.Equal(t, outbox.StatusSuccess, b.get(t, ids["ORD-1/ORDER_CREATED"]).Status, "%s", o)
		assert.Equal(t, outbox.StatusFail, b.get(t, ids["ORD-1/ORDER_PAID"]).Status, "%s", o)
		for _, typ := range []string{"ORDER_CREATED", "ORDER_PAID", "ORDER_SHIPPED"} {
			assert.Equal(t, outbox.StatusSuccess, b.get(t, ids["ORD-2/"+typ]).Status, "%s: another biz no goes on", o)
		}
		for _, id := range []int64{ids["ORD-1/ORDER_SHIPPED"], later} {
			if o == outbox.KeyOrder {
				assert.Equal(t, outbox.StatusWait, b.get(t, id).Status, "%s: event %d waits behind the dead letter, in another topic", o, id)
				assert.Zero(t, rec.count(id), "%s: never sent", o)
			} else {
				assert.Equal(t, outbox.StatusSuccess, b.get(t, id).Status, "%s: event %d goes on without the dead letter", o, id)
			}
		}
		require.NoError(t, p.Close())
	}
}
