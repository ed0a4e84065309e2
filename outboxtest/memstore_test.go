package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
)

// memHarness is the conformance suite's harness for a MemoryStore: the rows are the
// store's own, changed under its lock, by its clock.
type memHarness struct {
	s *MemoryStore
	o outbox.Ordering
}

func newMemHarness(o outbox.Ordering) *memHarness {
	return &memHarness{s: NewMemoryStore(MemoryStoreOptions{Ordering: o, Topics: []string{"PAYMENTS"}}), o: o}
}

func (h *memHarness) Store() outbox.Store       { return h.s }
func (h *memHarness) Ordering() outbox.Ordering { return h.o }
func (h *memHarness) Topics() []string          { return []string{"PAYMENTS"} }
func (h *memHarness) Now(testing.TB) time.Time  { return h.s.now() }

func (h *memHarness) Insert(t testing.TB, evs ...outbox.EventInput) []int64 {
	t.Helper()
	written, err := h.s.Insert(context.Background(), evs...)
	require.NoError(t, err)
	ids := make([]int64, len(written))
	for i, ev := range written {
		ids[i] = ev.ID
	}
	return ids
}

func (h *memHarness) Get(_ testing.TB, id int64) (outbox.Event, bool) { return h.s.Get(id) }

// row changes the row with the given id under the store's lock; it must exist.
func (h *memHarness) row(t testing.TB, id int64, change func(ev *outbox.Event, now time.Time)) {
	t.Helper()
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	ev, ok := h.s.rows[id]
	if !ok {
		t.Fatalf("event %d does not exist", id)
	}
	change(ev, h.s.now())
}

func (h *memHarness) SetNextRetry(t testing.TB, id int64, d time.Duration) {
	t.Helper()
	h.row(t, id, func(ev *outbox.Event, now time.Time) { ev.NextRetryTime = now.Add(d) })
}

func (h *memHarness) Backdate(t testing.TB, id int64, d time.Duration) {
	t.Helper()
	h.row(t, id, func(ev *outbox.Event, _ time.Time) {
		ev.CreateTime, ev.UpdateTime, ev.NextRetryTime = ev.CreateTime.Add(-d), ev.UpdateTime.Add(-d), ev.NextRetryTime.Add(-d)
		if !ev.ClaimedAt.IsZero() {
			ev.ClaimedAt = ev.ClaimedAt.Add(-d)
		}
	})
}

func (h *memHarness) Skip(t testing.TB, id int64) {
	t.Helper()
	h.row(t, id, func(ev *outbox.Event, now time.Time) {
		if ev.Status != outbox.StatusFail {
			t.Fatalf("event %d is %s, not a dead letter", id, ev.Status)
		}
		ev.Status, ev.UpdateTime = outbox.StatusSkipped, now
	})
}

// TestMemoryStoreConformance runs the whole Store contract against a MemoryStore in each
// ordering, the topic case included: no case may be skipped.
func TestMemoryStoreConformance(t *testing.T) {
	for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			RunStoreTests(t, func(t *testing.T) Harness {
				t.Cleanup(func() {
					if t.Skipped() && (o != outbox.Unordered || !slices.ContainsFunc(keyOrderCases, func(c storeCase) bool { return t.Name() == caseName(o, c) })) {
						t.Errorf("a MemoryStore skips no case of its ordering")
					}
				})
				return newMemHarness(o)
			})
		})
	}
}

// caseName is the full name of the suite's case c run under TestMemoryStoreConformance in
// ordering o.
func caseName(o outbox.Ordering, c storeCase) string {
	return "TestMemoryStoreConformance/" + o.String() + "/" + c.name
}

// memQuick is a publisher config for the tests over a MemoryStore: quick polls, retries at
// once, no logs.
func memQuick(cfg outbox.Config) outbox.Config {
	cfg.PollInterval = 5 * time.Millisecond
	cfg.Backoff = func(int) time.Duration { return 0 }
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Tuning.ReclaimInterval = 50 * time.Millisecond
	cfg.Tuning.MaxProbeDelay = 50 * time.Millisecond
	return cfg
}

// startMem starts a publisher over store and sender, closed when t ends.
func startMem(t *testing.T, store *MemoryStore, sender outbox.Sender, cfg outbox.Config) {
	t.Helper()
	p, err := outbox.NewPublisher(store, sender, memQuick(cfg))
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() { assert.NoError(t, p.Close()) })
}

