package outboxtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// historyCases are the failure history's ([outbox.Event.Failures]): each failed attempt
// recorded with the write that records the failure, bounded at the latest ten, and nothing
// for an event that never failed.
var historyCases = []storeCase{
	{"FailuresAreRecordedOldestFirstAndBoundedAtTen", failuresAreRecordedAndBounded},
	{"ReclaimIsRecordedUnderTheOwnerThatLostTheLease", reclaimIsRecordedInTheHistory},
	{"ReleaseOfAnEventNeverTriedRecordsNoFailure", releaseNeverTriedRecordsNoFailure},
	{"SentEventHasNoFailureHistory", sentEventHasNoHistory},
}

// maxFailures is how many failures an event keeps.
const maxFailures = 10

// failuresAreRecordedAndBounded fails one event 14 times (retries, then a dead letter) and
// checks the history MarkFail returns and Get reads: the latest ten, oldest first, each with
// the store's time, the owner, the class and the message.
func failuresAreRecordedAndBounded(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	before := f.Now(t)
	const retries = 13
	for i := 1; i <= retries; i++ {
		f.claim(id, owner)
		class := "retryable"
		if i%2 == 0 {
			class = "unavailable"
		}
		ok, err := f.s.ReleaseForRetry(f.ctx, id, owner, i, 0, class, fmt.Sprintf("failure %d", i))
		require.NoError(t, err)
		require.True(t, ok)
		f.SetNextRetry(t, id, 0)
		if i == 1 {
			got := f.get(id).Failures
			require.Len(t, got, 1, "the first failure is recorded with its release")
			assert.Equal(t, outbox.Failure{At: got[0].At, Instance: owner, Class: "retryable", Message: "failure 1"}, got[0])
		}
	}
	f.claim(id, other)
	history, ok, err := f.s.MarkFail(f.ctx, id, other, retries+1, "permanent", "refused for good")
	require.NoError(t, err)
	require.True(t, ok)
	after := f.Now(t)

	require.Len(t, history, maxFailures, "MarkFail returns the latest ten failures")
	for i, fl := range history[:maxFailures-1] {
		n := retries - (maxFailures - 1) + 1 + i // failures 5 to 13
		assert.Equal(t, fmt.Sprintf("failure %d", n), fl.Message, "entry %d", i)
		assert.Equal(t, owner, fl.Instance)
		assert.Equal(t, map[bool]string{true: "unavailable", false: "retryable"}[n%2 == 0], fl.Class)
	}
	last := history[maxFailures-1]
	assert.Equal(t, "permanent", last.Class)
	assert.Equal(t, other, last.Instance, "the instance is the lease's owner when it failed")
	assert.Equal(t, "refused for good", last.Message)
	for i, fl := range history {
		assert.False(t, fl.At.Before(before.Add(-time.Millisecond)), "entry %d at %v, before the first failure (%v)", i, fl.At, before)
		assert.False(t, fl.At.After(after.Add(time.Millisecond)), "entry %d at %v, after the dead letter (%v)", i, fl.At, after)
		if i > 0 {
			assert.False(t, fl.At.Before(history[i-1].At), "entries oldest first, by the store's clock")
		}
	}
	assert.Equal(t, history, f.get(id).Failures, "Get reads the history MarkFail returned")
}

// reclaimIsRecordedInTheHistory: a reclaimed lease is a failure of the owner that held it.
func reclaimIsRecordedInTheHistory(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	f.reclaim(id, 1)
	got := f.get(id)
	require.Len(t, got.Failures, 1)
	assert.Equal(t, "reclaimed", got.Failures[0].Class)
	assert.Equal(t, "crashed", got.Failures[0].Instance, "the owner that lost the lease")
	assert.NotEmpty(t, got.Failures[0].Message)
	assert.False(t, got.Failures[0].At.IsZero())
}

// releaseNeverTriedRecordsNoFailure: a release with no class (an event the sender never
// tried) and ReleaseOwned add nothing to the history.
func releaseNeverTriedRecordsNoFailure(t *testing.T, f *fixture) {
	ids := f.insert(2)
	f.claim(ids[0], owner)
	ok, err := f.s.ReleaseForRetry(f.ctx, ids[0], owner, 0, 0, "", "not sent")
	require.NoError(t, err)
	require.True(t, ok)
	f.claim(ids[1], owner)
	_, err = f.s.ReleaseOwned(f.ctx, owner, "stopping")
	require.NoError(t, err)
	for _, id := range ids {
		got := f.get(id)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Empty(t, got.Failures, "event %d was never tried", id)
	}
}

// sentEventHasNoHistory: the happy path writes no history.
func sentEventHasNoHistory(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	f.succeed(id)
	assert.Empty(t, f.get(id).Failures)
}
