package outbox_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// closingSender is a recorder that counts its Close calls and refuses sends after the first.
type closingSender struct {
	*recorder
	closed atomic.Int32
}

func (s *closingSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	if s.closed.Load() > 0 {
		errs := make([]error, len(evs))
		for i := range errs {
			errs[i] = outbox.ErrClosed
		}
		return errs
	}
	return s.recorder.Send(ctx, evs, keyOrder)
}

func (s *closingSender) Close() error {
	s.closed.Add(1)
	return nil
}

// The natural shutdown is the right one: Close stops Run, waits for it to return and only
// then closes the sender, once however often it is called. Run after Close is refused.
func TestCloseStopsRunThenClosesTheSender(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	sender := &closingSender{recorder: newRecorder()}
	p := newPublisher(t, b.store, sender, fastConfig("close", &logSink{}))
	ran := make(chan error, 1)
	go func() { ran <- p.Run(context.Background()) }() // a context that is never cancelled
	require.Eventually(t, func() bool { return b.countStatus(t, outbox.StatusSuccess) == len(ids) }, 20*time.Second, 5*time.Millisecond)
	assert.True(t, p.Health().Running)

	require.NoError(t, p.Close())
	// Run has finished when Close returns (Health says so at once); its goroutine's send on
	// ran comes just after.
	assert.False(t, p.Health().Running, "Close returned before Run did")
	assert.Equal(t, int32(1), sender.closed.Load(), "the sender is closed once Run has returned")
	select {
	case err := <-ran:
		require.NoError(t, err, "Run returns nil when Close stops it")
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	require.NoError(t, p.Close())
	assert.Equal(t, int32(1), sender.closed.Load(), "Close is safe to repeat")
	assert.ErrorIs(t, p.Run(context.Background()), outbox.ErrClosed)
	for _, id := range ids {
		assert.Equal(t, 1, sender.count(id))
	}
	assert.Zero(t, b.countStatus(t, outbox.StatusSending), "nothing left claimed")
}

// Close without Run closes the sender, and a Run that starts after it returns ErrClosed at
// once.
func TestCloseBeforeRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sender := &closingSender{recorder: newRecorder()}
	p := newPublisher(t, b.store, sender, fastConfig("close-first", &logSink{}))
	require.NoError(t, p.Close())
	assert.Equal(t, int32(1), sender.closed.Load())
	assert.ErrorIs(t, p.Run(context.Background()), outbox.ErrClosed)
}

// Concurrent Close calls all return once the publisher is closed, with the sender closed
// once.
func TestCloseConcurrently(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sender := &closingSender{recorder: newRecorder()}
	p := newPublisher(t, b.store, sender, fastConfig("close-many", &logSink{}))
	go func() { _ = p.Run(context.Background()) }()
	require.Eventually(t, func() bool { return p.Health().Running }, 10*time.Second, time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { assert.NoError(t, p.Close()) })
	}
	wg.Wait()
	assert.Equal(t, int32(1), sender.closed.Load())
	assert.False(t, p.Health().Running)
}

// Two publishers of one store with one InstanceID both run: the library keeps no list of
// the ids in use, and each publisher takes the other's claims for its own. When one stops,
// it returns the other's event in flight to WAIT; the other's success then finds the row no
// longer its claim, and the event is sent again: a duplicate, never a loss. A publisher
// started twice is still refused.
func TestTwoPublishersWithOneInstanceIDSendTwice(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.insert(t, 1)[0]
	ctx := context.Background()
	cfg := fastConfig("twin", &logSink{})
	slow := newBlockingSender()
	first := newPublisher(t, b.store, slow, cfg)
	require.NoError(t, first.Start(ctx))
	t.Cleanup(func() { assert.NoError(t, first.Close()) })
	require.ErrorIs(t, first.Start(ctx), outbox.ErrAlreadyRunning, "one publisher, two Starts")
	var sent outbox.Event
	select {
	case sent = <-slow.entered:
	case <-time.After(time.Minute):
		t.Fatal("the first publisher sent nothing")
	}

	second := newPublisher(t, b.store, newRecorder(), cfg)
	require.NoError(t, second.Start(ctx), "the same id is not refused")
	require.NoError(t, second.Stop(ctx))
	require.Equal(t, outbox.StatusWait, b.get(t, id).Status, "the second's stop returned the first's claim to WAIT")

	slow.release <- nil // the first's send succeeds, its row no longer its claim
	select {
	case again := <-slow.entered:
		assert.Equal(t, sent.EventID, again.EventID, "the event is sent again")
	case <-time.After(time.Minute):
		t.Fatal("the event returned to WAIT was not sent again")
	}
	slow.release <- nil
	require.Eventually(t, func() bool { return b.get(t, id).Status == outbox.StatusSuccess }, time.Minute, 10*time.Millisecond)
}

