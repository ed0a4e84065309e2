package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// The batch claim in key order takes whole keys: each key's head, then the due run behind
// it in id order (docs/ordering.md, "How the claim finds each key's head"). These tests
// hold it to what it may take and where a run stops.

// A claim takes each free key's whole due run, however its events interleave with other
// keys' in the scan, and the claim that records them leaves nothing of the keys behind.
func TestOrderedClaimTakesWholeRuns(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"K", "L"}, 20) // K0 L0 K1 L1 ...: each key's ids apart
	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 100)
	assert.Equal(t, ids, byKey(res.Events), "both runs, whole, each in id order")
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, idsOf(res.Events)...)
	assert.Equal(t, int64(40), res.Succeeded)
	assert.Empty(t, res.Events)
}

// An event that is not yet due cuts its key's run: the events before it go, the events
// behind it wait for it, and go after it.
func TestOrderedClaimRunCutByNotDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			b := orderedSetupWith(t, o)
			k := b.insertKeys(t, []string{"K"}, 6)["K"]
			b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", k[3])
			res := orderedClaim(t, b.store, "one", o, 100)
			assert.Equal(t, k[:3], idsOf(res.Events), "the run up to the event not due")
			res = orderedClaim(t, b.store, "one", o, 100, k[:3]...)
			assert.Empty(t, res.Events, "the events behind it wait for it")
			evs, err := outbox.WithOrderingForTest(b.store, o).Candidates(ctx, 100)
			require.NoError(t, err)
			assert.Empty(t, evs, "per row too")
			b.makeDue(t, k[3])
			res = orderedClaim(t, b.store, "one", o, 100)
			assert.Equal(t, k[3:], idsOf(res.Events))
		})
	}
}

// An event another transaction holds (a lock the claim skips) cuts its key's run there: the
// claim never takes the events behind it without it.
func TestOrderedClaimRunCutByLockedRow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	k := b.insertKeys(t, []string{"K"}, 6)["K"]
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	var id int64
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT id FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ? FOR UPDATE", k[2]).Scan(&id))
	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 100)
	assert.Equal(t, k[:2], idsOf(res.Events), "the run up to the locked event")
	require.NoError(t, tx.Rollback())
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, k[:2]...)
	assert.Equal(t, k[2:], idsOf(res.Events))
}

// A key whose head another claim holds is skipped whole: neither its head nor any event of
// its run is taken, and the other keys' runs are.
func TestOrderedClaimSkipsAKeyWhoseHeadIsHeld(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := orderedSetup(t)
	ids := b.insertKeys(t, []string{"K", "L"}, 5)
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	var id int64
	require.NoError(t, tx.QueryRowContext(ctx, "SELECT id FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ? FOR UPDATE", ids["K"][0]).Scan(&id))
	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 100)
	assert.Equal(t, map[string][]int64{"L": ids["L"]}, byKey(res.Events))
}

// The run behind a head stops at the key's first event in flight (SENDING: another
// instance's, about to be released, say) and, in KeyOrder, at its first dead letter; in
// KeyOrderSkipDeadLetters a dead letter does not stop it.
func TestOrderedClaimRunStopsAtOpenEvents(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status outbox.Status
		o      outbox.Ordering
		want   func(k []int64) []int64
	}{
		{outbox.StatusSending, outbox.KeyOrder, func(k []int64) []int64 { return k[:1] }},
		{outbox.StatusSending, outbox.KeyOrderSkipDeadLetters, func(k []int64) []int64 { return k[:1] }},
		{outbox.StatusFail, outbox.KeyOrder, func(k []int64) []int64 { return k[:1] }},
		{outbox.StatusFail, outbox.KeyOrderSkipDeadLetters, func(k []int64) []int64 { return []int64{k[0], k[2], k[3]} }},
	} {
		t.Run(fmt.Sprintf("%s/%s", c.status, c.o), func(t *testing.T) {
			t.Parallel()
			b := orderedSetupWith(t, c.o)
			k := b.insertKeys(t, []string{"K"}, 4)["K"]
			b.exec(t, "UPDATE {t} SET status = ?, claim_owner = 'x', claimed_at = UTC_TIMESTAMP(3) WHERE id = ?", string(c.status), k[1])
			res := orderedClaim(t, b.store, "one", c.o, 100)
			assert.Equal(t, c.want(k), idsOf(res.Events))
		})
	}
}

// A reclaimed event in a run cuts it, and then goes alone, as a reclaimed head does.
func TestOrderedClaimRunCutByReclaimedEvent(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	k := b.insertKeys(t, []string{"K"}, 3)["K"]
	b.exec(t, "UPDATE {t} SET reclaim_count = 1 WHERE id = ?", k[1])
	res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 100)
	assert.Equal(t, k[:1], idsOf(res.Events))
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, k[0])
	assert.Equal(t, k[1:2], idsOf(res.Events), "the reclaimed event alone")
	res = orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, k[1])
	assert.Equal(t, k[2:], idsOf(res.Events))
}

