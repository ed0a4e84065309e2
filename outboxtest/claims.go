package outboxtest

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// claimCases are the claim protocol: each boundary has a case, in which a write under
// someone else's lease, or from the wrong state, changes nothing.
var claimCases = []storeCase{
	{"CandidatesDueWaitOldestFirstLimited", candidatesDueWaitOldestFirstLimited},
	{"EventIDKeptThroughClaimRetryAndReclaim", eventIDKeptThroughClaimRetryAndReclaim},
	{"ClaimIsWonByExactlyOne", claimIsWonByExactlyOne},
	{"ClaimRecordsOwnerAndStoreTime", claimRecordsOwnerAndStoreTime},
	{"ClaimWithStaleRetryCountLoses", claimWithStaleRetryCountLoses},
	{"ClaimOfRowNotYetDueLoses", claimOfRowNotYetDueLoses},
	{"MarkSuccessByOwner", markSuccessByOwner},
	{"MarkSuccessUnderAnotherOwnerChangesNothing", markSuccessUnderAnotherOwnerChangesNothing},
	{"MarkSuccessOnlyUnderOwnLease", markSuccessOnlyUnderOwnLease},
	{"OwnersDifferingInCaseAreDifferent", ownersDifferingInCaseAreDifferent},
	{"MarkSuccessOfWaitRowChangesNothing", markSuccessOfWaitRowChangesNothing},
	{"ReleaseForRetryByOwner", releaseForRetryByOwner},
	{"ReleaseForRetryUnderAnotherOwnerChangesNothing", releaseForRetryUnderAnotherOwnerChangesNothing},
	{"MarkFailByOwner", markFailByOwner},
	{"MarkFailUnderAnotherOwnerChangesNothing", markFailUnderAnotherOwnerChangesNothing},
	{"ClaimDueTakesDueWaitRowsOldestFirst", claimDueTakesDueWaitRowsOldestFirst},
	{"ClaimDueRecordsSuccessesUnderOwnLease", claimDueRecordsSuccessesUnderOwnLease},
	{"ConcurrentClaimDueNeverOverlaps", concurrentClaimDueNeverOverlaps},
	{"ReclaimJudgedByClaimedAtOnly", reclaimJudgedByClaimedAtOnly},
}

// claimed inserts one event and claims it for owner through Candidates and Claim.
func (f *fixture) claimed() outbox.Event {
	f.t.Helper()
	f.insert(1)
	evs, err := f.s.Candidates(f.ctx, 10)
	require.NoError(f.t, err)
	require.Len(f.t, evs, 1)
	won, err := f.s.Claim(f.ctx, evs[0], owner)
	require.NoError(f.t, err)
	require.True(f.t, won)
	return evs[0]
}

func candidatesDueWaitOldestFirstLimited(t *testing.T, f *fixture) {
	ids := f.insert(6)
	// A distinct age each, the later ids the older, so that the order is by next retry
	// time, not by id.
	for i, id := range ids {
		f.SetNextRetry(t, id, -time.Duration(50+i*10)*time.Second)
	}
	f.succeed(ids[0])
	f.deadLetter(ids[1])
	f.claim(ids[2], "x")
	f.SetNextRetry(t, ids[5], time.Minute)

	evs, err := f.s.Candidates(f.ctx, 10)
	require.NoError(t, err)
	for _, ev := range evs {
		assert.Equal(t, outbox.StatusWait, ev.Status)
		assert.Equal(t, "ORDER_CREATED", ev.EventType)
		assert.NotEmpty(t, ev.Payload)
		assert.NotEmpty(t, ev.EventID)
	}
	assert.Equal(t, []int64{ids[4], ids[3]}, idsOf(evs), "due WAIT events only, oldest next retry time first")

	evs, err = f.s.Candidates(f.ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, []int64{ids[4]}, idsOf(evs), "at most limit")
}

