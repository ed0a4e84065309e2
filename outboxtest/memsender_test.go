package outboxtest_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/outboxtest"
)

// The MemorySender is the wire, and refuses what a RocketMQ broker refuses: an event without
// a topic, an empty payload and one over MaxMessageBytes (4 MiB by default) as Permanent;
// made with topics, it knows those alone: Check refuses the others in one error wrapping
// ErrInvalidConfig, and a send to one fails as Unavailable (no route). In key order a biz no
// whose event it refused goes no further in the call; the other events are recorded.
func TestMemorySenderRefusesWhatTheBrokerRefuses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ev := func(bizNo, topic string, payload []byte) outbox.Event {
		return outbox.Event{EventID: bizNo + "-" + topic, BizNo: bizNo, EventType: "ORDER_CREATED", Topic: topic, Payload: payload}
	}

	sent := outboxtest.NewMemorySender()
	errs := sent.Send(ctx, []outbox.Event{
		ev("ORD-1", "", []byte("{}")),
		ev("ORD-2", "ORDERS", nil),
		ev("ORD-3", "ORDERS", make([]byte, 4<<20+1)),
		ev("ORD-4", "ORDERS", make([]byte, 4<<20)),
		ev("ORD-5", "ANY_TOPIC", []byte("{}")),
	}, false)
	for i, err := range errs[:3] {
		assert.True(t, outbox.IsPermanent(err), "event %d: %v", i, err)
	}
	assert.NoError(t, errs[3], "a payload of 4 MiB is taken")
	assert.NoError(t, errs[4], "made without topics, it takes any")
	assert.Equal(t, 2, sent.Len())
	assert.NoError(t, sent.Check(ctx, []string{"ANY_TOPIC"}))

	small := outboxtest.NewMemorySender()
	small.MaxMessageBytes = 10
	errs = small.Send(ctx, []outbox.Event{ev("ORD-1", "ORDERS", []byte("0123456789")), ev("ORD-2", "ORDERS", []byte("0123456789a"))}, false)
	assert.NoError(t, errs[0])
	assert.True(t, outbox.IsPermanent(errs[1]), "%v", errs[1])

	known := outboxtest.NewMemorySender("ORDERS", "PAYMENTS")
	err := known.Check(ctx, []string{"ORDERS", "SHIPMENTS", "PAYMENTS", "REFUNDS"})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "SHIPMENTS, REFUNDS")
	assert.NoError(t, known.Check(ctx, []string{"PAYMENTS", "ORDERS"}))
	errs = known.Send(ctx, []outbox.Event{
		ev("ORD-1", "SHIPMENTS", []byte("{}")),
		ev("ORD-1", "ORDERS", []byte("{}")),
		ev("ORD-2", "ORDERS", []byte("{}")),
	}, true)
	assert.True(t, outbox.IsUnavailable(errs[0]), "%v", errs[0])
	assert.ErrorContains(t, errs[0], "no route")
	assert.ErrorIs(t, errs[1], outbox.ErrNotSent, "in key order ORD-1 goes no further")
	assert.NoError(t, errs[2], "ORD-2 goes on")
	assert.Equal(t, []string{"ORD-2"}, bizNos(known.Events()))
}

func bizNos(evs []outbox.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.BizNo)
	}
	return out
}
