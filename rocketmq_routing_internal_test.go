package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// topicProducer records every SendSync call's topics and answers by fail's verdict for the
// call's topic.
type topicProducer struct {
	scriptedProducer
	mu    sync.Mutex
	sends map[string][]int // topic -> messages per call
	mixed bool             // a call carried messages of two topics
}

func newTopicProducer(fail func(topic string, msgs []*primitive.Message) error) *topicProducer {
	p := &topicProducer{sends: map[string][]int{}}
	p.respond = func(_ context.Context, _ int, msgs []*primitive.Message) (*primitive.SendResult, error) {
		topic := msgs[0].Topic
		p.mu.Lock()
		for _, m := range msgs {
			p.mixed = p.mixed || m.Topic != topic
		}
		p.sends[topic] = append(p.sends[topic], len(msgs))
		p.mu.Unlock()
		if fail != nil {
			if err := fail(topic, msgs); err != nil {
				return nil, err
			}
		}
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}
	return p
}

func routedSender(t *testing.T, p *topicProducer, cfg RocketMQConfig) *RocketMQSender {
	t.Helper()
	s, err := newRocketMQSender(cfg)
	require.NoError(t, err)
	s.producer = p
	return s
}

// routedEvents are n events over the topics in turn, three biz nos.
func routedEvents(n int, topics ...string) []Event {
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{ID: int64(i + 1), EventID: fmt.Sprintf("e%d", i+1), BizNo: fmt.Sprintf("ORD-%d", i%3), EventType: "E",
			Payload: []byte("{}"), Topic: topics[i%len(topics)]}
	}
	return evs
}

// A batch that spans topics goes in one send per topic (the client's batch takes one topic),
// never one send of two topics; the size limit still cuts each topic's batch.
func TestRoutedBatchOneSendPerTopic(t *testing.T) {
	t.Parallel()
	p := newTopicProducer(nil)
	s := routedSender(t, p, RocketMQConfig{})
	evs := routedEvents(40, "D", "A", "B", "C")
	assert.Equal(t, make([]error, 40), s.Send(context.Background(), evs, false))
	assert.False(t, p.mixed)
	assert.Equal(t, map[string][]int{"D": {10}, "A": {10}, "B": {10}, "C": {10}}, p.sends)

	big := newTopicProducer(nil)
	s = routedSender(t, big, RocketMQConfig{MaxBatchBytes: 1 << 20})
	evs = routedEvents(6, "D", "A")
	for i := range evs {
		evs[i].Payload = make([]byte, 400<<10)
	}
	assert.Equal(t, make([]error, 6), s.Send(context.Background(), evs, false))
	assert.Equal(t, map[string][]int{"D": {2, 1}, "A": {2, 1}}, big.sends, "400 KiB events, 1 MiB batches, per topic")
}

// A topic whose send fails (unavailable: no route; refused as illegal) fails its own events
// alone, in both claim modes: the other topics' events are sent, and an unavailable topic's
// later sends are not tried.
func TestRoutedBatchTopicFailsAlone(t *testing.T) {
	t.Parallel()
	noRoute := errors.New("the topic=B route info not found")
	illegal := errors.New("CODE: 13, DESC: the message is illegal")
	for _, keyOrder := range []bool{false, true} {
		p := newTopicProducer(func(topic string, msgs []*primitive.Message) error {
			switch topic {
			case "B":
				return noRoute
			case "C":
				for _, m := range msgs {
					if m.GetProperty(PropertyEventID) == "e3" {
						return illegal
					}
				}
			}
			return nil
		})
		s := routedSender(t, p, RocketMQConfig{MaxBatchBytes: 1 << 20})
		evs := routedEvents(30, "A", "B", "C")
		for i := range evs {
			evs[i].Payload = make([]byte, 300<<10) // a topic's ten events go in three sends
		}
		errs := s.Send(context.Background(), evs, keyOrder)
		for i, err := range errs {
			switch {
			case evs[i].Topic == "B":
				require.Error(t, err, "key order %v, event %d", keyOrder, i)
				assert.True(t, IsUnavailable(err) || errors.Is(err, ErrNotSent), "key order %v, event %d: %v", keyOrder, i, err)
			case evs[i].EventID == "e3":
				assert.True(t, IsPermanent(err), "key order %v: the illegal one: %v", keyOrder, err)
			case evs[i].Topic == "C" && keyOrder && evs[i].BizNo == evs[2].BizNo && i > 2:
				assert.ErrorIs(t, err, ErrNotSent, "key order: the illegal one's later events of its topic and biz no")
			default:
				assert.NoError(t, err, "key order %v, event %d (topic %q)", keyOrder, i, evs[i].Topic)
			}
		}
		if !keyOrder {
			assert.Equal(t, []int{3}, p.sends["B"], "the unavailable topic is tried once: its other sends are not")
		}
	}
}

// Every routing setting out of range is refused by the store's constructor, wrapping
// ErrInvalidConfig and naming what is wrong; the set is kept once each, the default first.
func TestRoutesRejectBadConfig(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		routes Routes
		says   string
	}{
		"bad name":           {Routes{Topics: []string{"ORDERS", "PAY MENTS"}}, `"PAY MENTS"`},
		"too long":           {Routes{Topics: []string{string(make([]byte, 128))}}, "1 to 127"},
		"empty":              {Routes{Topics: []string{""}}, "1 to 127"},
		"bad default":        {Routes{Topic: "A B"}, "Routes.Topic"},
		"system topic":       {Routes{Topics: []string{"RMQ_SYS_TRACE_TOPIC"}}, "RocketMQ's own"},
		"retry topic":        {Routes{Topics: []string{"%RETRY%points"}}, "RocketMQ's own"},
		"twice":              {Routes{Topic: "D", Topics: []string{"A", "D"}}, `"D" twice`},
		"type to unknown":    {Routes{Topic: "D", Topics: []string{"A"}, ByType: map[string]string{"PAID": "B"}}, `"B", which is neither`},
		"type to empty":      {Routes{ByType: map[string]string{"PAID": ""}}, "neither"},
		"empty type":         {Routes{ByType: map[string]string{"": "ORDER_EVENT_TOPIC"}}, "empty event type"},
		"type names the set": {Routes{Topic: "D", Topics: []string{"A"}, ByType: map[string]string{"PAID": "X"}}, "(D, A)"},
	} {
		_, err := tc.routes.routing()
		require.ErrorIs(t, err, ErrInvalidConfig, name)
		assert.ErrorContains(t, err, tc.says, name)
	}
	rt, err := Routes{Topic: "D", Topics: []string{"A", "B%x|y-z_1"}, ByType: map[string]string{"PAID": "A", "MADE": "D"}}.routing()
	require.NoError(t, err)
	assert.Equal(t, []string{"D", "A", "B%x|y-z_1"}, rt.set, "the set once each, the default first")
	assert.Equal(t, "A", rt.resolve("", "PAID"))
	assert.Equal(t, "D", rt.resolve("", "OTHER"))
	assert.Equal(t, "B%x|y-z_1", rt.resolve("B%x|y-z_1", "PAID"), "an event's own topic first")
	def, err := Routes{}.routing()
	require.NoError(t, err)
	assert.Equal(t, []string{"ORDER_EVENT_TOPIC"}, def.set)
}