// Every event a store hands out carries the event id it got at insert, unchanged by
// claims, retries and reclaims: a resend carries the id of the first send, so that
// consumers can recognise it.
func eventIDKeptThroughClaimRetryAndReclaim(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	want := f.get(id).EventID
	require.NotEmpty(t, want)

	evs, err := f.s.Candidates(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, want, evs[0].EventID, "candidate")
	evs, _ = f.claimDue(owner, 1, 1<<20)
	require.Len(t, evs, 1)
	assert.Equal(t, want, evs[0].EventID, "batch claim")

	ok, err := f.s.ReleaseForRetry(f.ctx, id, owner, 1, 0, "retryable", "boom")
	require.NoError(t, err)
	require.True(t, ok)
	f.SetNextRetry(t, id, 0)
	evs, _ = f.claimDue(other, 1, 1<<20)
	require.Len(t, evs, 1)
	assert.Equal(t, want, evs[0].EventID, "claimed again after a retry")

	f.Backdate(t, id, time.Hour)
	n, _, err := f.s.ReclaimExpired(f.ctx, time.Minute, 3)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	evs, err = f.s.Candidates(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	assert.Equal(t, want, evs[0].EventID, "candidate after a reclaim")
	won, err := f.s.Claim(f.ctx, evs[0], owner)
	require.NoError(t, err)
	require.True(t, won)
	n, err = f.s.MarkSuccess(f.ctx, []int64{id}, owner)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	assert.Equal(t, want, f.get(id).EventID, "after success")
}

func claimIsWonByExactlyOne(t *testing.T, f *fixture) {
	f.insert(1)
	evs, err := f.s.Candidates(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			won, err := f.s.Claim(f.ctx, evs[0], fmt.Sprintf("owner-%d", i))
			assert.NoError(t, err)
			if won {
				wins.Add(1)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int32(1), wins.Load())
	assert.Equal(t, outbox.StatusSending, f.get(evs[0].ID).Status)
}

func claimRecordsOwnerAndStoreTime(t *testing.T, f *fixture) {
	ev := f.claimed()
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusSending, got.Status)
	assert.Equal(t, owner, got.ClaimOwner)
	assert.InDelta(t, 0, f.fromNow(got.ClaimedAt).Seconds(), 1, "claimed at the store's now")
}

func claimWithStaleRetryCountLoses(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	evs, err := f.s.Candidates(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	// Meanwhile another instance claims, fails and releases it, due again at once.
	won, err := f.s.Claim(f.ctx, evs[0], other)
	require.NoError(t, err)
	require.True(t, won)
	ok, err := f.s.ReleaseForRetry(f.ctx, id, other, 1, 0, "retryable", "boom")
	require.NoError(t, err)
	require.True(t, ok)
	f.SetNextRetry(t, id, 0)

	won, err = f.s.Claim(f.ctx, evs[0], owner)
	require.NoError(t, err)
	assert.False(t, won, "a candidate read at retry count 0 must not claim the event at retry count 1")
	assert.Equal(t, outbox.StatusWait, f.get(id).Status)
}

func claimOfRowNotYetDueLoses(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	evs, err := f.s.Candidates(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	f.SetNextRetry(t, id, time.Minute)
	won, err := f.s.Claim(f.ctx, evs[0], owner)
	require.NoError(t, err)
	assert.False(t, won)
	assert.Equal(t, outbox.StatusWait, f.get(id).Status)
}

func markSuccessByOwner(t *testing.T, f *fixture) {
	ev := f.claimed()
	n, err := f.s.MarkSuccess(f.ctx, []int64{ev.ID}, owner)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusSuccess, got.Status)
	assert.Equal(t, owner, got.ClaimOwner, "the claim owner keeps who sent it")
}

func markSuccessUnderAnotherOwnerChangesNothing(t *testing.T, f *fixture) {
	ev := f.claimed()
	n, err := f.s.MarkSuccess(f.ctx, []int64{ev.ID}, other)
	require.NoError(t, err)
	assert.Zero(t, n)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusSending, got.Status)
	assert.Equal(t, owner, got.ClaimOwner)
}

func markSuccessOnlyUnderOwnLease(t *testing.T, f *fixture) {
	f.insert(3)
	mine, _ := f.claimDue(owner, 2, 1<<20)
	require.Len(t, mine, 2)
	theirs, _ := f.claimDue(other, 1, 1<<20)
	require.Len(t, theirs, 1)
	n, err := f.s.MarkSuccess(f.ctx, []int64{mine[0].ID, mine[1].ID, theirs[0].ID}, owner)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	assert.Equal(t, outbox.StatusSuccess, f.get(mine[0].ID).Status)
	assert.Equal(t, outbox.StatusSuccess, f.get(mine[1].ID).Status)
	got := f.get(theirs[0].ID)
	assert.Equal(t, outbox.StatusSending, got.Status, "another owner's lease is left alone")
	assert.Equal(t, other, got.ClaimOwner)
	n, err = f.s.MarkSuccess(f.ctx, nil, owner)
	require.NoError(t, err)
	assert.Zero(t, n, "no ids, nothing marked")
}

// Owners are compared exactly: an owner that differs only in case is someone else.
func ownersDifferingInCaseAreDifferent(t *testing.T, f *fixture) {
	ev := f.claimed()
	upper := strings.ToUpper(owner)
	n, err := f.s.MarkSuccess(f.ctx, []int64{ev.ID}, upper)
	require.NoError(t, err)
	assert.Zero(t, n)
	ok, err := f.s.ReleaseForRetry(f.ctx, ev.ID, upper, 1, 0, "retryable", "boom")
	require.NoError(t, err)
	assert.False(t, ok)
	_, ok, err = f.s.MarkFail(f.ctx, ev.ID, upper, 1, "permanent", "boom")
	require.NoError(t, err)
	assert.False(t, ok)
	released, err := f.s.ReleaseOwned(f.ctx, upper, "stopping")
	require.NoError(t, err)
	assert.Zero(t, released)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusSending, got.Status)
	assert.Equal(t, owner, got.ClaimOwner)
}

