package outboxtest_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/outboxtest"
)

func ofType(typ string) func(outbox.Event) bool {
	return func(ev outbox.Event) bool { return ev.EventType == typ }
}

// deadLetters collects the publisher's OnDeadLetter calls.
type deadLetters struct {
	mu   sync.Mutex
	evs  []outbox.Event
	errs []error
	ch   chan struct{}
}

func newDeadLetters() *deadLetters { return &deadLetters{ch: make(chan struct{}, 100)} }

func (d *deadLetters) on(_ context.Context, ev outbox.Event, cause error) {
	d.mu.Lock()
	d.evs, d.errs = append(d.evs, ev), append(d.errs, cause)
	d.mu.Unlock()
	d.ch <- struct{}{}
}

func (d *deadLetters) wait(t *testing.T) {
	t.Helper()
	select {
	case <-d.ch:
	case <-waitCtx(t).Done():
		t.Fatal("no dead letter")
	}
}

// A refused event is dead-lettered at once, with the dead-letter callback; the others go
// through.
func TestFaultySenderRefuseDeadLetters(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.Refuse(ofType("ORDER_BAD"))
	dead := newDeadLetters()
	k.start(t, faulty, outbox.Config{OnDeadLetter: dead.on})

	ids := k.insert(t, order("ORD-1", "ORDER_CREATED"), order("ORD-2", "ORDER_BAD"))
	dead.wait(t)
	dead.mu.Lock()
	require.Len(t, dead.evs, 1)
	assert.Equal(t, ids[1], dead.evs[0].EventID)
	assert.Equal(t, outbox.StatusFail, dead.evs[0].Status)
	assert.True(t, outbox.IsPermanent(dead.errs[0]), "refused for good: %v", dead.errs[0])
	assert.ErrorIs(t, dead.errs[0], outboxtest.ErrInjected)
	dead.mu.Unlock()

	row := k.row(t, ids[1])
	assert.Equal(t, outbox.StatusFail, row.Status)
	assert.Equal(t, 1, row.RetryCount, "one attempt, no retry")
	_, err := sent.WaitFor(waitCtx(t), 1)
	require.NoError(t, err)
	k.waitStatus(t, ids[0], outbox.StatusSuccess)
	assert.Empty(t, sent.ByType("ORDER_BAD"), "the refused event never reached the inner sender")
	c := faulty.Counts()
	assert.Equal(t, 1, c.Refused)
	assert.Equal(t, 1, c.Passed)
}

// FailFirst: the first n tries fail and count as retries; the next goes through. More
// failures than MaxAttempts allows dead-letter the event.
func TestFaultySenderFailFirst(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.FailFirst(2, ofType("ORDER_FLAKY"))
	dead := newDeadLetters()
	k.start(t, faulty, outbox.Config{MaxAttempts: 4, OnDeadLetter: dead.on})

	id := k.insert(t, order("ORD-1", "ORDER_FLAKY"))[0]
	evs, err := sent.WaitFor(waitCtx(t), 1)
	require.NoError(t, err)
	assert.Equal(t, id, evs[0].EventID)
	assert.Equal(t, 2, evs[0].RetryCount, "sent at the third attempt")
	row := k.waitStatus(t, id, outbox.StatusSuccess)
	assert.Equal(t, 2, row.RetryCount)
	assert.Contains(t, row.LastError, "a send failed (to retry)")
	assert.Equal(t, 2, faulty.Counts().Failed)

	faulty.FailFirst(10, ofType("ORDER_DOOMED"))
	id = k.insert(t, order("ORD-2", "ORDER_DOOMED"))[0]
	dead.wait(t)
	row = k.row(t, id)
	assert.Equal(t, outbox.StatusFail, row.Status)
	assert.Equal(t, 4, row.RetryCount, "MaxAttempts tries")
	assert.Equal(t, 2+4, faulty.Counts().Failed, "the counts add up every fault since the start")
	assert.Empty(t, sent.ByBizNo("ORD-2"))
}

