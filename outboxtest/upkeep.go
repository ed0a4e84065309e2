package outboxtest

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// upkeepCases are what the publisher asks of a store besides the claims: its ordering, a
// wake-up after commits, retention and the table's gauges. A store may decline the last
// three; the case is then skipped.
var upkeepCases = []storeCase{
	{"CheckReportsTheStoresOrdering", checkReportsTheStoresOrdering},
	{"SubscribeWakesAfterACommit", subscribeWakesAfterACommit},
	{"PurgeDeletesOnlyOldSentOrSkippedEvents", purgeDeletesOnlyOldSentOrSkippedEvents},
	{"PurgeInBatchesUpToALimit", purgeInBatchesUpToALimit},
	{"StatsCountsTheTable", statsCountsTheTable},
}

func checkReportsTheStoresOrdering(t *testing.T, f *fixture) {
	for range 2 {
		info, err := f.s.Check(f.ctx)
		require.NoError(t, err, "a table the store made can serve its ordering")
		assert.Equal(t, f.Ordering(), info.Ordering)
	}
	f.insert(1)
	info, err := f.s.Check(f.ctx)
	require.NoError(t, err)
	assert.Equal(t, f.Ordering(), info.Ordering, "the same with events in the table")
}

// signalled reports whether wake receives a signal within d.
func signalled(wake <-chan struct{}, d time.Duration) bool {
	select {
	case <-wake:
		return true
	case <-time.After(d):
		return false
	}
}

func subscribeWakesAfterACommit(t *testing.T, f *fixture) {
	wake, unsubscribe := f.s.Subscribe()
	require.NotNil(t, unsubscribe, "Subscribe returns a function that ends the subscription, even with no channel")
	if wake == nil {
		unsubscribe()
		t.Skip("the store cannot tell of commits (Subscribe returned a nil channel): the publisher polls")
	}
	second, unsubscribeSecond := f.s.Subscribe()
	require.NotNil(t, second)
	defer unsubscribeSecond()

	f.insert(1)
	assert.True(t, signalled(wake, 5*time.Second), "a commit through the store wakes the subscriber")
	assert.True(t, signalled(second, 5*time.Second), "and every other subscriber")

	unsubscribe()
	f.insert(1)
	assert.True(t, signalled(second, 5*time.Second), "the subscription still open hears of the next commit")
	assert.False(t, signalled(wake, 100*time.Millisecond), "an ended subscription hears of no commit")
}

// purgeOrSkip runs a purge, skipping the case if the store cannot purge.
func (f *fixture) purgeOrSkip(olderThan time.Duration, opts outbox.PurgeOptions) int64 {
	f.t.Helper()
	n, err := f.s.Purge(f.ctx, olderThan, opts)
	if errors.Is(err, errors.ErrUnsupported) {
		f.t.Skipf("the store cannot purge: %v", err)
	}
	require.NoError(f.t, err)
	return n
}

func purgeDeletesOnlyOldSentOrSkippedEvents(t *testing.T, f *fixture) {
	ids := f.insert(8)
	var (
		oldSuccess, oldSkipped, newSuccess, newSkipped = ids[0], ids[1], ids[2], ids[3]
		oldFail, oldWait, oldSending, newWait          = ids[4], ids[5], ids[6], ids[7]
	)
	for _, id := range []int64{oldSuccess, newSuccess} {
		f.succeed(id)
	}
	for _, id := range []int64{oldSkipped, newSkipped, oldFail} {
		f.deadLetter(id)
	}
	f.Skip(t, oldSkipped)
	f.Skip(t, newSkipped)
	f.claim(oldSending, owner)
	for _, id := range []int64{oldSuccess, oldSkipped, oldFail, oldWait, oldSending} {
		f.Backdate(t, id, 2*time.Hour)
	}
	f.Backdate(t, newSuccess, 30*time.Minute)

	// As the publisher's retention runs it.
	n := f.purgeOrSkip(time.Hour, outbox.PurgeOptions{Exclusive: true})
	assert.Equal(t, int64(2), n, "the SUCCESS and SKIPPED events updated more than an hour ago")
	assert.False(t, f.exists(oldSuccess), "an old SUCCESS event is deleted")
	assert.False(t, f.exists(oldSkipped), "an old SKIPPED event is deleted")
	assert.Equal(t, outbox.StatusSuccess, f.get(newSuccess).Status, "a SUCCESS event younger than the cutoff stays")
	assert.Equal(t, outbox.StatusSkipped, f.get(newSkipped).Status)
	assert.Equal(t, outbox.StatusFail, f.get(oldFail).Status, "a dead letter stays, however old")
	assert.Equal(t, outbox.StatusWait, f.get(oldWait).Status, "so do events not yet sent")
	assert.Equal(t, outbox.StatusSending, f.get(oldSending).Status)
	assert.Equal(t, outbox.StatusWait, f.get(newWait).Status)

	n = f.purgeOrSkip(time.Hour, outbox.PurgeOptions{})
	assert.Zero(t, n, "nothing old is left")
	n = f.purgeOrSkip(10*time.Minute, outbox.PurgeOptions{})
	assert.Equal(t, int64(1), n, "a shorter cutoff takes the younger SUCCESS event")
	assert.False(t, f.exists(newSuccess))
}