// Biz nos that differ only in case are one key to the server (the column's collation) and
// two to everyone else: the claim keeps each one's events in id order and grouped, and never
// lets one run ahead of the other's earlier event.
func TestOrderedClaimCaseTwins(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	var ids []int64
	for _, k := range []string{"Ab", "aB", "Ab", "aB"} {
		ids = append(ids, b.insertKeys(t, []string{k}, 1)[k][0])
	}
	var claimed []int64
	var last []int64
	for range len(ids) + 1 {
		res := orderedClaim(t, b.store, "one", outbox.KeyOrder, 100, last...)
		last = idsOf(res.Events)
		claimed = append(claimed, last...)
		if len(last) == 0 {
			break
		}
	}
	assert.Equal(t, ids, claimed, "one at a time, in id order: each one's run is cut at its twin's event")
}

// One store learns the keys' run length: once it has seen the runs, each claim locks about
// as many heads as runs fill its limit, and takes the runs whole.
func TestOrderedClaimSizesHeadsToRuns(t *testing.T) {
	t.Parallel()
	b := orderedSetup(t)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("K%02d", i)
	}
	ids := b.insertKeys(t, keys, 25)
	s := outbox.WithOrderingForTest(b.store, outbox.KeyOrder)
	var last []int64
	total := 0
	for claim := 0; total < 500; claim++ {
		require.Less(t, claim, 40)
		res, err := s.ClaimDue(context.Background(), outbox.ClaimRequest{Owner: "one", Limit: 100, MaxBytes: 1 << 20, Succeeded: last})
		require.NoError(t, err)
		requireGrouped(t, res.Events)
		last = idsOf(res.Events)
		total += len(last)
		per := byKey(res.Events)
		counts := map[string]int{}
		for k, evs := range per {
			counts[k] = len(evs)
		}
		t.Logf("claim %d: %d events of %d keys: %v", claim, len(last), len(per), counts)
		if claim >= 2 && total < 400 {
			assert.LessOrEqual(t, len(per), 6, "claim %d: about 100/25 keys", claim)
			assert.GreaterOrEqual(t, len(last), 75, "claim %d: close to the limit", claim)
			whole := 0
			for k, evs := range per {
				if evs[len(evs)-1] == ids[k][24] {
					whole++
				}
			}
			assert.GreaterOrEqual(t, whole, len(per)-1, "claim %d: each key's run whole, but for the one the limit cut", claim)
		}
	}
	assert.Equal(t, 500, total)
}

// Three instances (stores on pools of their own) claim, send and record concurrently from
// interleaved long runs: no claim ever takes an event of a key whose earlier event another
// holds, each key's events are claimed once, in id order, and the claims take runs, not one
// event of each key at a time.
func TestOrderedClaimConcurrentLongRuns(t *testing.T) {
	t.Parallel()
	for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			concurrentLongRuns(t, o)
		})
	}
}

func concurrentLongRuns(t *testing.T, o outbox.Ordering) {
	b := orderedSetupWith(t, o)
	const nKeys, per, instances, limit = 30, 40, 3, 64
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("ORD-%d", i)
	}
	want := b.insertKeys(t, keys, per)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var (
		mu       sync.Mutex
		inFlight = map[string]string{} // key -> the instance holding its events
		claimed  = map[string][]int64{}
		total    int
		claims   int
		keyRuns  int // keys taken, summed over the claims
	)
	var wg sync.WaitGroup
	for i := range instances {
		s := outbox.OnDBForTest(b.store, testsvc.OpenDB(t))
		wg.Go(func() {
			me := fmt.Sprintf("instance-%d", i)
			var sent []outbox.Event
			for ctx.Err() == nil {
				// Sent: done here before the store hears of it, so that a claim that follows
				// the record never finds the key still in flight.
				mu.Lock()
				for _, ev := range sent {
					delete(inFlight, ev.BizNo)
				}
				done := total == nKeys*per
				mu.Unlock()
				if done {
					_, err := s.MarkSuccess(ctx, idsOf(sent), me)
					assert.NoError(t, err)
					return
				}
				res, err := s.ClaimDue(ctx, outbox.ClaimRequest{Owner: me, Limit: limit, MaxBytes: 1 << 20, Succeeded: idsOf(sent)})
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, int64(len(sent)), res.Succeeded, "%s's leases are its own", me)
				sent = res.Events
				mu.Lock()
				if len(res.Events) > 0 {
					claims++
					keyRuns += len(byKey(res.Events))
				}
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
	require.NoError(t, ctx.Err(), "every event claimed within a minute")
	for key, ids := range want {
		assert.Equal(t, ids, claimed[key], "key %s: each event once, in id order", key)
	}
	assert.Zero(t, b.count(t, "status <> 'SUCCESS'"), "every event recorded")
	// One event of each key a claim would make the mean run 1.
	mean := float64(nKeys*per) / float64(keyRuns)
	t.Logf("%d claims, %d keys taken, a mean run of %.1f events", claims, keyRuns, mean)
	assert.Greater(t, mean, 4.0, "the claims take runs")
}
