package outboxtest

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// keyOrderCases hold a store in key order ([outbox.KeyOrder], [outbox.KeyOrderSkipDeadLetters])
// to its promise: an event is claimed only when every earlier event of its biz no is done,
// across instances, and the claimed events of one biz no come in id order. They are
// skipped for an unordered store.
var keyOrderCases = []storeCase{
	{"KeyOrderPerRowClaimWaitsForEarlierEvents", keyOrderPerRowClaimWaitsForEarlierEvents},
	{"KeyOrderBatchClaimWaitsForEarlierEvents", keyOrderBatchClaimWaitsForEarlierEvents},
	{"KeyOrderDeadLetterHoldsItsKey", keyOrderDeadLetterHoldsItsKey},
	{"KeyOrderConcurrentClaimDueKeepsEachKeyInOrder", keyOrderConcurrentClaimDueKeepsEachKeyInOrder},
}

func (f *fixture) requireKeyOrder() {
	f.t.Helper()
	if f.Ordering() == outbox.Unordered {
		f.t.Skip("the store is unordered")
	}
}

// insertKey commits n events of one new biz no and returns its key and their ids.
func (f *fixture) insertKey(n int) (string, []int64) {
	f.t.Helper()
	key := newKey()
	evs := make([]outbox.EventInput, n)
	for i := range evs {
		evs[i] = outbox.EventInput{BizNo: key, EventType: fmt.Sprintf("STEP_%d", i), Payload: fmt.Appendf(nil, `{"step":%d}`, i)}
	}
	return key, f.insertEvents(evs...)
}

// tryClaim is a per-row claim of the row as it stands, for who.
func (f *fixture) tryClaim(id int64, who string) bool {
	f.t.Helper()
	won, err := f.s.Claim(f.ctx, f.get(id), who)
	require.NoError(f.t, err)
	return won
}

// candidates returns the ids Candidates offers: those of the key k (its ids), in the order
// offered, and the others.
func (f *fixture) candidates(k []int64) (ofKey, others []int64) {
	f.t.Helper()
	evs, err := f.s.Candidates(f.ctx, 100)
	require.NoError(f.t, err)
	for _, ev := range evs {
		if slices.Contains(k, ev.ID) {
			ofKey = append(ofKey, ev.ID)
		} else {
			others = append(others, ev.ID)
		}
	}
	return ofKey, others
}

func keyOrderPerRowClaimWaitsForEarlierEvents(t *testing.T, f *fixture) {
	f.requireKeyOrder()
	_, k := f.insertKey(3)
	lone := f.insert(1)[0]

	ofKey, others := f.candidates(k)
	require.NotEmpty(t, ofKey, "a key's first event is a candidate")
	assert.Equal(t, k[:len(ofKey)], ofKey, "a key's candidates from its first event, in id order")
	assert.Equal(t, []int64{lone}, others)
	assert.False(t, f.tryClaim(k[1], owner), "an event whose key's earlier event waits is not claimed")
	require.True(t, f.tryClaim(k[0], owner))

	ofKey, others = f.candidates(k)
	assert.Empty(t, ofKey, "nothing of a key whose event is in flight")
	assert.Equal(t, []int64{lone}, others)
	assert.False(t, f.tryClaim(k[1], other), "nor is it claimed while the earlier one is in flight, by any instance")
	n, err := f.s.MarkSuccess(f.ctx, []int64{k[0]}, owner)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	ofKey, _ = f.candidates(k)
	require.NotEmpty(t, ofKey, "the key's next event once the first is done")
	assert.Equal(t, k[1:1+len(ofKey)], ofKey)
	require.True(t, f.tryClaim(k[1], other))
	ok, err := f.s.ReleaseForRetry(f.ctx, k[1], other, 1, time.Minute, "retryable", "broker busy")
	require.NoError(t, err)
	require.True(t, ok)
	assert.False(t, f.tryClaim(k[2], owner), "an event waits behind an earlier one backing off")
	ofKey, others = f.candidates(k)
	assert.Empty(t, ofKey)
	assert.Equal(t, []int64{lone}, others)
}

