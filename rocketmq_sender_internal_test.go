package outbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scriptedProducer answers SendSync with respond's result, for the sender's own logic
// (closing, batching) apart from any broker. It records what it was asked, and whether it
// was shut down while a send was still in it.
type scriptedProducer struct {
	rocketmq.Producer
	respond func(ctx context.Context, call int, msgs []*primitive.Message) (*primitive.SendResult, error)

	mu               sync.Mutex
	calls            []int // messages per call
	inFlight         int
	shutdowns        int
	shutdownInFlight bool
}

func (p *scriptedProducer) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	p.mu.Lock()
	p.calls = append(p.calls, len(msgs))
	call := len(p.calls)
	p.inFlight++
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.inFlight--
		p.mu.Unlock()
	}()
	if p.respond == nil {
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}
	return p.respond(ctx, call, msgs)
}

func (p *scriptedProducer) Shutdown() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.shutdowns++
	if p.inFlight > 0 {
		p.shutdownInFlight = true
	}
	return nil
}

func (p *scriptedProducer) callSizes() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int(nil), p.calls...)
}

func (p *scriptedProducer) shutdownCount() (n int, whileSending bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.shutdowns, p.shutdownInFlight
}

// ownedSender is a sender that owns p, as one NewRocketMQSender built would.
func ownedSender(p rocketmq.Producer, timeout time.Duration) *RocketMQSender {
	return &RocketMQSender{producer: p, timeout: timeout, maxBatch: maxBatchBytesDefault, owned: true}
}

func events(n int) []Event {
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{ID: int64(i + 1), BizNo: "ORD", EventType: "E", Topic: "T", Payload: []byte("{}")}
	}
	return evs
}

// Close waits for the send in flight before it shuts the producer down; once it has begun,
// every Send and SendBatch fails with ErrClosed without reaching the producer. Close
// may be called again, and concurrently: each call returns once the sender is closed.
func TestRocketMQSenderCloseWaitsForSendsInFlight(t *testing.T) {
	t.Parallel()
	entered, release := make(chan struct{}), make(chan struct{})
	fp := &scriptedProducer{respond: func(_ context.Context, call int, _ []*primitive.Message) (*primitive.SendResult, error) {
		if call == 1 {
			close(entered)
			<-release
		}
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}}
	s := ownedSender(fp, time.Minute)
	ctx := context.Background()
	ev := events(1)[0]

	sent := make(chan error, 1)
	go func() { sent <- s.Send(ctx, []Event{ev}, false)[0] }()
	<-entered
	closed := make(chan error, 2)
	go func() { closed <- s.Close() }()
	go func() { closed <- s.Close() }()

	require.Eventually(t, func() bool { return errors.Is(s.Send(ctx, []Event{ev}, false)[0], ErrClosed) }, 10*time.Second, time.Millisecond,
		"sends are refused once Close has begun")
	before := fp.callSizes()
	err := s.Send(ctx, []Event{ev}, false)[0]
	require.ErrorIs(t, err, ErrClosed)
	assert.False(t, IsUnavailable(err), "closed is not unavailable: ErrClosed has a meaning of its own")
	assert.True(t, isOutage(err), "but the publisher charges no attempt for it, as in an outage")
	for _, err := range s.Send(ctx, events(3), false) {
		require.ErrorIs(t, err, ErrClosed)
	}
	assert.Equal(t, before, fp.callSizes(), "refused sends never reach the producer")

	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a send was in flight", err)
	default:
	}
	n, _ := fp.shutdownCount()
	assert.Zero(t, n, "the producer is not shut down under a send")

	close(release)
	require.NoError(t, <-sent, "the send in flight completes")
	require.NoError(t, <-closed)
	require.NoError(t, <-closed)
	require.NoError(t, s.Close())
	n, whileSending := fp.shutdownCount()
	assert.Equal(t, 1, n, "shut down once")
	assert.False(t, whileSending, "shut down after the send in flight returned")
}

// A sender given the caller's producer is closed the same way, and leaves the producer to
// its owner.
func TestRocketMQSenderCloseLeavesCallersProducer(t *testing.T) {
	t.Parallel()
	fp := &scriptedProducer{}
	s := &RocketMQSender{producer: fp, timeout: time.Minute, maxBatch: maxBatchBytesDefault}
	require.NoError(t, s.Send(context.Background(), events(1), false)[0])
	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Send(context.Background(), events(1), false)[0], ErrClosed)
	n, _ := fp.shutdownCount()
	assert.Zero(t, n)
	assert.Equal(t, []int{1}, fp.callSizes())
}