func markSuccessOfWaitRowChangesNothing(t *testing.T, f *fixture) {
	id := f.insert(1)[0]
	n, err := f.s.MarkSuccess(f.ctx, []int64{id}, owner)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, outbox.StatusWait, f.get(id).Status)
}

func releaseForRetryByOwner(t *testing.T, f *fixture) {
	ev := f.claimed()
	ok, err := f.s.ReleaseForRetry(f.ctx, ev.ID, owner, 2, 20*time.Second, "retryable", "broker busy")
	require.NoError(t, err)
	assert.True(t, ok)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Equal(t, 2, got.RetryCount)
	assert.Empty(t, got.ClaimOwner)
	assert.True(t, got.ClaimedAt.IsZero(), "nobody holds the lease")
	assert.Equal(t, "broker busy", got.LastError)
	assert.InDelta(t, 20, f.fromNow(got.NextRetryTime).Seconds(), 1, "due after the delay, by the store's clock")
}

func releaseForRetryUnderAnotherOwnerChangesNothing(t *testing.T, f *fixture) {
	ev := f.claimed()
	ok, err := f.s.ReleaseForRetry(f.ctx, ev.ID, other, 1, 0, "retryable", "boom")
	require.NoError(t, err)
	assert.False(t, ok)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusSending, got.Status)
	assert.Equal(t, owner, got.ClaimOwner)
	assert.Equal(t, 0, got.RetryCount)
	assert.Empty(t, got.LastError)
}

func markFailByOwner(t *testing.T, f *fixture) {
	ev := f.claimed()
	_, ok, err := f.s.MarkFail(f.ctx, ev.ID, owner, 4, "permanent", "too many retries")
	require.NoError(t, err)
	assert.True(t, ok)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusFail, got.Status)
	assert.Equal(t, 4, got.RetryCount)
	assert.Equal(t, "too many retries", got.LastError)
}

func markFailUnderAnotherOwnerChangesNothing(t *testing.T, f *fixture) {
	ev := f.claimed()
	_, ok, err := f.s.MarkFail(f.ctx, ev.ID, other, 4, "permanent", "boom")
	require.NoError(t, err)
	assert.False(t, ok)
	got := f.get(ev.ID)
	assert.Equal(t, outbox.StatusSending, got.Status)
	assert.Equal(t, 0, got.RetryCount)
	assert.Empty(t, got.LastError)
}

func claimDueTakesDueWaitRowsOldestFirst(t *testing.T, f *fixture) {
	ids := f.insert(5)
	for i, id := range ids {
		f.SetNextRetry(t, id, -time.Duration(100-i*10)*time.Second)
	}
	f.SetNextRetry(t, ids[4], time.Minute)
	f.deadLetter(ids[0])

	evs, more := f.claimDue(owner, 2, 1<<20)
	require.Len(t, evs, 2)
	assert.True(t, more, "the claim took all it was allowed")
	assert.Equal(t, []int64{ids[1], ids[2]}, idsOf(evs))
	for _, ev := range evs {
		assert.Equal(t, outbox.StatusSending, ev.Status)
		assert.Equal(t, owner, ev.ClaimOwner)
		assert.NotEmpty(t, ev.Payload)
		got := f.get(ev.ID)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, owner, got.ClaimOwner)
		assert.InDelta(t, 0, f.fromNow(got.ClaimedAt).Seconds(), 1)
	}
	evs, _ = f.claimDue(other, 10, 1<<20)
	assert.Equal(t, []int64{ids[3]}, idsOf(evs), "the dead letter and the event not yet due are not claimed")
	assert.Equal(t, outbox.StatusWait, f.get(ids[4]).Status)
}

