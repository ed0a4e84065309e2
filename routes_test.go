package outbox_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// Changing a route moves only the rows that name no topic yet: a row InsertEvent wrote keeps
// the topic it was given at insert, while a row a plain INSERT wrote without one goes where
// the routes of the store that claims it send its type (Admin reads it so before the claim),
// and the claim writes that topic on it.
func TestChangingARouteMovesOnlyRowsWithoutATopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{Routes: outbox.Routes{ByType: map[string]string{"ORDER_PAID": "payments"}}}, "payments", "billing")
	written := b.insertInput(t, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_PAID", Payload: []byte(`{}`)})
	b.exec(t, "INSERT INTO {t} (biz_no, event_type, payload) VALUES ('ORD-2', 'ORDER_PAID', '{}')")
	plain := b.lastID(t)
	require.Equal(t, "payments", b.column(t, written, "topic"), "InsertEvent writes the topic it resolves")
	require.Empty(t, b.column(t, plain, "topic"), "a plain INSERT names none")

	// The same table, with ORDER_PAID routed to billing now.
	moved, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store),
		Routes: outbox.Routes{Topics: []string{"payments", "billing"}, ByType: map[string]string{"ORDER_PAID": "billing"}}})
	require.NoError(t, err)
	for id, want := range map[int64]string{written: "payments", plain: "billing"} {
		ev, err := outbox.NewAdmin(moved).Get(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, want, ev.Topic, "Admin reads row %d", id)
	}
	rec := newRecorder()
	p := newPublisher(t, moved, rec, fastConfig("moved-route", &logSink{}))
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	assert.Equal(t, 2, stats.Sent)
	topics := map[int64]string{}
	for _, ev := range rec.events() {
		topics[ev.ID] = ev.Topic
	}
	assert.Equal(t, map[int64]string{written: "payments", plain: "billing"}, topics, "the topic each was sent to")
	assert.Equal(t, "billing", b.column(t, plain, "topic"), "the claim wrote the new route's topic on the row")
	assert.Equal(t, "payments", b.column(t, written, "topic"))
}