func keyOrderBatchClaimWaitsForEarlierEvents(t *testing.T, f *fixture) {
	f.requireKeyOrder()
	_, k := f.insertKey(3)
	lone := f.insert(1)[0]
	f.SetNextRetry(t, k[0], time.Minute)

	evs, _ := f.claimDue(owner, 10, 1<<20)
	require.Equal(t, []int64{lone}, idsOf(evs), "nothing of a key whose first event is not yet due")
	n, err := f.s.MarkSuccess(f.ctx, []int64{lone}, owner)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)

	f.SetNextRetry(t, k[0], 0)
	evs, _ = f.claimDue(owner, 10, 1<<20)
	require.NotEmpty(t, evs)
	got := idsOf(evs)
	assert.Equal(t, k[:len(got)], got, "a key's events from its first, in id order")
	evs, _ = f.claimDue(other, 10, 1<<20)
	assert.Empty(t, evs, "nothing of a key in flight, for another instance either")

	// The first event is sent; the claim that records it may take the key's next ones.
	res, err := f.s.ClaimDue(f.ctx, outbox.ClaimRequest{Owner: owner, Limit: 10, MaxBytes: 1 << 20, Succeeded: got[:1]})
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Succeeded)
	held := append(slices.Clone(got[1:]), idsOf(res.Events)...)
	assert.Equal(t, k[1:], held, "the key's later events, taken once the first is done")

	// The second fails and backs off: the third waits for it.
	n, err = f.s.ReleaseOwned(f.ctx, owner, "stopping")
	require.NoError(t, err)
	require.Equal(t, int64(len(held)), n)
	f.claim(k[1], owner)
	ok, err := f.s.ReleaseForRetry(f.ctx, k[1], owner, 1, time.Minute, "retryable", "broker busy")
	require.NoError(t, err)
	require.True(t, ok)
	evs, _ = f.claimDue(other, 10, 1<<20)
	assert.Empty(t, evs, "an event waits behind an earlier one backing off")
}

func keyOrderDeadLetterHoldsItsKey(t *testing.T, f *fixture) {
	f.requireKeyOrder()
	_, k := f.insertKey(2)
	f.deadLetter(k[0])

	evs, _ := f.claimDue(owner, 10, 1<<20)
	if f.Ordering() == outbox.KeyOrderSkipDeadLetters {
		assert.Equal(t, []int64{k[1]}, idsOf(evs), "KeyOrderSkipDeadLetters: the key goes on past its dead letter")
		return
	}
	assert.Empty(t, evs, "KeyOrder: a dead letter holds its key")
	ofKey, _ := f.candidates(k)
	assert.Empty(t, ofKey)
	assert.False(t, f.tryClaim(k[1], owner))

	f.Skip(t, k[0])
	evs, _ = f.claimDue(owner, 10, 1<<20)
	assert.Equal(t, []int64{k[1]}, idsOf(evs), "a skipped dead letter is done: the key goes on")
}

// Several instances claim, send and record in a loop: no key ever has events in flight
// under two instances, and each key's events are claimed in id order, each once.
func keyOrderConcurrentClaimDueKeepsEachKeyInOrder(t *testing.T, f *fixture) {
	f.requireKeyOrder()
	const keys, per = 8, 6
	names := make([]string, keys)
	for i := range names {
		names[i] = newKey()
	}
	want := map[string][]int64{}
	for range per {
		// One transaction per round, the keys interleaved: a key's ids are not adjacent.
		evs := make([]outbox.EventInput, keys)
		for i, key := range names {
			evs[i] = outbox.EventInput{BizNo: key, EventType: "STEP", Payload: []byte("{}")}
		}
		for i, id := range f.insertEvents(evs...) {
			want[names[i]] = append(want[names[i]], id)
		}
	}

	var (
		mu       sync.Mutex
		inFlight = map[string]string{}  // key -> the owner holding its events
		claimed  = map[string][]int64{} // key -> its events in the order claimed
		total    int
	)
	deadline := time.Now().Add(30 * time.Second)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			me := fmt.Sprintf("owner-%d", i)
			var sent []outbox.Event
			for {
				// Sent: done here before the store hears of it, so that a claim that follows
				// the record never finds the key still in flight.
				mu.Lock()
				for _, ev := range sent {
					delete(inFlight, ev.BizNo)
				}
				finished := total == keys*per
				mu.Unlock()
				if finished || time.Now().After(deadline) {
					n, err := f.s.MarkSuccess(f.ctx, idsOf(sent), me)
					assert.NoError(t, err)
					assert.Equal(t, int64(len(sent)), n, "%s's leases are its own", me)
					assert.True(t, finished, "%s: every event claimed within 30 s", me)
					return
				}
				res, err := f.s.ClaimDue(f.ctx, outbox.ClaimRequest{Owner: me, Limit: 5, MaxBytes: 1 << 20, Succeeded: idsOf(sent)})
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, int64(len(sent)), res.Succeeded, "%s's leases are its own", me)
				sent = res.Events
				mu.Lock()
				for j, ev := range res.Events {
					if j > 0 && res.Events[j-1].BizNo == ev.BizNo {
						assert.Less(t, res.Events[j-1].ID, ev.ID, "a key's events in id order")
					} else if holder, busy := inFlight[ev.BizNo]; busy {
						t.Errorf("%s claimed event %d of key %s while %s holds the key's earlier events", me, ev.ID, ev.BizNo, holder)
					}
					inFlight[ev.BizNo] = me
					claimed[ev.BizNo] = append(claimed[ev.BizNo], ev.ID)
					total++
				}
				mu.Unlock()
				if len(res.Events) == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	for key, ids := range want {
		assert.Equal(t, ids, claimed[key], "key %s: each event once, in id order", key)
		for _, id := range ids {
			assert.Equal(t, outbox.StatusSuccess, f.get(id).Status)
		}
	}
}
