package outboxtest_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// kit is a real MySQLStore over a table of its own, as a service's test has it, with its
// Admin for reading rows back.
type kit struct {
	store *outbox.MySQLStore
	admin *outbox.Admin
}

func newKit(t *testing.T) *kit {
	t.Helper()
	store := testsvc.NewStore(t, testsvc.OpenDB(t), outbox.MySQLConfig{})
	return &kit{store: store, admin: outbox.NewAdmin(store)}
}

// quick is a publisher config for the kit's tests: quick polls, retries at once, no logs.
func quick(cfg outbox.Config) outbox.Config {
	cfg.PollInterval = 10 * time.Millisecond
	if cfg.Backoff == nil {
		cfg.Backoff = func(int) time.Duration { return 0 }
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Tuning.ReclaimInterval = 50 * time.Millisecond
	cfg.Tuning.MaxProbeDelay = 50 * time.Millisecond
	return cfg
}

// start starts a publisher of k's store over sender, closed when t ends.
func (k *kit) start(t *testing.T, sender outbox.Sender, cfg outbox.Config) *outbox.Publisher {
	t.Helper()
	p, err := outbox.NewPublisher(k.store, sender, quick(cfg))
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
	return p
}

// insert commits evs in one business transaction and returns their event ids.
func (k *kit) insert(t *testing.T, evs ...outbox.EventInput) []string {
	t.Helper()
	tx, err := k.store.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i], err = tx.InsertEvent(t.Context(), ev)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	return ids
}

// row reads an event back by its event id.
func (k *kit) row(t *testing.T, eventID string) outbox.Event {
	t.Helper()
	ev, err := k.admin.GetByEventID(t.Context(), eventID)
	require.NoError(t, err)
	return ev
}

// waitStatus waits until the event's row has the status (the publisher records an outcome
// after the send returns).
func (k *kit) waitStatus(t *testing.T, eventID string, want outbox.Status) outbox.Event {
	t.Helper()
	var ev outbox.Event
	require.Eventually(t, func() bool {
		ev = k.row(t, eventID)
		return ev.Status == want
	}, 30*time.Second, 10*time.Millisecond, "event %s becomes %s", eventID, want)
	return ev
}

func order(no, typ string) outbox.EventInput {
	return outbox.EventInput{BizNo: no, EventType: typ, Payload: fmt.Appendf(nil, `{"order":%q}`, no)}
}

// waitCtx bounds a wait of a test.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A real Publisher over a real MySQLStore sends through the MemorySender: the test waits
// for the events and finds them as written, by biz no, type and topic, in commit order.
func TestMemorySenderRecordsWhatThePublisherSent(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	assert.Equal(t, outbox.SenderInfo{System: "memory"}, sent.Info())
	k.start(t, sent, outbox.Config{})

	ids := k.insert(t, order("ORD-1", "ORDER_CREATED"), order("ORD-1", "ORDER_PAID"), order("ORD-2", "ORDER_CREATED"))
	evs, err := sent.WaitFor(waitCtx(t), 3)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	got := map[string]outbox.Event{}
	for _, ev := range evs {
		got[ev.EventID] = ev
	}
	for i, in := range []outbox.EventInput{order("ORD-1", "ORDER_CREATED"), order("ORD-1", "ORDER_PAID"), order("ORD-2", "ORDER_CREATED")} {
		ev, ok := got[ids[i]]
		require.True(t, ok, "event %d was sent", i)
		assert.Equal(t, in.BizNo, ev.BizNo)
		assert.Equal(t, in.EventType, ev.EventType)
		assert.Equal(t, in.Payload, ev.Payload)
	}
	assert.Len(t, sent.ByBizNo("ORD-1"), 2)
	assert.Len(t, sent.ByType("ORDER_CREATED"), 2)
	assert.Len(t, sent.ByTopic("ORDER_EVENT_TOPIC"), 3, "no topic named: the store's default")
	assert.Empty(t, sent.ByTopic("PAYMENTS"))
	assert.Equal(t, 3, sent.Len())
	for _, id := range ids {
		k.waitStatus(t, id, outbox.StatusSuccess)
	}

	sent.Reset()
	assert.Zero(t, sent.Len())
	assert.Zero(t, sent.Calls())
	id := k.insert(t, order("ORD-3", "ORDER_CREATED"))[0]
	evs, err = sent.WaitFor(waitCtx(t), 1)
	require.NoError(t, err)
	assert.Equal(t, id, evs[0].EventID, "after Reset, WaitFor waits for what is sent next")
}

// In key order the MemorySender records each biz no's events in the order of their commit.
func TestMemorySenderKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	store := testsvc.NewStore(t, testsvc.OpenDB(t), outbox.MySQLConfig{Ordering: outbox.KeyOrder})
	k := &kit{store: store, admin: outbox.NewAdmin(store)}
	sent := outboxtest.NewMemorySender()
	k.start(t, sent, outbox.Config{})
	var want []string
	for i := range 20 {
		want = append(want, k.insert(t, order("ORD-K", fmt.Sprintf("STEP_%d", i)))...)
	}
	_, err := sent.WaitFor(waitCtx(t), 20)
	require.NoError(t, err)
	var got []string
	for _, ev := range sent.ByBizNo("ORD-K") {
		got = append(got, ev.EventID)
	}
	assert.Equal(t, want, got)
}

