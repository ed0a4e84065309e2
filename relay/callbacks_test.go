package relay

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// The dead-letter calls run one at a time, in the order they were made, from callers on
// many goroutines; wait returns once they have, and at once on the calls' own goroutine.
func TestDeadLettersRunInOrderOneAtATime(t *testing.T) {
	t.Parallel()
	var inside, overlapped atomic.Int64
	var got []int64
	fromInside := errors.New("not called")
	var cancelled atomic.Int64
	d := &deadLetters{}
	d.fn = func(ctx context.Context, ev outbox.Event, _ error) {
		if inside.Add(1) > 1 {
			overlapped.Add(1)
		}
		defer inside.Add(-1)
		got = append(got, ev.ID)
		if ctx.Err() != nil {
			cancelled.Add(1)
		}
		if ev.ID == 50 {
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			fromInside = d.wait(ctx) // would wait for itself
		}
		time.Sleep(100 * time.Microsecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 200 {
		d.call(ctx, outbox.Event{ID: int64(i)}, nil)
		if i == 10 {
			cancel() // the calls' ctx carries no cancellation
		}
	}
	require.NoError(t, d.wait(context.Background()))
	require.Len(t, got, 200)
	for i, id := range got {
		require.Equal(t, int64(i), id)
	}
	assert.Zero(t, overlapped.Load())
	assert.NoError(t, fromInside, "wait from inside a call returns at once")
	assert.Zero(t, cancelled.Load())
}

// A sender closed under the relay leaves the events untried, as a broker outage does: the
// relay charges no attempt for ErrClosed, which IsUnavailable no longer reports.
func TestAClosedSenderIsAnOutage(t *testing.T) {
	closed := fmt.Errorf("rocketmq: %w", outbox.ErrClosed)
	assert.False(t, outbox.IsUnavailable(closed))
	assert.True(t, outage(closed))
	assert.True(t, outage(outbox.Unavailable(errors.New("connection refused"))))
	assert.False(t, outage(errors.New("message refused")))
}