var errIllegal = errors.New("CODE: 13, DESC: the message is illegal")

// The one-by-one resend of a refused batch stops at the batch's deadline: the events whose
// turn had not come are not sent, and their error is errNotSent, so the publisher releases
// them without counting an attempt.
func TestRocketMQSendBatchOneByOneStopsAtTheDeadline(t *testing.T) {
	t.Parallel()
	fp := &scriptedProducer{respond: func(ctx context.Context, call int, msgs []*primitive.Message) (*primitive.SendResult, error) {
		switch {
		case len(msgs) > 1:
			return nil, errIllegal
		case call == 2:
			<-ctx.Done() // the broker answers the first resend just as the deadline passes
		}
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}}
	s := ownedSender(fp, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errs := s.Send(ctx, events(4), false)
	require.Len(t, errs, 4)
	assert.NoError(t, errs[0])
	for i, err := range errs[1:] {
		assert.ErrorIs(t, err, errNotSent, "event %d", i+2)
		assert.False(t, IsPermanent(err))
	}
	assert.Equal(t, []int{4, 1}, fp.callSizes(), "nothing sent after the deadline")

	// A batch whose deadline passed before its first send touches nothing.
	fp = &scriptedProducer{}
	s = ownedSender(fp, time.Minute)
	for _, err := range s.Send(ctx, events(3), false) {
		assert.ErrorIs(t, err, errNotSent)
	}
	assert.Empty(t, fp.callSizes())
}

// Once a send of a batch finds the broker unavailable, the rest of the batch is not tried:
// those events are not sent (errNotSent, carrying the unavailable error), whether the batch
// was split by size or is being resent one by one.
func TestRocketMQSendBatchStopsAtAnUnavailableBroker(t *testing.T) {
	t.Parallel()
	busy := errors.New("CODE: 14, DESC: service not available now")
	fp := &scriptedProducer{respond: func(context.Context, int, []*primitive.Message) (*primitive.SendResult, error) {
		return nil, busy
	}}
	s := ownedSender(fp, time.Minute)
	s.maxBatch = 1 << 10
	evs := events(6)
	for i := range evs {
		evs[i].Payload = make([]byte, 300) // two events per 1 KiB batch
	}
	errs := s.Send(context.Background(), evs, false)
	assert.Equal(t, []int{2}, fp.callSizes(), "one send, then none")
	for i, err := range errs {
		assert.True(t, IsUnavailable(err), "event %d: %v", i+1, err)
		assert.Equal(t, i >= 2, errors.Is(err, errNotSent), "event %d: %v", i+1, err)
	}

	fp = &scriptedProducer{respond: func(_ context.Context, call int, msgs []*primitive.Message) (*primitive.SendResult, error) {
		switch {
		case len(msgs) > 1:
			return nil, errIllegal
		case call == 3:
			return nil, rmqerrors.ErrRequestTimeout
		}
		return &primitive.SendResult{Status: primitive.SendOK}, nil
	}}
	s = ownedSender(fp, time.Minute)
	errs = s.Send(context.Background(), events(4), false)
	assert.Equal(t, []int{4, 1, 1}, fp.callSizes())
	assert.NoError(t, errs[0])
	assert.True(t, IsUnavailable(errs[1]))
	assert.False(t, errors.Is(errs[1], errNotSent))
	for _, err := range errs[2:] {
		assert.ErrorIs(t, err, errNotSent)
		assert.ErrorIs(t, err, rmqerrors.ErrRequestTimeout)
	}
}

// An event without a payload is refused as Permanent before it reaches the producer, alone:
// the rest of its batch is sent.
func TestRocketMQSenderRefusesAnEmptyPayload(t *testing.T) {
	t.Parallel()
	fp := &scriptedProducer{}
	s := ownedSender(fp, time.Minute)
	err := s.Send(context.Background(), []Event{{ID: 1, BizNo: "A", EventType: "E", Topic: "T"}}, false)[0]
	assert.True(t, IsPermanent(err), "%v", err)
	assert.ErrorContains(t, err, "payload is empty")
	assert.Empty(t, fp.callSizes())

	evs := events(4)
	evs[0].Payload, evs[2].Payload = nil, []byte{}
	errs := s.Send(context.Background(), evs, false)
	assert.True(t, IsPermanent(errs[0]))
	assert.NoError(t, errs[1])
	assert.True(t, IsPermanent(errs[2]))
	assert.NoError(t, errs[3])
	assert.Equal(t, []int{2}, fp.callSizes())
}