// LoseAnswer: the event reaches the inner sender, the publisher hears of a failure and
// sends it again: recorded twice with one event id, a retry counted.
func TestFaultySenderLoseAnswerDuplicates(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.LoseAnswer(1, nil)
	k.start(t, faulty, outbox.Config{})

	id := k.insert(t, order("ORD-1", "ORDER_CREATED"))[0]
	evs, err := sent.WaitFor(waitCtx(t), 2)
	require.NoError(t, err)
	assert.Equal(t, id, evs[0].EventID)
	assert.Equal(t, id, evs[1].EventID, "the same event, sent again")
	row := k.waitStatus(t, id, outbox.StatusSuccess)
	assert.Equal(t, 1, row.RetryCount)
	c := faulty.Counts()
	assert.Equal(t, 1, c.Lost)
	assert.Equal(t, 2, c.Passed)
}

// Unavailable: nothing reaches the inner sender and no retry is counted; once the broker is
// back the event goes through.
func TestFaultySenderUnavailable(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.SetUnavailable(true)
	k.start(t, faulty, outbox.Config{MaxAttempts: 1})

	id := k.insert(t, order("ORD-1", "ORDER_CREATED"))[0]
	require.NoError(t, faulty.WaitCounts(waitCtx(t), func(c outboxtest.FaultCounts) bool { return c.Unavailable >= 3 }))
	row := k.row(t, id)
	assert.NotEqual(t, outbox.StatusFail, row.Status, "an outage dead-letters nothing, even with MaxAttempts 1")
	assert.Zero(t, row.RetryCount)
	assert.Zero(t, sent.Len())

	faulty.SetUnavailable(false)
	_, err := sent.WaitFor(waitCtx(t), 1)
	require.NoError(t, err)
	row = k.waitStatus(t, id, outbox.StatusSuccess)
	assert.Zero(t, row.RetryCount)
}

// A blocked send returns when its ctx is done, with ctx's error, having sent nothing; one
// released goes through.
func TestFaultySenderBlockHonoursContext(t *testing.T) {
	t.Parallel()
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.Block(nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan []error)
	go func() {
		done <- faulty.Send(ctx, []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e1", BizNo: "A"}}, false)
	}()
	require.NoError(t, faulty.WaitBlocked(waitCtx(t), 1))
	cancel()
	errs := <-done
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], context.Canceled)
	assert.ErrorIs(t, errs[0], outboxtest.ErrInjected)
	assert.False(t, errors.Is(errs[0], outbox.ErrNotSent), "a send that timed out counts as a try")
	assert.Zero(t, sent.Len())
	assert.Equal(t, 1, faulty.Counts().TimedOut)

	go func() {
		done <- faulty.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e2", BizNo: "A"}}, false)
	}()
	require.NoError(t, faulty.WaitBlocked(waitCtx(t), 2))
	faulty.Release()
	assert.Equal(t, []error{nil}, <-done)
	assert.Equal(t, 1, sent.Len())
	assert.Equal(t, []error{nil}, faulty.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e3"}}, false), "Release turns Block off")
}

// The publisher's send timeout ends a blocked send: a retry counted, and the event sent
// once released.
func TestFaultySenderBlockTimesOut(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.Block(nil)
	k.start(t, faulty, outbox.Config{Tuning: outbox.Tuning{SendTimeout: 50 * time.Millisecond}})

	id := k.insert(t, order("ORD-1", "ORDER_CREATED"))[0]
	require.NoError(t, faulty.WaitCounts(waitCtx(t), func(c outboxtest.FaultCounts) bool { return c.TimedOut >= 1 }))
	require.Eventually(t, func() bool { return k.row(t, id).RetryCount >= 1 }, 30*time.Second, 10*time.Millisecond)
	assert.Contains(t, k.row(t, id).LastError, "blocked send gave up")
	faulty.Release()
	_, err := sent.WaitFor(waitCtx(t), 1)
	require.NoError(t, err)
	k.waitStatus(t, id, outbox.StatusSuccess)
}

