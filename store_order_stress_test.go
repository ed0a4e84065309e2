package outbox_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// keyWatch is the stress test's view of who holds each key: a claim takes a key only when
// no other claim holds it. A claim is a (worker, sequence) pair; a batch claim may hold a
// run of a key's events at once, sent in id order.
type keyWatch struct {
	mu         sync.Mutex
	holder     map[string]string  // key -> the claim that holds it
	sent       map[string][]int64 // key -> ids sent successfully, in send order
	violations []string
}

func newKeyWatch() *keyWatch {
	return &keyWatch{holder: map[string]string{}, sent: map[string][]int64{}}
}

// take records that claim took evs; a key held by another claim is a violation.
func (w *keyWatch) take(claim string, evs []outbox.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range evs {
		if h, ok := w.holder[ev.BizNo]; ok && h != claim {
			w.violations = append(w.violations, fmt.Sprintf("key %s: event %d claimed by %s while %s holds the key", ev.BizNo, ev.ID, claim, h))
		}
		w.holder[ev.BizNo] = claim
	}
}

// free forgets claim's hold on key: called before the writes that may let another claim
// take the key.
func (w *keyWatch) free(claim, key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.holder[key] == claim {
		delete(w.holder, key)
	}
}

// sentOK records a successful send; a key's sends must go up in id order.
func (w *keyWatch) sentOK(ev outbox.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.sent[ev.BizNo]
	if len(s) > 0 && s[len(s)-1] >= ev.ID {
		w.violations = append(w.violations, fmt.Sprintf("key %s: event %d sent after %d", ev.BizNo, ev.ID, s[len(s)-1]))
	}
	w.sent[ev.BizNo] = append(s, ev.ID)
}

// stressSend is one simulated send: the dead letter always fails, others fail at random.
type stressSend func(ev outbox.Event) (fail, dead bool)

// TestOrderedClaimStress: several claimers (separate stores and pools, as instances are) on
// many keys with several events each, random send failures retried after a short delay,
// and one dead letter, in both claim modes and both ordered modes. Never two claims hold
// one key (checked after every claim, in memory and on the table), each key's events are
// sent in id order, and a dead letter stops its key under KeyOrder until it is skipped.
func TestOrderedClaimStress(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"batch", "per-row"} {
		for _, o := range []outbox.Ordering{outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
			t.Run(mode+"/"+o.String(), func(t *testing.T) {
				t.Parallel()
				orderedStress(t, mode, o)
			})
		}
	}
}

