package outbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// RocketMQ splits a message's keys on spaces: a message sent with the key "A B" is found by
// a lookup of "A" and of "B", never of "A B". So a biz no with a space is refused at insert,
// and one without is the message's one key: the broker's index finds the message by the
// whole biz no, and by no part of it.
func TestRocketMQBizNoIsExactlyOneKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_KEYS")
	b.routeTo(topic)
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, biz := range []string{"ORD 1", " ORD-1", "ORD-1 ", "ORD\u00a01", "ORD\u30001"} {
		_, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: biz, EventType: "ORDER_CREATED", Payload: []byte("{}")})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, "biz no %q", biz)
		assert.Contains(t, err.Error(), "BizNo")
		assert.Contains(t, err.Error(), "space")
	}
	for _, typ := range []string{"ORDER CREATED", "ORDER||PAID", "*"} {
		_, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: typ, Payload: []byte("{}")})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent, "event type %q", typ)
		assert.Contains(t, err.Error(), "EventType")
	}

	// The biz no is unique to this test, so that the broker's index holds it once.
	biz := "ORD-" + strings.TrimPrefix(testsvc.UniqueTable("k"), "k_") + "-X|Y"
	_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: biz, EventType: "ORDER|PAID", Payload: []byte("{}")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	consumer := testsvc.Consume(t, topic)
	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("order-keys", &logSink{}))
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, stats.Sent)
	consumer.WaitDistinct(t, 1, 60*time.Second)
	m := consumer.Messages()[0]
	assert.Equal(t, biz, m.GetKeys())
	assert.Equal(t, "ORDER|PAID", m.GetTags())

	// The broker indexes keys after storing the message: wait until the lookup finds it.
	query := func(key string) bool {
		found, err := testsvc.QueryByKey(t, topic, key)
		assert.NoError(t, err)
		return found
	}
	require.Eventually(t, func() bool { return query(biz) }, 30*time.Second, 200*time.Millisecond,
		"a lookup of the whole biz no finds the message")
	for _, part := range []string{"ORD", "X", "Y", "X|Y", strings.SplitN(biz, "-", 3)[1]} {
		assert.False(t, query(part), "a lookup of %q finds nothing", part)
	}

	// What the refusal prevents, on the same broker: a message whose key has a space is
	// indexed under each part and not under the whole.
	spaced := "ORD-" + strings.TrimPrefix(testsvc.UniqueTable("k"), "k_")
	require.NoError(t, newFastRocketMQSender(t).Send(ctx,
		[]outbox.Event{{EventID: "spaced", BizNo: spaced + " B", EventType: "E", Payload: []byte("{}"), Topic: topic}}, false)[0])
	require.Eventually(t, func() bool { return query(spaced) && query("B") }, 30*time.Second, 200*time.Millisecond,
		"each part of a key with a space finds the message")
	assert.False(t, query(spaced+" B"), "the whole key with a space finds nothing")
}