// waitAllSent waits until every event of store is SUCCESS.
func waitAllSent(t *testing.T, store *MemoryStore, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		evs := store.Events()
		return len(evs) == n && !slices.ContainsFunc(evs, func(ev outbox.Event) bool { return ev.Status != outbox.StatusSuccess })
	}, 30*time.Second, 5*time.Millisecond, "every event is SUCCESS")
}

// A real Publisher over a MemoryStore sends every event Insert wrote through a
// MemorySender, each once, and records them SUCCESS; no database, no broker.
func TestMemoryStoreRunsAPublisher(t *testing.T) {
	t.Parallel()
	for _, perRow := range []bool{false, true} {
		t.Run(fmt.Sprintf("ClaimPerRow=%t", perRow), func(t *testing.T) {
			t.Parallel()
			store := NewMemoryStore(MemoryStoreOptions{Topics: []string{"PAYMENTS"}})
			sent := NewMemorySender()
			cfg := outbox.Config{}
			cfg.Tuning.ClaimPerRow = perRow
			startMem(t, store, sent, cfg)

			const n = 200
			want := map[string]string{} // event id -> topic
			for i := range n / 10 {
				evs := make([]outbox.EventInput, 10)
				for j := range evs {
					evs[j] = outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d-%d", i, j), EventType: "ORDER_CREATED", Payload: []byte(`{}`)}
					if j%2 == 1 {
						evs[j].Topic = "PAYMENTS"
					}
				}
				written, err := store.Insert(t.Context(), evs...)
				require.NoError(t, err)
				for _, ev := range written {
					want[ev.EventID] = ev.Topic
				}
			}
			got, err := sent.WaitFor(waitFor(t), n)
			require.NoError(t, err)
			waitAllSent(t, store, n)
			seen := map[string]bool{}
			for _, ev := range got {
				assert.False(t, seen[ev.EventID], "event %s sent once", ev.EventID)
				seen[ev.EventID] = true
				assert.Equal(t, want[ev.EventID], ev.Topic)
			}
			assert.Len(t, seen, n)
			assert.Len(t, sent.ByTopic("PAYMENTS"), n/2)
			assert.Len(t, sent.ByTopic("ORDER_EVENT_TOPIC"), n/2, "the default topic, the MySQL store's")
		})
	}
}

// In key order, two publishers over one MemoryStore send each biz no's events in the order
// they were inserted, while the biz nos go on side by side.
func TestMemoryStoreRunsAPublisherInKeyOrder(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore(MemoryStoreOptions{Ordering: outbox.KeyOrder})
	sent := NewMemorySender()
	startMem(t, store, sent, outbox.Config{})
	startMem(t, store, sent, outbox.Config{})

	const keys, per = 10, 20
	want := map[string][]string{}
	for i := range per {
		evs := make([]outbox.EventInput, keys)
		for k := range evs {
			evs[k] = outbox.EventInput{BizNo: fmt.Sprintf("ORD-%d", k), EventType: fmt.Sprintf("STEP_%d", i), Payload: []byte(`{}`)}
		}
		written, err := store.Insert(t.Context(), evs...)
		require.NoError(t, err)
		for _, ev := range written {
			want[ev.BizNo] = append(want[ev.BizNo], ev.EventID)
		}
	}
	_, err := sent.WaitFor(waitFor(t), keys*per)
	require.NoError(t, err)
	waitAllSent(t, store, keys*per)
	for key, ids := range want {
		var got []string
		for _, ev := range sent.ByBizNo(key) {
			got = append(got, ev.EventID)
		}
		assert.Equal(t, ids, got, "biz no %s: its events in insert order, each once", key)
	}
}