func orderedStress(t *testing.T, mode string, o outbox.Ordering) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := orderedSetup(t)
	const (
		nKeys   = 40
		perKey  = 6
		workers = 4
	)
	keys := make([]string, nKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("ORD-%d", i)
	}
	ids := b.insertKeys(t, keys, perKey)
	dead := ids[keys[0]][1] // the dead letter: the second event of the first key
	watch := newKeyWatch()
	send := func(ev outbox.Event) (fail, isDead bool) {
		if ev.ID == dead {
			return true, true
		}
		return mrand.IntN(10) == 0, false
	}

	// done: every event but the dead letter and (KeyOrder) the ones behind it is sent.
	blockedBehind := map[int64]bool{}
	if o == outbox.KeyOrder {
		for _, id := range ids[keys[0]][2:] {
			blockedBehind[id] = true
		}
	}
	want := 0
	for _, k := range keys {
		for _, id := range ids[k] {
			if id != dead && !blockedBehind[id] {
				want++
			}
		}
	}
	sentCount := func() int {
		watch.mu.Lock()
		defer watch.mu.Unlock()
		n := 0
		for _, s := range watch.sent {
			n += len(s)
		}
		return n
	}

	checkTable := func() {
		rows, err := b.db.QueryContext(ctx, "SELECT biz_no FROM `"+outbox.TableForTest(b.store)+
			"` WHERE status = 'SENDING' GROUP BY biz_no HAVING COUNT(DISTINCT claim_owner) > 1")
		if err != nil {
			return // ctx done
		}
		defer rows.Close()
		for rows.Next() {
			var k string
			_ = rows.Scan(&k)
			watch.mu.Lock()
			watch.violations = append(watch.violations, "key "+k+" SENDING under two owners")
			watch.mu.Unlock()
		}
	}

	runUntil := func(stop func() bool) {
		wctx, wcancel := context.WithCancel(ctx)
		defer wcancel()
		var (
			wg   sync.WaitGroup
			errs = make([]error, workers)
		)
		for w := range workers {
			db := testsvc.OpenDB(t)
			store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store)})
			require.NoError(t, err)
			owner := fmt.Sprintf("w%d", w)
			wg.Go(func() {
				if mode == "batch" {
					errs[w] = stressBatchWorker(wctx, store, owner, o, watch, send, checkTable, stop)
				} else {
					errs[w] = stressPerRowWorker(wctx, store, owner, o, watch, send, checkTable, stop)
				}
				if errs[w] != nil {
					wcancel() // the others stop too
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
	}

	runUntil(func() bool { return sentCount() >= want })
	require.Empty(t, watch.violations)
	require.Equal(t, want, sentCount(), "every event sent exactly once, but the dead and the blocked")
	assert.Equal(t, outbox.StatusFail, b.get(t, dead).Status)

	if o == outbox.KeyOrder {
		for id := range blockedBehind {
			assert.Equal(t, outbox.StatusWait, b.get(t, id).Status, "KeyOrder: behind the dead letter, nothing moves")
		}
		blocked, err := b.admin().Blocked(ctx, 0, 0)
		require.NoError(t, err)
		require.Len(t, blocked, 1)
		assert.Equal(t, dead, blocked[0].ID)
		assert.Equal(t, int64(len(blockedBehind)), blocked[0].Waiting)
		require.NoError(t, b.admin().Skip(ctx, dead))
		want += len(blockedBehind)
		runUntil(func() bool { return sentCount() >= want })
		require.Empty(t, watch.violations)
		require.Equal(t, want, sentCount())
	}

	for _, k := range keys {
		exp := slices.DeleteFunc(slices.Clone(ids[k]), func(id int64) bool { return id == dead })
		assert.Equal(t, exp, watch.sent[k], "key %s sent in id order, each once", k)
	}
	var open int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE status IN ('WAIT', 'SENDING')").Scan(&open))
	assert.Zero(t, open)
}

// stressBatchWorker claims as a batch publisher does: each claim carries the last one's
// successes; a key's run is sent in order and stops at its first failure, the rest of the
// run released unsent.
func stressBatchWorker(ctx context.Context, s *outbox.MySQLStore, owner string, o outbox.Ordering, w *keyWatch,
	send stressSend, check func(), stop func() bool) error {
	s = outbox.WithOrderingForTest(s, o) // one store for the worker, claiming in o
	var succeeded []int64
	var held []string // keys of the last claim
	for seq := 0; ; seq++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		claim := fmt.Sprintf("%s#%d", owner, seq)
		// The last claim's keys are freed by this claim (its successes) or were freed by
		// its releases already.
		for _, k := range held {
			w.free(fmt.Sprintf("%s#%d", owner, seq-1), k)
		}
		res, err := s.ClaimDue(ctx, outbox.ClaimRequest{Owner: owner, Limit: 10, MaxBytes: 1 << 20,
			Succeeded: succeeded})
		if err != nil {
			return fmt.Errorf("%s: %w", claim, err)
		}
		succeeded, held = nil, nil
		w.take(claim, res.Events)
		check()
		if len(res.Events) == 0 {
			if stop() {
				return nil
			}
			time.Sleep(2 * time.Millisecond)
			continue
		}
		failed := map[string]bool{}
		// A failed event's retry is written after the claim's later events of its key are
		// released, as their "not sent": made due again first, it could be claimed by
		// another worker while this one still holds its key's later events.
		var retries []func() error
		for _, ev := range res.Events {
			if len(held) == 0 || held[len(held)-1] != ev.BizNo {
				held = append(held, ev.BizNo)
			}
			if failed[ev.BizNo] {
				// Not sent: back to WAIT, no attempt counted, due now.
				if _, err := s.ReleaseForRetry(ctx, ev.ID, owner, ev.RetryCount, 0, "", "not sent"); err != nil {
					return err
				}
				continue
			}
			fail, isDead := send(ev)
			if !fail {
				w.sentOK(ev)
				succeeded = append(succeeded, ev.ID)
				continue
			}
			failed[ev.BizNo] = true
			if isDead {
				// The key is freed by this write (when nothing of it succeeded in this claim).
				w.free(claim, ev.BizNo)
				if _, _, err := s.MarkFail(ctx, ev.ID, owner, ev.RetryCount+1, "permanent", "poison"); err != nil {
					return err
				}
				continue
			}
			retries = append(retries, func() error {
				w.free(claim, ev.BizNo) // the key is freed by this write
				_, err := s.ReleaseForRetry(ctx, ev.ID, owner, ev.RetryCount+1, 5*time.Millisecond, "retryable", "boom")
				return err
			})
		}
		for _, retry := range retries {
			if err := retry(); err != nil {
				return err
			}
		}
	}
}

// stressPerRowWorker claims as a per-row publisher does: candidates, then one claim, send
// and acknowledgement per event; after a failure, the key's other candidates wait for the
// next round.
func stressPerRowWorker(ctx context.Context, s *outbox.MySQLStore, owner string, o outbox.Ordering, w *keyWatch,
	send stressSend, check func(), stop func() bool) error {
	s = outbox.WithOrderingForTest(s, o) // one store for the worker, claiming in o
	for seq := 0; ; seq++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cands, err := s.Candidates(ctx, 20)
		if err != nil {
			return err
		}
		claimed := 0
		failed := map[string]bool{}
		for i, ev := range cands {
			if failed[ev.BizNo] {
				continue
			}
			won, err := s.Claim(ctx, ev, owner)
			if err != nil {
				return err
			}
			if !won {
				failed[ev.BizNo] = true // its later candidates cannot go either
				continue
			}
			claimed++
			claim := fmt.Sprintf("%s#%d.%d", owner, seq, i)
			w.take(claim, []outbox.Event{ev})
			check()
			fail, isDead := send(ev)
			w.free(claim, ev.BizNo)
			switch {
			case !fail:
				w.sentOK(ev)
				_, err = s.MarkSuccess(ctx, []int64{ev.ID}, owner)
			case isDead:
				failed[ev.BizNo] = true
				_, _, err = s.MarkFail(ctx, ev.ID, owner, ev.RetryCount+1, "permanent", "poison")
			default:
				failed[ev.BizNo] = true
				_, err = s.ReleaseForRetry(ctx, ev.ID, owner, ev.RetryCount+1, 5*time.Millisecond, "retryable", "boom")
			}
			if err != nil {
				return err
			}
		}
		if claimed == 0 {
			if stop() {
				return nil
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
}
