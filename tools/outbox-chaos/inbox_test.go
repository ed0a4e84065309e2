package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// TestConsumersHalf runs the consumer processes' handler and outcome counter through a real
// inbox on the test database, as the push consumer calls them: a delivery handled writes one
// effect row, its redelivery is a duplicate that writes none, a message of another run is
// acknowledged with no effect, and every outcome is recorded with its event. It also checks
// the chaos run's queries on the effects and rejected tables.
func TestConsumersHalf(t *testing.T) {
	db := testsvc.OpenDB(t)
	ctx := context.Background()
	c := &chaos{db: db, effects: testsvc.UniqueTable("chaos_effects"), inbox: testsvc.UniqueTable("chaos_inbox"),
		group: "outbox_chaos_test"}
	t.Cleanup(func() {
		for _, tb := range []string{c.effects, c.inbox, c.inbox + "_rejected"} {
			_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+tb+"`")
		}
	})
	require.NoError(t, c.createInboxSchema(ctx))

	dir := t.TempDir()
	recs, err := openOutcomeLog(filepath.Join(dir, "c01.inbox"), "c01")
	require.NoError(t, err)
	defer recs.close()
	in, err := inbox.New(db, inbox.Config{Group: c.group, Table: c.inbox, MeterProvider: outcomeMeter{log: recs}})
	require.NoError(t, err)
	h := effectHandler(consumeOptions{effects: c.effects, tag: "run1", instance: "c01"}, recs)

	deliver := func(biz, eventID string) inbox.Outcome {
		m := &primitive.MessageExt{Message: primitive.Message{Topic: "T", Body: []byte("{}")}, MsgId: "M-" + biz}
		m.WithProperty(outbox.PropertyBizNo, biz)
		m.WithProperty(outbox.PropertyEventID, eventID)
		// The push consumer's context, as it calls the consumer with one message.
		mctx := primitive.WithConsumerCtx(ctx, &primitive.ConsumeMessageContext{Msgs: []*primitive.MessageExt{m}})
		msg := &inbox.Message{EventID: eventID, BizNo: biz, Body: m.Body, Topic: "T", MsgID: m.MsgId, Deliveries: 1,
			Properties: m.GetProperties(), BornAt: time.Now().Add(-time.Millisecond)}
		o, err := in.Handle(mctx, msg, h)
		require.NoError(t, err)
		return o
	}
	e1, e2 := uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String()
	before := time.Now().Add(-time.Second)
	assert.Equal(t, inbox.Handled, deliver("run1-1", e1))
	assert.Equal(t, inbox.Duplicate, deliver("run1-1", e1))
	assert.Equal(t, inbox.Handled, deliver("other-1", e2), "another run's message: handled, no effect")

	effects, err := c.readEffects(ctx)
	require.NoError(t, err)
	require.Len(t, effects, 1)
	assert.Equal(t, effect{EventID: e1, BizNo: "run1-1", Consumer: "c01", Born: effects[0].Born, At: effects[0].At}, effects[0])
	assert.WithinDuration(t, time.Now(), effects[0].At, time.Minute)
	assert.WithinDuration(t, effects[0].At, effects[0].Born, time.Second)
	n, err := c.effectsDistinct(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	ok, err := c.effectAfter(ctx, before)
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = c.effectAfter(ctx, time.Now().Add(time.Minute))
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = c.effectAfter(ctx, effects[0].Born.Add(time.Millisecond))
	require.NoError(t, err)
	assert.False(t, ok, "written after t, but born before it")
	rejected, err := c.countRejected(ctx)
	require.NoError(t, err)
	assert.Zero(t, rejected)

	// No unique key on the event: a doubled effect is a second row, which the report counts.
	_, err = db.ExecContext(ctx, "INSERT INTO `"+c.effects+"` (event_id, biz_no, consumer, msg_id, deliveries, born_at, effect_at) VALUES (?, 'run1-1', 'x', '', 1, NOW(3), NOW(6))", e1)
	require.NoError(t, err)
	n, err = c.effectsDistinct(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	effects, err = c.readEffects(ctx)
	require.NoError(t, err)
	assert.Len(t, effects, 2)

	f, err := os.Open(filepath.Join(dir, "c01.inbox"))
	require.NoError(t, err)
	defer f.Close()
	got, bad, err := parseRecords(f)
	require.NoError(t, err)
	assert.Zero(t, bad)
	type rec struct{ Kind, BizNo, EventID string }
	var kinds []rec
	for _, r := range got {
		assert.Equal(t, "c01", r.Instance)
		kinds = append(kinds, rec{r.Kind, r.BizNo, r.Detail})
	}
	assert.Equal(t, []rec{
		{kindHandle, "run1-1", e1},
		{kindInboxPrefix + "handled", "run1-1", e1},
		{kindInboxPrefix + "duplicate", "run1-1", e1},
		{kindInboxPrefix + "handled", "other-1", e2},
	}, kinds)
}