// A failed send is retried and recorded in the history; a refused one is dead-lettered,
// and in KeyOrder holds its biz no's later events.
func TestMemoryStorePublisherRetriesAndDeadLetters(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore(MemoryStoreOptions{Ordering: outbox.KeyOrder})
	var (
		mu    sync.Mutex
		tries = map[string]int{}
	)
	send := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		tries[ev.EventType]++
		switch {
		case ev.EventType == "FLAKY" && tries[ev.EventType] == 1:
			return errors.New("broker busy")
		case ev.EventType == "REFUSED":
			return outbox.Permanent(errors.New("refused"))
		}
		return nil
	})
	startMem(t, store, send, outbox.Config{})
	written, err := store.Insert(t.Context(),
		outbox.EventInput{BizNo: "A", EventType: "FLAKY", Payload: []byte(`{}`)},
		outbox.EventInput{BizNo: "B", EventType: "REFUSED", Payload: []byte(`{}`)},
		outbox.EventInput{BizNo: "B", EventType: "HELD", Payload: []byte(`{}`)},
	)
	require.NoError(t, err)
	flaky, refused, held := written[0].ID, written[1].ID, written[2].ID
	require.Eventually(t, func() bool {
		a, _ := store.Get(flaky)
		b, _ := store.Get(refused)
		return a.Status == outbox.StatusSuccess && b.Status == outbox.StatusFail
	}, 30*time.Second, 5*time.Millisecond)
	a, _ := store.Get(flaky)
	assert.Equal(t, 1, a.RetryCount)
	require.Len(t, a.Failures, 1)
	assert.Equal(t, "retryable", a.Failures[0].Class)
	b, _ := store.Get(refused)
	require.Len(t, b.Failures, 1)
	assert.Equal(t, "permanent", b.Failures[0].Class)
	c, _ := store.Get(held)
	assert.Equal(t, outbox.StatusWait, c.Status)
	cands, err := store.Candidates(t.Context(), 10)
	require.NoError(t, err)
	for _, ev := range cands {
		assert.NotEqual(t, "B", ev.BizNo, "a dead letter holds its key: B's later event is not claimable")
	}
}