// InsertEvent returns the event id every send of the event carries: the id consumers
// deduplicate on, with no read needed.
func TestInsertEventReturnsTheEventID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-7", EventType: "ORDER_CREATED", Payload: []byte("{}")})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	rec := newRecorder()
	p := newPublisher(t, b.store, rec, fastConfig("event-id", &logSink{}))
	_, err = p.PublishPending(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rec.total())
	assert.Equal(t, eventID, rec.evs[0].EventID)
	assert.Equal(t, eventID, b.eventIDs(t)[rec.evs[0].ID])
}

// An event RocketMQ could never take is refused at insert, and nothing is written.
func TestInsertEventRefusesAnEmptyPayload(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	for _, payload := range [][]byte{nil, {}} {
		_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-8", EventType: "ORDER_CREATED", Payload: payload})
		require.ErrorIs(t, err, outbox.ErrInvalidEvent)
		assert.ErrorContains(t, err, "payload is empty")
	}
	require.NoError(t, tx.Commit())
	assert.Empty(t, b.eventIDs(t))
}

// Health names the instance.
func TestHealthNamesTheInstance(t *testing.T) {
	t.Parallel()
	store, err := outbox.NewMySQLStore(testsvc.OpenDB(t), outbox.MySQLConfig{})
	require.NoError(t, err)
	p := newPublisher(t, store, newRecorder(), outbox.Config{InstanceID: "order-7"})
	assert.Equal(t, "order-7", p.Health().InstanceID)
	q := newPublisher(t, store, newRecorder(), outbox.Config{})
	assert.NotEqual(t, p.Health().InstanceID, q.Health().InstanceID)
	assert.NotEqual(t, q.Health().InstanceID, newPublisher(t, store, newRecorder(), outbox.Config{}).Health().InstanceID,
		"DefaultInstanceID is new for each publisher")
}

// A SenderFunc sends one event at a time, in order: a panic fails its event only; after an
// unavailable broker with nothing sent the rest get the same error without a call; under
// key order a biz no stops at its first failure; a done context leaves the rest unsent.
func TestSenderFunc(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	evs := []outbox.Event{{ID: 1, BizNo: "A"}, {ID: 2, BizNo: "B"}, {ID: 3, BizNo: "A"}, {ID: 4, BizNo: "B"}}
	errRefused := errors.New("refused")

	var calls []int64
	f := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		calls = append(calls, ev.ID)
		switch ev.ID {
		case 1:
			return errRefused
		case 2:
			panic("boom")
		}
		return nil
	})
	errs := f.Send(ctx, evs, false)
	require.Len(t, errs, 4)
	assert.ErrorIs(t, errs[0], errRefused)
	assert.ErrorContains(t, errs[1], "sender panicked: boom")
	assert.NoError(t, errs[2])
	assert.NoError(t, errs[3])
	assert.Equal(t, []int64{1, 2, 3, 4}, calls)

	calls = nil
	errs = f.Send(ctx, evs, true)
	assert.ErrorIs(t, errs[0], errRefused)
	assert.ErrorIs(t, errs[2], outbox.ErrNotSent, "A stops at its failure")
	assert.ErrorIs(t, errs[3], outbox.ErrNotSent, "B stops at its failure")
	assert.Equal(t, []int64{1, 2}, calls)

	down := outbox.SenderFunc(func(context.Context, outbox.Event) error { return outbox.Unavailable(errors.New("refused connection")) })
	for _, err := range down.Send(ctx, evs, false) {
		assert.True(t, outbox.IsUnavailable(err))
	}

	done, cancel := context.WithCancel(ctx)
	cancel()
	for _, err := range f.Send(done, evs, false) {
		assert.ErrorIs(t, err, outbox.ErrNotSent)
	}
	assert.Equal(t, outbox.SenderInfo{}, f.Info())
}