// Stop with a send in flight: a Stop whose ctx ends first says the publisher is still
// stopping; once the send is released, Stop and Close return nil and the event is SUCCESS.
func TestFaultySenderBlockedStopAndClose(t *testing.T) {
	t.Parallel()
	k := newKit(t)
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.Block(nil)
	p, err := outbox.NewPublisher(k.store, faulty, quick(outbox.Config{Tuning: outbox.Tuning{SendTimeout: time.Second, Lease: time.Minute}, StopTimeout: time.Minute}))
	require.NoError(t, err)
	require.NoError(t, p.Start(t.Context()))

	id := k.insert(t, order("ORD-1", "ORDER_CREATED"))[0]
	require.NoError(t, faulty.WaitBlocked(waitCtx(t), 1))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = p.Stop(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "still stopping")

	closed := make(chan error)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned under a blocked send: %v", err)
	default:
	}
	faulty.Release()
	require.NoError(t, <-closed)
	assert.Equal(t, outbox.StatusSuccess, k.row(t, id).Status, "Close returns once the send's outcome is recorded")
	assert.Equal(t, 1, sent.Len())
}

// With keyOrder, a biz no whose event failed goes no further in the call; other keys go
// on, and the events that pass go to the inner sender in one call.
func TestFaultySenderKeyOrder(t *testing.T) {
	t.Parallel()
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.FailFirst(1, func(ev outbox.Event) bool { return ev.EventID == "a1" })
	evs := []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "b1", BizNo: "B"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "a1", BizNo: "A"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "a2", BizNo: "A"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "b2", BizNo: "B"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "c1", BizNo: "C"}}
	errs := faulty.Send(t.Context(), evs, true)
	require.Len(t, errs, 5)
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], outboxtest.ErrInjected)
	assert.ErrorIs(t, errs[2], outbox.ErrNotSent, "a2 must not overtake a1")
	assert.NoError(t, errs[3])
	assert.NoError(t, errs[4])
	var got []string
	for _, ev := range sent.Events() {
		got = append(got, ev.EventID)
	}
	assert.Equal(t, []string{"b1", "b2", "c1"}, got)
	assert.Equal(t, 2, sent.Calls(), "b1 before the fault, b2 and c1 after it")

	// Without keyOrder, a2 goes on; a1's one failure is spent.
	errs = faulty.Send(t.Context(), evs[1:3], false)
	assert.Equal(t, []error{nil, nil}, errs)
	c := faulty.Counts()
	assert.Equal(t, outboxtest.FaultCounts{Sends: 7, Passed: 5, Failed: 1, NotSent: 1}, c)

	faulty.Reset()
	assert.Zero(t, faulty.Counts())
}

// Faults changed while a publisher sends, from many goroutines, under -race.
func TestFaultySenderConcurrentUse(t *testing.T) {
	t.Parallel()
	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				ev := outbox.Event{Topic: "ORDERS", Payload: []byte("{}"), EventID: string(rune('a'+g)) + string(rune('0'+i%10)), BizNo: "K", EventType: "T"}
				_ = faulty.Send(t.Context(), []outbox.Event{ev, ev}, i%2 == 0)
				switch i % 5 {
				case 0:
					faulty.Refuse(ofType("X"))
				case 1:
					faulty.FailFirst(1, nil)
				case 2:
					faulty.LoseAnswer(1, nil)
				case 3:
					faulty.SetUnavailable(i%3 == 0)
				case 4:
					_ = faulty.Counts()
				}
			}
		})
	}
	wg.Wait()
	c := faulty.Counts()
	assert.Equal(t, 8*100*2, c.Sends)
	assert.Equal(t, c.Sends, c.Passed+c.Refused+c.Failed+c.Unavailable+c.NotSent+c.TimedOut)
	assert.Equal(t, c.Passed, sent.Len())
}

