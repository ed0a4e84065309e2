package outbox_test

import (
	"context"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// RocketMQMessage describes the very message the sender sends: the same topic (the event's)
// and the same properties, with CloudEvents on, in key order and not; and it refuses what
// the sender refuses.
func TestRocketMQMessageIsWhatTheSenderSends(t *testing.T) {
	t.Parallel()
	cfg := outbox.RocketMQConfig{CloudEventsSource: "/order-service"}
	evs := []outbox.Event{
		{ID: 1, EventID: "0192d3a4-0000-7000-8000-000000000001", BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{}`), Topic: "T"},
		{ID: 2, EventID: "0192d3a4-0000-7000-8000-000000000002", BizNo: "ORD-1", EventType: "ORDER_PAID", Payload: []byte(`{}`), Topic: "T_PAY",
			TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "vendor=x"},
		{ID: 3, EventID: "0192d3a4-0000-7000-8000-000000000003", BizNo: "ORD-2", EventType: "ORDER_SHIPPED", Payload: []byte(`{"a":1}`), Topic: "T_SHIP"},
	}
	for _, keyOrder := range []bool{false, true} {
		fp := &fakeProducer{res: &primitive.SendResult{Status: primitive.SendOK}}
		s, err := outbox.NewRocketMQSenderWithProducerForTest(cfg, fp)
		require.NoError(t, err)
		for _, ev := range evs {
			require.NoError(t, s.Send(context.Background(), []outbox.Event{ev}, keyOrder)[0])
		}
		require.Len(t, fp.msgs, len(evs))
		for i, ev := range evs {
			topic, props, err := outbox.RocketMQMessage(cfg, ev, keyOrder)
			require.NoError(t, err)
			assert.Equal(t, fp.msgs[i].Topic, topic, "event %d", ev.ID)
			assert.Equal(t, fp.msgs[i].GetProperties(), props, "event %d", ev.ID)
			assert.Equal(t, ev.EventID, props[outbox.PropertyEventID])
			assert.Equal(t, ev.EventID, props["CE_id"])
			if keyOrder {
				assert.Equal(t, ev.BizNo, props[primitive.PropertyShardingKey])
			} else {
				assert.NotContains(t, props, primitive.PropertyShardingKey)
			}
		}
		assert.Equal(t, []string{"T", "T_PAY", "T_SHIP"}, []string{fp.msgs[0].Topic, fp.msgs[1].Topic, fp.msgs[2].Topic})
	}

	_, _, err := outbox.RocketMQMessage(cfg, outbox.Event{EventID: "x", EventType: "E", BizNo: "B", Payload: nil, Topic: "T"}, false)
	require.Error(t, err)
	assert.True(t, outbox.IsPermanent(err), "the error its send fails with")
	assert.Contains(t, err.Error(), "payload is empty")
	_, _, err = outbox.RocketMQMessage(outbox.RocketMQConfig{CloudEventsSource: "a b"}, evs[0], false)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}
