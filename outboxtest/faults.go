package outboxtest

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// faultCases are the part of the contract that keeps the guarantee under faults: bounded
// claims, reclaimed events claimed alone and dead-lettered past maxReclaims, and an owner
// releasing only its own events.
var faultCases = []storeCase{
	{"ClaimDueBoundsPayloadBytes", claimDueBoundsPayloadBytes},
	{"ClaimDueTakesAReclaimedEventAlone", claimDueTakesAReclaimedEventAlone},
	{"ReclaimDeadLettersPastMaxReclaims", reclaimDeadLettersPastMaxReclaims},
	{"ReleaseOwnedTouchesOnlyTheOwnersEvents", releaseOwnedTouchesOnlyTheOwnersEvents},
}

func claimDueBoundsPayloadBytes(t *testing.T, f *fixture) {
	const size = 300 << 10
	evs := make([]outbox.EventInput, 6)
	for i := range evs {
		evs[i] = outbox.EventInput{BizNo: newKey(), EventType: "ORDER_CREATED", Payload: bytes.Repeat([]byte{byte('a' + i)}, size)}
	}
	ids := f.insertEvents(evs...)
	for i, id := range ids {
		f.SetNextRetry(t, id, -time.Duration(60-i)*time.Second)
	}

	got, more := f.claimDue(owner, 100, 1<<20)
	require.Len(t, got, 3, "three 300 KiB payloads fit in 1 MiB, a fourth does not")
	assert.True(t, more, "due events were left behind")
	for i, ev := range got {
		assert.Equal(t, ids[i], ev.ID)
		assert.Equal(t, evs[i].Payload, ev.Payload, "a payload read with the claim is whole")
	}
	// A payload larger than the bound still goes, alone.
	got, _ = f.claimDue(owner, 100, 100<<10)
	require.Len(t, got, 1)
	assert.Equal(t, ids[3], got[0].ID)
	assert.Equal(t, evs[3].Payload, got[0].Payload)
	assert.Equal(t, outbox.StatusWait, f.get(ids[4]).Status, "events looked at but not taken stay WAIT")
	assert.Equal(t, outbox.StatusWait, f.get(ids[5]).Status)
}

func claimDueTakesAReclaimedEventAlone(t *testing.T, f *fixture) {
	ids := f.insert(6)
	f.reclaim(ids[2], 1)
	f.reclaim(ids[3], 1)
	for i, id := range ids {
		f.SetNextRetry(t, id, -time.Duration(100-i)*time.Second)
	}

	var (
		got   [][]int64
		mores []bool
	)
	for range len(ids) + 1 {
		evs, more := f.claimDue(owner, 100, 1<<20)
		if len(evs) == 0 {
			assert.False(t, more, "nothing claimed, nothing left")
			break
		}
		mores = append(mores, more)
		got = append(got, idsOf(evs))
	}
	assert.Equal(t, [][]int64{{ids[0], ids[1]}, {ids[2]}, {ids[3]}, {ids[4], ids[5]}}, got,
		"a batch stops before a reclaimed event, which is then claimed alone")
	assert.Equal(t, []bool{true, true, true, false}, mores, "each claim cut short says more may be due; the last does not")
}

func reclaimDeadLettersPastMaxReclaims(t *testing.T, f *fixture) {
	ids := f.insert(3)
	f.reclaim(ids[0], 2)
	f.reclaim(ids[1], 1)
	for _, id := range ids {
		f.claim(id, owner)
		f.Backdate(t, id, 11*time.Minute)
	}
	n, dead, err := f.s.ReclaimExpired(f.ctx, 10*time.Minute, 3)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n, "the events below maxReclaims are requeued")
	require.Len(t, dead, 1, "the event whose reclaims reach maxReclaims is dead-lettered")
	assert.Equal(t, ids[0], dead[0].ID)
	assert.Equal(t, outbox.StatusFail, dead[0].Status, "returned as it now stands")
	assert.Equal(t, 3, dead[0].ReclaimCount)
	assert.NotEmpty(t, dead[0].LastError, "a dead letter says why")
	assert.Equal(t, 0, dead[0].RetryCount, "a reclaim is no failed send")
	got := f.get(ids[0])
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 3, got.ReclaimCount)

	got = f.get(ids[1])
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Equal(t, 2, got.ReclaimCount)
	got = f.get(ids[2])
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Equal(t, 1, got.ReclaimCount)

	// RetryForever never dead-letters for reclaims, however many.
	f.reclaim(ids[1], 2)
	f.reclaim(ids[2], 3)
	for _, id := range ids[1:] {
		f.claim(id, owner)
		f.Backdate(t, id, 11*time.Minute)
	}
	n, dead, err = f.s.ReclaimExpired(f.ctx, 10*time.Minute, outbox.RetryForever)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Empty(t, dead)
	assert.Equal(t, 5, f.get(ids[1]).ReclaimCount)
	assert.Equal(t, 5, f.get(ids[2]).ReclaimCount)
}

func releaseOwnedTouchesOnlyTheOwnersEvents(t *testing.T, f *fixture) {
	ids := f.insert(5)
	// ids[0] failed twice before this claim.
	f.claim(ids[0], owner)
	ok, err := f.s.ReleaseForRetry(f.ctx, ids[0], owner, 2, 0, "retryable", "boom")
	require.NoError(t, err)
	require.True(t, ok)
	f.SetNextRetry(t, ids[0], 0)
	mine := []int64{f.claim(ids[0], owner).ID, f.claim(ids[1], owner).ID}
	f.claim(ids[2], other)
	f.claim(ids[3], strings.ToUpper(owner)) // another owner, though it differs only in case
	// ids[4] waits.

	n, err := f.s.ReleaseOwned(f.ctx, owner, "stopping")
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	for _, id := range mine {
		got := f.get(id)
		assert.Equal(t, outbox.StatusWait, got.Status)
		assert.Empty(t, got.ClaimOwner)
		assert.True(t, got.ClaimedAt.IsZero())
		assert.Equal(t, 0, got.ReclaimCount, "a release is no reclaim")
		assert.Equal(t, "stopping", got.LastError)
		assert.InDelta(t, 0, f.fromNow(got.NextRetryTime).Seconds(), 1, "due now")
	}
	assert.Equal(t, 2, f.get(ids[0]).RetryCount, "no retry counted, none forgotten")
	assert.Equal(t, 0, f.get(ids[1]).RetryCount)
	for i, who := range map[int]string{2: other, 3: strings.ToUpper(owner)} {
		got := f.get(ids[i])
		assert.Equal(t, outbox.StatusSending, got.Status, "another owner's lease is never touched")
		assert.Equal(t, who, got.ClaimOwner)
	}
	assert.Equal(t, outbox.StatusWait, f.get(ids[4]).Status)

	n, err = f.s.ReleaseOwned(f.ctx, owner, "again")
	require.NoError(t, err)
	assert.Zero(t, n, "nothing left to release")
}
