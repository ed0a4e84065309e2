package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// An event's topic reaches the sender from the relay: from the binlog's row image (written
// by InsertEvent, and by a plain SQL INSERT that names it) and from the table (an event that
// was waiting when the relay took over). A plain INSERT that names none goes where the
// routes send its type, and the relay writes that topic on its row; one that names a topic
// outside the routes is dead-lettered, naming it.
func TestRelayCarriesTheEventsTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvConfig(t, newServer(t), outbox.MySQLConfig{Routes: outbox.Routes{Topics: []string{"orders", "payments"},
		ByType: map[string]string{"REFUND": "payments"}}})
	var (
		mu  sync.Mutex
		got = map[string]string{} // event id -> topic sent to
	)
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		got[ev.EventID] = ev.Topic
		return nil
	})
	insert := func(bizNo, topic string) string {
		tx, err := e.store.BeginTx(ctx, nil)
		require.NoError(t, err)
		id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(`{}`), Topic: topic})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		return id
	}
	want := map[string]string{insert("before", "payments"): "payments"} // waiting at the takeover
	r, _ := start(t, e.dsn, sender, e.config("relay-topic"))
	waitLeader(t, r)
	want[insert("go-1", "orders")] = "orders"
	want[insert("go-2", "")] = "ORDER_EVENT_TOPIC"
	_, err := e.db.Exec("INSERT INTO " + e.table + " (biz_no, event_type, payload, topic) VALUES ('plain-1', 'ORDER_CREATED', '{}', 'payments')")
	require.NoError(t, err)
	var plain string
	require.NoError(t, e.db.QueryRow("SELECT event_id FROM "+e.table+" WHERE biz_no = 'plain-1'").Scan(&plain))
	want[plain] = "payments"
	_, err = e.db.Exec("INSERT INTO " + e.table + " (biz_no, event_type, payload) VALUES ('plain-2', 'REFUND', '{}')")
	require.NoError(t, err)
	var routed string
	require.NoError(t, e.db.QueryRow("SELECT event_id FROM "+e.table+" WHERE biz_no = 'plain-2'").Scan(&routed))
	want[routed] = "payments"
	_, err = e.db.Exec("INSERT INTO " + e.table + " (biz_no, event_type, payload, topic) VALUES ('plain-3', 'ORDER_CREATED', '{}', 'ordres')")
	require.NoError(t, err)

	waitFor(t, 60*time.Second, "every event sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == len(want)
	})
	waitFor(t, 60*time.Second, "the typo dead-lettered", func() bool { return e.statuses(t)["FAIL"] == 1 })
	var topic, lastErr string
	require.NoError(t, e.db.QueryRow("SELECT topic FROM "+e.table+" WHERE biz_no = 'plain-2'").Scan(&topic))
	assert.Equal(t, "payments", topic, "the relay wrote the topic it sent the plain INSERT's row to")
	require.NoError(t, e.db.QueryRow("SELECT last_error FROM "+e.table+" WHERE biz_no = 'plain-3'").Scan(&lastErr))
	assert.Contains(t, lastErr, `"ordres"`)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, want, got)
	st := r.Stats()
	t.Logf("relay stats: sent %d, swept %d", st.Sent, st.Swept)
}

// A relay refuses an outbox table made before the topic column with the ALTER TABLE that
// adds it, and starts once the ALTER, run as the error gives it, has added it.
func TestRelayRefusesATableWithoutTheTopicColumnNamingTheAlter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, newServer(t), outbox.Unordered)
	_, err := e.db.Exec("ALTER TABLE `" + e.table + "` DROP COLUMN topic")
	require.NoError(t, err)
	r, err := relay.New(e.dsn, outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }), e.config("relay-topic-alter"))
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	err = r.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	t.Logf("Start: %v", err)
	_, alter, ok := strings.Cut(err.Error(), "run: ")
	require.True(t, ok)
	alter, _, ok = strings.Cut(alter, ";")
	require.True(t, ok)
	_, err = e.db.Exec(alter + ", ALGORITHM=INSTANT")
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	require.NoError(t, r.Stop(ctx))
}
