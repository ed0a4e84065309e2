package outboxtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// topicCases are an event's topic: written with it, and read back with it by every read.
var topicCases = []storeCase{
	{"TopicKeptThroughClaimRetryAndReclaim", topicKeptThroughClaimRetryAndReclaim},
}

// topicKeptThroughClaimRetryAndReclaim: the topic an event names ([outbox.EventInput.Topic])
// is the [outbox.Event.Topic] of every read of it: Get, Candidates, ClaimDue, and again after
// a retry and after a reclaim; an event that names none is read with one topic of the
// store's ([outbox.StoreInfo.Topics]), the same by every read.
func topicKeptThroughClaimRetryAndReclaim(t *testing.T, f *fixture) {
	th, ok := f.Harness.(TopicHarness)
	if !ok || len(th.Topics()) == 0 {
		t.Skip("the harness is no TopicHarness: its store need take no topic but the default")
	}
	topic := th.Topics()[0]
	ids := f.insertEvents(
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte(`{}`), Topic: topic},
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte(`{}`)},
	)
	info, err := f.s.Check(f.ctx)
	require.NoError(t, err)
	def := f.get(ids[1]).Topic
	assert.NotEmpty(t, def, "an event that names no topic is read with its store's")
	if info.Topics != nil {
		assert.Contains(t, info.Topics, def, "the unnamed event's topic is one of the store's")
		assert.Contains(t, info.Topics, topic)
	}
	want := map[int64]string{ids[0]: topic, ids[1]: def}
	check := func(what string, evs []outbox.Event) {
		t.Helper()
		for _, ev := range evs {
			assert.Equal(t, want[ev.ID], ev.Topic, "%s: event %d", what, ev.ID)
		}
	}
	for id := range want {
		check("Get", []outbox.Event{f.get(id)})
	}
	cands, err := f.s.Candidates(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, cands, 2)
	check("Candidates", cands)
	evs, _ := f.claimDue(owner, 10, 1<<20)
	require.Len(t, evs, 2)
	check("ClaimDue", evs)

	ok, err = f.s.ReleaseForRetry(f.ctx, ids[0], owner, 1, 0, "retryable", "broker busy")
	require.NoError(t, err)
	require.True(t, ok)
	f.SetNextRetry(t, ids[0], 0)
	evs, _ = f.claimDue(other, 10, 1<<20)
	require.Len(t, evs, 1)
	check("ClaimDue after a retry", evs)
	f.Backdate(t, ids[0], time.Hour)
	n, _, err := f.s.ReclaimExpired(f.ctx, time.Minute, outbox.RetryForever)
	require.NoError(t, err)
	require.Positive(t, n)
	check("Get after a reclaim", []outbox.Event{f.get(ids[0])})
}