// Each fault's error is of the class its doc gives, and wraps ErrInjected.
func TestFaultySenderErrorClasses(t *testing.T) {
	t.Parallel()
	send := func(setup func(f *outboxtest.FaultySender)) (*outboxtest.MemorySender, error) {
		sent := outboxtest.NewMemorySender()
		f := outboxtest.NewFaultySender(sent)
		setup(f)
		errs := f.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e1", BizNo: "A"}}, false)
		require.Len(t, errs, 1)
		return sent, errs[0]
	}
	sent, err := send(func(f *outboxtest.FaultySender) { f.Refuse(nil) })
	assert.True(t, outbox.IsPermanent(err))
	assert.ErrorIs(t, err, outboxtest.ErrInjected)
	assert.Zero(t, sent.Len())

	sent, err = send(func(f *outboxtest.FaultySender) { f.FailFirst(1, nil) })
	assert.ErrorIs(t, err, outboxtest.ErrInjected)
	assert.False(t, outbox.IsPermanent(err) || outbox.IsUnavailable(err) || errors.Is(err, outbox.ErrNotSent), "a retry: %v", err)
	assert.Zero(t, sent.Len())

	sent, err = send(func(f *outboxtest.FaultySender) { f.LoseAnswer(1, nil) })
	assert.ErrorIs(t, err, outboxtest.ErrInjected)
	assert.False(t, outbox.IsPermanent(err) || outbox.IsUnavailable(err) || errors.Is(err, outbox.ErrNotSent), "a retry: %v", err)
	assert.Equal(t, 1, sent.Len(), "sent, the answer lost")

	sent, err = send(func(f *outboxtest.FaultySender) { f.SetUnavailable(true) })
	assert.True(t, outbox.IsUnavailable(err))
	assert.ErrorIs(t, err, outboxtest.ErrInjected)
	assert.Zero(t, sent.Len())

	sent, err = send(func(f *outboxtest.FaultySender) { f.SetUnavailable(true); f.SetUnavailable(false) })
	assert.NoError(t, err)
	assert.Equal(t, 1, sent.Len())

	assert.PanicsWithError(t, outbox.ErrInvalidConfig.Error()+": outboxtest: NewFaultySender: the inner sender is nil; wrap a MemorySender (NewMemorySender)",
		func() { outboxtest.NewFaultySender(nil) })
}

// A predicate may read the sender: it runs outside the sender's lock.
func TestFaultySenderPredicateMayReadTheSender(t *testing.T) {
	t.Parallel()
	faulty := outboxtest.NewFaultySender(outboxtest.NewMemorySender())
	faulty.FailFirst(1, func(outbox.Event) bool { return faulty.Counts().Failed == 0 })
	errs := faulty.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e1"}, {Topic: "ORDERS", Payload: []byte("{}"), EventID: "e2"}}, false)
	assert.ErrorIs(t, errs[0], outboxtest.ErrInjected)
	assert.NoError(t, errs[1], "the predicate saw the first failure")
}

// LoseAnswer loses only an answer that accepted the event: the inner sender's own error is
// passed on as it is.
func TestFaultySenderLoseAnswerPassesInnerErrors(t *testing.T) {
	t.Parallel()
	inner := outboxtest.NewFaultySender(outboxtest.NewMemorySender())
	inner.Refuse(nil)
	outer := outboxtest.NewFaultySender(inner)
	outer.LoseAnswer(1, nil)
	errs := outer.Send(t.Context(), []outbox.Event{{Topic: "ORDERS", Payload: []byte("{}"), EventID: "e1"}}, false)
	assert.True(t, outbox.IsPermanent(errs[0]), "the inner refusal: %v", errs[0])
	c := outer.Counts()
	assert.Zero(t, c.Lost)
	assert.Equal(t, 1, c.Passed)
}