func claimDueRecordsSuccessesUnderOwnLease(t *testing.T, f *fixture) {
	ids := f.insert(4)
	mine, _ := f.claimDue(owner, 3, 1<<20)
	require.Len(t, mine, 3)
	// The third was reclaimed and claimed by another instance meanwhile.
	f.Backdate(t, mine[2].ID, time.Hour)
	n, _, err := f.s.ReclaimExpired(f.ctx, time.Minute, 3)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	f.claim(mine[2].ID, other)

	res, err := f.s.ClaimDue(f.ctx, outbox.ClaimRequest{Owner: owner, Limit: 10, MaxBytes: 1 << 20,
		Succeeded: []int64{mine[0].ID, mine[1].ID, mine[2].ID}})
	require.NoError(t, err)
	assert.Equal(t, int64(2), res.Succeeded, "only the events still ours")
	require.Len(t, res.Events, 1, "and the claim took the event left")
	assert.Equal(t, ids[3], res.Events[0].ID)
	assert.Equal(t, outbox.StatusSuccess, f.get(mine[0].ID).Status)
	assert.Equal(t, outbox.StatusSuccess, f.get(mine[1].ID).Status)
	got := f.get(mine[2].ID)
	assert.Equal(t, outbox.StatusSending, got.Status, "another's lease is left alone")
	assert.Equal(t, other, got.ClaimOwner)

	// With nothing due, the successes are recorded all the same; recording one again
	// (after a claim whose outcome was unknown) counts it, as marked already.
	res, err = f.s.ClaimDue(f.ctx, outbox.ClaimRequest{Owner: owner, Limit: 10, MaxBytes: 1 << 20,
		Succeeded: []int64{mine[0].ID, res.Events[0].ID}})
	require.NoError(t, err)
	assert.Empty(t, res.Events)
	assert.False(t, res.More)
	assert.Equal(t, int64(2), res.Succeeded)
	assert.Equal(t, outbox.StatusSuccess, f.get(ids[3]).Status)
}

func concurrentClaimDueNeverOverlaps(t *testing.T, f *fixture) {
	ids := f.insert(400)
	var mu sync.Mutex
	claimedBy := map[int64]string{}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			me := fmt.Sprintf("owner-%d", i)
			for {
				res, err := f.s.ClaimDue(f.ctx, outbox.ClaimRequest{Owner: me, Limit: 7, MaxBytes: 1 << 20})
				if !assert.NoError(t, err) || len(res.Events) == 0 {
					return
				}
				mu.Lock()
				for _, ev := range res.Events {
					if prev, dup := claimedBy[ev.ID]; dup {
						t.Errorf("event %d claimed by %s and %s", ev.ID, prev, me)
					}
					claimedBy[ev.ID] = me
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	assert.Len(t, claimedBy, len(ids), "every event claimed exactly once")
	for id, me := range claimedBy {
		if got := f.get(id); got.Status != outbox.StatusSending || got.ClaimOwner != me {
			t.Fatalf("event %d: %s under %q, claimed by %q", id, got.Status, got.ClaimOwner, me)
		}
	}
}

func reclaimJudgedByClaimedAtOnly(t *testing.T, f *fixture) {
	ids := f.insert(4)
	for _, id := range ids[:3] {
		f.claim(id, owner)
	}
	// ids[0]: a fresh claim, but a next retry time an hour old: in flight, must stay.
	f.SetNextRetry(t, ids[0], -time.Hour)
	// ids[1]: claimed 11 minutes ago: the holder is presumed dead.
	f.Backdate(t, ids[1], 11*time.Minute)
	// ids[2]: claimed 9 minutes ago: still within its lease.
	f.Backdate(t, ids[2], 9*time.Minute)
	// ids[3]: WAIT with an old next retry time: not SENDING, not a reclaim's business.
	f.SetNextRetry(t, ids[3], -time.Hour)

	n, dead, err := f.s.ReclaimExpired(f.ctx, 10*time.Minute, 3)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Empty(t, dead)
	assert.Equal(t, outbox.StatusSending, f.get(ids[0]).Status)
	got := f.get(ids[1])
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Empty(t, got.ClaimOwner)
	assert.True(t, got.ClaimedAt.IsZero())
	assert.Equal(t, 0, got.RetryCount, "a reclaim is not a failed attempt")
	assert.Equal(t, 1, got.ReclaimCount, "but it is counted as a reclaim")
	assert.Equal(t, outbox.StatusSending, f.get(ids[2]).Status)
	assert.Equal(t, outbox.StatusWait, f.get(ids[3]).Status)

	// The reclaimed event is a candidate again, and the old owner can no longer ack it.
	n, err = f.s.MarkSuccess(f.ctx, []int64{ids[1]}, owner)
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, outbox.StatusWait, f.get(ids[1]).Status)
}