// The record is a copy: what the sender's caller or the test changes afterwards changes
// nothing recorded.
func TestMemorySenderKeepsCopies(t *testing.T) {
	t.Parallel()
	sent := outboxtest.NewMemorySender()
	ev := outbox.Event{Topic: "ORDERS", EventID: "e1", BizNo: "ORD-1", Payload: []byte("abc"), Failures: []outbox.Failure{{Class: "x"}}}
	require.Equal(t, []error{nil}, sent.Send(t.Context(), []outbox.Event{ev}, false))
	ev.Payload[0], ev.Failures[0].Class = 'X', "changed"
	got := sent.Events()
	got[0].Payload[1] = 'Y'
	again := sent.Events()
	assert.Equal(t, []byte("abc"), again[0].Payload)
	assert.Equal(t, "x", again[0].Failures[0].Class)
}

// A Send whose ctx is done records nothing and answers ErrNotSent; a WaitFor whose ctx
// ends returns what it has and ctx's error.
func TestMemorySenderHonoursContext(t *testing.T) {
	t.Parallel()
	sent := outboxtest.NewMemorySender()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	errs := sent.Send(ctx, []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e1"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "e2"}}, false)
	require.Len(t, errs, 2)
	for _, err := range errs {
		assert.ErrorIs(t, err, outbox.ErrNotSent)
		assert.ErrorIs(t, err, context.Canceled)
	}
	assert.Zero(t, sent.Len())

	require.Equal(t, []error{nil}, sent.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e3"}}, false))
	evs, err := sent.WaitFor(ctx, 2)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "waited for 2 events, 1 sent")
	assert.Len(t, evs, 1)
}

// Many senders and waiters at once, under -race: every waiter sees its events, none is
// lost, and a zero MemorySender works as well as a new one.
func TestMemorySenderConcurrentUse(t *testing.T) {
	t.Parallel()
	for name, sent := range map[string]*outboxtest.MemorySender{"new": outboxtest.NewMemorySender(), "zero": {}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const senders, each = 8, 50
			var wg sync.WaitGroup
			waited := make([]int, 4)
			for w := range waited {
				wg.Go(func() {
					evs, err := sent.WaitForMatch(waitCtx(t), each, func(ev outbox.Event) bool { return ev.BizNo == fmt.Sprint(w) })
					assert.NoError(t, err)
					waited[w] = len(evs)
				})
			}
			for s := range senders {
				wg.Go(func() {
					for i := range each {
						errs := sent.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: fmt.Sprintf("%d-%d", s, i), BizNo: fmt.Sprint(s)}}, true)
						assert.Equal(t, []error{nil}, errs)
						_ = sent.Len()
						_ = sent.ByBizNo("1")
					}
				})
			}
			wg.Wait()
			assert.Equal(t, []int{each, each, each, each}, waited)
			assert.Equal(t, senders*each, sent.Len())
			assert.Equal(t, senders*each, sent.Calls())
		})
	}
}

// Two publishers of one store send through one MemorySender at once; each event is
// recorded once.
func TestMemorySenderServesTwoPublishers(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	k.start(t, sent, outbox.Config{InstanceID: "kit-a"})
	k.start(t, sent, outbox.Config{InstanceID: "kit-b"})
	const writers, each = 4, 25
	ids := make([][]string, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				tx, err := k.store.BeginTx(t.Context(), nil)
				if !assert.NoError(t, err) {
					return
				}
				id, err := tx.InsertEvent(t.Context(), order(fmt.Sprintf("ORD-%d-%d", w, i), "ORDER_CREATED"))
				assert.NoError(t, err)
				assert.NoError(t, tx.Commit())
				ids[w] = append(ids[w], id)
			}
		})
	}
	wg.Wait()
	_, err := sent.WaitFor(waitCtx(t), writers*each)
	require.NoError(t, err)
	seen := map[string]int{}
	for _, ev := range sent.Events() {
		seen[ev.EventID]++
	}
	for _, w := range ids {
		for _, id := range w {
			assert.Equal(t, 1, seen[id], "event %s recorded once", id)
		}
	}
	assert.Len(t, seen, writers*each)
}

// A predicate may read the sender: it runs outside the sender's lock.
func TestMemorySenderPredicateMayReadTheSender(t *testing.T) {
	t.Parallel()
	sent := outboxtest.NewMemorySender()
	require.Equal(t, []error{nil, nil}, sent.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e1"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "e2"}}, false))
	firstOnly := func(ev outbox.Event) bool { return ev.EventID == sent.Events()[0].EventID && sent.Len() == 2 }
	assert.Len(t, sent.Match(firstOnly), 1)
	evs, err := sent.WaitForMatch(waitCtx(t), 1, firstOnly)
	require.NoError(t, err)
	assert.Equal(t, "e1", evs[0].EventID)
}
