package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// callLog is a sender that records each call's events (by event id) and answers each event
// by answer (nil: accepted), stopping a biz no at its first failure in the call, as the
// Sender contract asks.
type callLog struct {
	mu     sync.Mutex
	calls  [][]string
	answer func(outbox.Event) error
}

func (c *callLog) Send(_ context.Context, evs []outbox.Event, keyOrder bool) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, len(evs))
	errs := make([]error, len(evs))
	failed := map[string]bool{}
	for i, ev := range evs {
		ids[i] = ev.EventID
		switch {
		case keyOrder && failed[ev.BizNo]:
			errs[i] = fmt.Errorf("%w: after a failure", outbox.ErrNotSent)
		case c.answer != nil:
			errs[i] = c.answer(ev)
		}
		if errs[i] != nil {
			failed[ev.BizNo] = true
		}
	}
	c.calls = append(c.calls, ids)
	return errs
}

func (c *callLog) Check(context.Context, []string) error { return nil }
func (c *callLog) Info() outbox.SenderInfo               { return outbox.SenderInfo{} }

// routed returns events "key/n" of the biz nos in keys, each with its topic, in the order
// given: spec is "K1:A,K1:B,K2:A" (biz no:topic, in id order).
func routed(spec string) []outbox.Event {
	var evs []outbox.Event
	n := map[string]int{}
	for i, f := range strings.Split(spec, ",") {
		key, topic, _ := strings.Cut(f, ":")
		n[key]++
		evs = append(evs, outbox.Event{ID: int64(i + 1), EventID: fmt.Sprintf("%s/%d", key, n[key]), BizNo: key,
			EventType: "E", Payload: []byte("{}"), Topic: topic})
	}
	return evs
}

var keyOrdered = outbox.StoreInfo{Ordering: outbox.KeyOrder}

// In key order each call carries one run of one topic for each biz no, the biz nos
// together; a biz no's next topic goes in a later call, and a run of one topic goes whole.
func TestDispatchKeyOrderGoesTopicByTopic(t *testing.T) {
	t.Parallel()
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		c := &callLog{}
		evs := routed("K1:A,K2:B,K1:B,K3:A,K1:B,K3:A,K1:A,K2:B")
		errs := outbox.Dispatch(context.Background(), c, evs, outbox.StoreInfo{Ordering: o})
		assert.Equal(t, make([]error, len(evs)), errs, "%s", o)
		assert.Equal(t, [][]string{
			{"K1/1", "K2/1", "K2/2", "K3/1", "K3/2"}, // each biz no's first run: K1's of A, K2's and K3's whole
			{"K1/2", "K1/3"},                         // K1's run of B, once its A is stored
			{"K1/4"},                                 // and its A again
		}, c.calls, "%s", o)
	}

	// Without key order, one call of everything, as given.
	c := &callLog{}
	evs := routed("K1:A,K2:B,K1:B,K1:A")
	assert.Equal(t, make([]error, 4), outbox.Dispatch(context.Background(), c, evs, outbox.StoreInfo{}))
	assert.Equal(t, [][]string{{"K1/1", "K2/1", "K1/2", "K1/3"}}, c.calls)
}

// A biz no stops at its first failure, in whatever topic: its later events, of any topic,
// are not sent and are answered with ErrNotSent naming the failure; the other biz nos go
// on.
func TestDispatchStopsABizNoAcrossTopics(t *testing.T) {
	t.Parallel()
	refused := outbox.Permanent(errors.New("the broker refused K1/2"))
	for _, kind := range []string{"permanent", "retryable", "unavailable"} {
		c := &callLog{answer: func(ev outbox.Event) error {
			if ev.EventID != "K1/2" {
				return nil
			}
			switch kind {
			case "permanent":
				return refused
			case "retryable":
				return errors.New("a failure to retry")
			}
			return outbox.Unavailable(errors.New("no route"))
		}}
		evs := routed("K1:A,K1:B,K1:C,K1:A,K2:A,K2:C")
		errs := outbox.Dispatch(context.Background(), c, evs, keyOrdered)
		assert.NoError(t, errs[0], kind)
		require.Error(t, errs[1], kind)
		assert.False(t, errors.Is(errs[1], outbox.ErrNotSent), "%s: the failure is the event's own", kind)
		for _, i := range []int{2, 3} {
			assert.ErrorIs(t, errs[i], outbox.ErrNotSent, "%s: K1's later event %d", kind, i)
			assert.Contains(t, errs[i].Error(), "K1/2", "%s: it names the failure", kind)
			assert.False(t, outbox.IsPermanent(errs[i]), "%s: it is not charged with it", kind)
		}
		assert.NoError(t, errs[4], kind)
		assert.NoError(t, errs[5], kind)
		for _, call := range c.calls {
			assert.NotContains(t, call, "K1/3", kind)
			assert.NotContains(t, call, "K1/4", kind)
		}
	}
}