func purgeInBatchesUpToALimit(t *testing.T, f *fixture) {
	ids := f.insert(5)
	for _, id := range ids {
		f.succeed(id)
		f.Backdate(t, id, 2*time.Hour)
	}
	var batches []int64
	n := f.purgeOrSkip(time.Hour, outbox.PurgeOptions{BatchRows: 2, Limit: 3,
		OnBatch: func(deleted int64) { batches = append(batches, deleted) }})
	assert.Equal(t, int64(3), n, "the purge stops at its limit")
	var sum int64
	for _, b := range batches {
		assert.LessOrEqual(t, b, int64(2), "a batch deletes at most BatchRows")
		sum += b
	}
	assert.Equal(t, n, sum, "OnBatch hears of every deleted event")
	left := 0
	for _, id := range ids {
		if f.exists(id) {
			left++
		}
	}
	assert.Equal(t, 2, left)

	n = f.purgeOrSkip(time.Hour, outbox.PurgeOptions{})
	assert.Equal(t, int64(2), n, "the next purge takes the rest")
}

func statsCountsTheTable(t *testing.T, f *fixture) {
	const lease = time.Minute
	if _, err := f.s.Stats(f.ctx, outbox.StatsOptions{Lease: lease}); errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("the store reads no stats: %v", err)
	}
	empty, err := f.s.Stats(f.ctx, outbox.StatsOptions{Lease: lease, CountSucceeded: true})
	require.NoError(t, err)
	assert.Equal(t, outbox.TableStats{FailByType: map[string]int64{}}, empty, "an empty table: all zero, FailByType not nil")

	ids := f.insertEvents(
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 0 WAIT, due 30 s ago
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 1 WAIT, due now
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 2 WAIT, due in a minute
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 3 SENDING, claimed now
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 4 SENDING, claimed 2 min ago
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 5 FAIL
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_PAID", Payload: []byte("{}")},    // 6 FAIL
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_PAID", Payload: []byte("{}")},    // 7 FAIL
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: []byte("{}")}, // 8 SUCCESS
		outbox.EventInput{BizNo: newKey(), EventType: "ORDER_PAID", Payload: []byte("{}")},    // 9 SKIPPED
	)
	f.claim(ids[3], owner)
	f.claim(ids[4], owner)
	f.Backdate(t, ids[4], 2*time.Minute)
	for _, id := range ids[5:8] {
		f.deadLetter(id)
	}
	f.succeed(ids[8])
	f.deadLetter(ids[9])
	f.Skip(t, ids[9])
	f.SetNextRetry(t, ids[0], -30*time.Second)
	f.SetNextRetry(t, ids[1], 0)
	f.SetNextRetry(t, ids[2], time.Minute)

	st, err := f.s.Stats(f.ctx, outbox.StatsOptions{Lease: lease, CountSucceeded: true})
	require.NoError(t, err)
	assert.Equal(t, int64(3), st.Wait)
	assert.Equal(t, int64(2), st.Due, "the WAIT events whose time has come")
	assert.Equal(t, int64(2), st.Sending)
	assert.Equal(t, int64(3), st.Fail)
	assert.Equal(t, int64(1), st.Success)
	assert.Equal(t, int64(1), st.Skipped)
	assert.Equal(t, map[string]int64{"ORDER_CREATED": 1, "ORDER_PAID": 2}, st.FailByType)
	assert.InDelta(t, 30, st.OldestDueAge.Seconds(), 2, "the oldest due event, by the store's clock")
	assert.InDelta(t, 120, st.OldestClaimAge.Seconds(), 2, "the oldest lease, by the store's clock")
	assert.Equal(t, int64(1), st.SendingPastHalfLease)

	st, err = f.s.Stats(f.ctx, outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(-1), st.Success, "SUCCESS is not counted unless asked")
	assert.Equal(t, int64(-1), st.Skipped)
	assert.Zero(t, st.SendingPastHalfLease, "no lease, nothing past half of it")
	assert.Equal(t, int64(3), st.Wait)
	assert.Equal(t, int64(2), st.Sending)
	assert.Equal(t, int64(3), st.Fail)
}