// Insert checks each event as InsertEvent does, and writes all or none.
func TestMemoryStoreInsertRefusesInvalidEvents(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore(MemoryStoreOptions{Topic: "ORDERS", Topics: []string{"PAYMENTS"}})
	ok := outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{}`)}
	for name, ev := range map[string]outbox.EventInput{
		"no biz no":       {EventType: "E", Payload: []byte(`{}`)},
		"spaced biz no":   {BizNo: "A B", EventType: "E", Payload: []byte(`{}`)},
		"long event type": {BizNo: "A", EventType: strings.Repeat("E", 65), Payload: []byte(`{}`)},
		"wildcard type":   {BizNo: "A", EventType: "*", Payload: []byte(`{}`)},
		"no payload":      {BizNo: "A", EventType: "E"},
		"negative delay":  {BizNo: "A", EventType: "E", Payload: []byte(`{}`), Delay: -time.Second},
		"delay and time":  {BizNo: "A", EventType: "E", Payload: []byte(`{}`), Delay: time.Second, NotBefore: time.Now()},
		"unknown topic":   {BizNo: "A", EventType: "E", Payload: []byte(`{}`), Topic: "ELSEWHERE"},
	} {
		_, err := store.Insert(t.Context(), ok, ev)
		assert.ErrorIs(t, err, outbox.ErrInvalidEvent, name)
	}
	_, err := store.Insert(t.Context(), ok, outbox.EventInput{BizNo: "A", EventType: "E", Payload: make([]byte, defaultMaxMessageBytes+1)})
	assert.ErrorIs(t, err, outbox.ErrPayloadTooLarge)
	assert.Empty(t, store.Events(), "an insert with an invalid event writes nothing")

	written, err := store.Insert(t.Context(), ok, outbox.EventInput{BizNo: "ORD-2", EventType: strings.Repeat("E", 64),
		Payload: []byte(`{}`), Topic: "PAYMENTS"})
	require.NoError(t, err)
	require.Len(t, written, 2)
	assert.Equal(t, "ORDERS", written[0].Topic, "no topic named: the store's default")
	assert.Equal(t, "PAYMENTS", written[1].Topic)
	assert.NotEqual(t, written[0].EventID, written[1].EventID)
	assert.Equal(t, written, store.Events())
	info, err := store.Check(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"ORDERS", "PAYMENTS"}, info.Topics)
}

// A delayed event is due by the store's clock: a test that moves the clock makes it due
// without waiting.
func TestMemoryStoreDelayByItsClock(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		now = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	store := NewMemoryStore(MemoryStoreOptions{Now: clock})
	_, err := store.Insert(t.Context(), outbox.EventInput{BizNo: "A", EventType: "E", Payload: []byte(`{}`), Delay: time.Hour})
	require.NoError(t, err)
	evs, err := store.Candidates(t.Context(), 10)
	require.NoError(t, err)
	assert.Empty(t, evs, "not due for an hour")
	mu.Lock()
	now = now.Add(time.Hour)
	mu.Unlock()
	evs, err = store.Candidates(t.Context(), 10)
	require.NoError(t, err)
	require.Len(t, evs, 1, "due once the store's clock has moved an hour")
	assert.Equal(t, time.Hour, evs[0].Read.Deferred)
	assert.Equal(t, time.Hour, evs[0].Read.Age)
}

// waitFor bounds a wait of a test, for liveness only.
func waitFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// NewMemoryStore refuses, by panicking, options no store could serve: a topic the broker
// refuses (its name, or one of its own topics), a topic named twice, an unknown ordering.
func TestNewMemoryStorePanicsOnBadOptions(t *testing.T) {
	t.Parallel()
	for name, o := range map[string]MemoryStoreOptions{
		"bad name":         {Topic: "ORDERS!"},
		"system topic":     {Topics: []string{"TBW102"}},
		"named twice":      {Topic: "ORDERS", Topics: []string{"ORDERS"}},
		"unknown ordering": {Ordering: outbox.Ordering(99)},
	} {
		assert.Panics(t, func() { NewMemoryStore(o) }, name)
	}
}

// What the store returns is a copy: a caller that changes it changes nothing in the store.
func TestMemoryStoreReturnsCopies(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore(MemoryStoreOptions{})
	written, err := store.Insert(t.Context(), outbox.EventInput{BizNo: "A", EventType: "E", Payload: []byte(`{"a":1}`)})
	require.NoError(t, err)
	written[0].Payload[0] = 'X'
	got, ok := store.Get(written[0].ID)
	require.True(t, ok)
	got.Payload[1] = 'X'
	store.Events()[0].Payload[2] = 'X'
	again, _ := store.Get(written[0].ID)
	assert.Equal(t, `{"a":1}`, string(again.Payload))
}

// An exclusive purge runs alone: another, called while it runs (from its OnBatch), is
// refused with ErrPurgeBusy.
func TestMemoryStoreExclusivePurgeRunsAlone(t *testing.T) {
	t.Parallel()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	store := NewMemoryStore(MemoryStoreOptions{Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	_, err := store.Insert(t.Context(), outbox.EventInput{BizNo: "A", EventType: "E", Payload: []byte(`{}`)})
	require.NoError(t, err)
	res, err := store.ClaimDue(t.Context(), outbox.ClaimRequest{Owner: "me", Limit: 1, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	n, err := store.MarkSuccess(t.Context(), []int64{res.Events[0].ID}, "me")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	clock.Add(int64(2 * time.Hour))

	inner := errors.New("OnBatch never ran")
	deleted, err := store.Purge(t.Context(), time.Hour, outbox.PurgeOptions{Exclusive: true,
		OnBatch: func(int64) { _, inner = store.Purge(t.Context(), time.Hour, outbox.PurgeOptions{Exclusive: true}) }})
	require.NoError(t, err)
	assert.EqualValues(t, 1, deleted)
	assert.ErrorIs(t, inner, outbox.ErrPurgeBusy)
	_, err = store.Purge(t.Context(), time.Hour, outbox.PurgeOptions{Exclusive: true})
	assert.NoError(t, err, "free again once the first has returned")
	_, err = store.Purge(t.Context(), 0, outbox.PurgeOptions{})
	assert.ErrorIs(t, err, outbox.ErrInvalidInput, "an age that is not positive")
}

// Insert keeps the W3C trace context of the span in its ctx, as InsertEvent does, and
// wakes the subscribed publishers for an event due at once, not for a delayed one.
func TestMemoryStoreInsertTraceAndWake(t *testing.T) {
	t.Parallel()
	store := NewMemoryStore(MemoryStoreOptions{})
	wake, unsubscribe := store.Subscribe()
	defer unsubscribe()
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	written, err := store.Insert(trace.ContextWithSpanContext(t.Context(), sc),
		outbox.EventInput{BizNo: "A", EventType: "E", Payload: []byte(`{}`), Delay: time.Hour})
	require.NoError(t, err)
	assert.Equal(t, "00-01000000000000000000000000000000-0200000000000000-01", written[0].TraceParent)
	select {
	case <-wake:
		t.Fatal("a delayed event woke the publishers")
	default:
	}
	_, err = store.Insert(t.Context(), outbox.EventInput{BizNo: "B", EventType: "E", Payload: []byte(`{}`)})
	require.NoError(t, err)
	select {
	case <-wake:
	default:
		t.Fatal("an event due at once did not wake the publishers")
	}
}