// A topic a send found unavailable is not tried again in the dispatch: the later runs of
// other biz nos to it are not sent (ErrNotSent, wrapping the unavailable error), without a
// call; the other topics go on.
func TestDispatchSkipsAnUnavailableTopic(t *testing.T) {
	t.Parallel()
	down := outbox.Unavailable(errors.New("topic B has no route"))
	c := &callLog{answer: func(ev outbox.Event) error {
		if ev.Topic == "B" {
			return down
		}
		return nil
	}}
	evs := routed("K1:B,K2:A,K2:B,K3:A,K3:A")
	errs := outbox.Dispatch(context.Background(), c, evs, keyOrdered)
	assert.ErrorIs(t, errs[0], down)
	assert.NoError(t, errs[1])
	assert.ErrorIs(t, errs[2], outbox.ErrNotSent, "K2's run of B is not tried")
	assert.ErrorIs(t, errs[2], down)
	assert.NoError(t, errs[3])
	assert.NoError(t, errs[4])
	assert.Equal(t, [][]string{{"K1/1", "K2/1", "K3/1", "K3/2"}}, c.calls, "no second call: B is down, and nothing else is left")
}

// An event whose topic is outside the store's set, or that names none, fails at its turn
// as Permanent, naming the topic and the known ones, without reaching the sender; in key
// order its biz no's later events are not sent, in any topic; without, the others go.
func TestDispatchRefusesATopicOutsideTheSet(t *testing.T) {
	t.Parallel()
	info := outbox.StoreInfo{Ordering: outbox.KeyOrder, Topics: []string{"A", "B"}}
	c := &callLog{}
	evs := routed("K1:A,K1:TYPO,K1:B,K2:B")
	errs := outbox.Dispatch(context.Background(), c, evs, info)
	assert.NoError(t, errs[0])
	require.True(t, outbox.IsPermanent(errs[1]), "%v", errs[1])
	for _, name := range []string{"TYPO", "A, B"} {
		assert.Contains(t, errs[1].Error(), name)
	}
	assert.ErrorIs(t, errs[2], outbox.ErrNotSent)
	assert.NoError(t, errs[3])
	assert.Equal(t, [][]string{{"K1/1", "K2/1"}}, c.calls)

	c = &callLog{}
	evs = routed("K1:A,K1:TYPO,K1:B,K2:")
	info.Ordering = outbox.Unordered
	errs = outbox.Dispatch(context.Background(), c, evs, info)
	assert.NoError(t, errs[0])
	assert.True(t, outbox.IsPermanent(errs[1]))
	assert.NoError(t, errs[2], "unordered: the others go")
	assert.True(t, outbox.IsPermanent(errs[3]), "no topic: %v", errs[3])
	assert.Equal(t, [][]string{{"K1/1", "K1/3"}}, c.calls)
}

// Once ctx is done nothing more is sent: what is left gets ErrNotSent.
func TestDispatchStopsAtTheDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	c := &callLog{answer: func(outbox.Event) error { cancel(); return nil }}
	evs := routed("K1:A,K1:B,K2:A,K2:B")
	errs := outbox.Dispatch(ctx, c, evs, keyOrdered)
	assert.NoError(t, errs[0])
	assert.NoError(t, errs[2])
	assert.ErrorIs(t, errs[1], outbox.ErrNotSent)
	assert.ErrorIs(t, errs[3], outbox.ErrNotSent)
	assert.Len(t, c.calls, 1)
}

// panicSender panics, or answers with the wrong number of errors.
type panicSender struct{ short bool }

func (p panicSender) Send(context.Context, []outbox.Event, bool) []error {
	if p.short {
		return nil
	}
	panic("boom")
}
func (panicSender) Check(context.Context, []string) error { return nil }
func (panicSender) Info() outbox.SenderInfo               { return outbox.SenderInfo{} }

// A sender that panics, or answers with the wrong number of errors, fails the events of
// that call alike, with an error to retry; in key order their biz nos stop there.
func TestDispatchSurvivesABrokenSender(t *testing.T) {
	t.Parallel()
	evs := routed("K1:A,K1:B,K2:A")
	for _, s := range []panicSender{{}, {short: true}} {
		errs := outbox.Dispatch(context.Background(), s, evs, keyOrdered)
		for _, i := range []int{0, 2} {
			require.Error(t, errs[i])
			assert.False(t, errors.Is(errs[i], outbox.ErrNotSent))
			assert.False(t, outbox.IsPermanent(errs[i]))
		}
		assert.ErrorIs(t, errs[1], outbox.ErrNotSent)
	}
}
