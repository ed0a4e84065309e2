// Package lifecycletest is the one lifecycle the library's long-running types share
// (outbox.Publisher, relay.Relay, inbox.Consumer), as a test each of them runs: the same
// verbs, with the same meaning and the same sentinels.
package lifecycletest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// Lifecycle is what the three types have in common.
type Lifecycle interface {
	Start(ctx context.Context) error
	Run(ctx context.Context) error
	Stop(ctx context.Context) error
	Close() error
}

// Test runs the shared lifecycle against l, a value that can start (its table, server and
// broker there): Stop before Start; Start, and a second Start or Run refused with
// outbox.ErrAlreadyRunning; Stop, twice and concurrently; Start again after Stop; Run, which
// returns nil once its context ends; a Start whose context ends stops the run; Close, twice;
// and Start, Run refused with outbox.ErrClosed after it, Stop nil.
func Test(t *testing.T, l Lifecycle) {
	t.Helper()
	bg := context.Background()
	require.NoError(t, l.Stop(bg), "Stop before Start")

	require.NoError(t, l.Start(bg), "Start")
	require.ErrorIs(t, l.Start(bg), outbox.ErrAlreadyRunning, "a second Start")
	require.ErrorIs(t, l.Run(bg), outbox.ErrAlreadyRunning, "Run while started")

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() { errs[i] = l.Stop(bg) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err, "concurrent Stops")
	}
	require.NoError(t, l.Stop(bg), "Stop after Stop")

	require.NoError(t, l.Start(bg), "Start after Stop")
	require.NoError(t, l.Stop(bg))

	// Run, then the end of its context. A Start beside it tells when Run runs (it is refused);
	// should that Start come first, Run is refused instead, and the pair is tried again with a
	// longer head start for Run. Without one, the Start nearly always comes first: a new
	// goroutine runs once the one that made it blocks.
	for try, ran := 0, false; !ran; try++ {
		if try == headStarts {
			t.Fatalf("Run never started before a Start %dms after it", headStart(try-1).Milliseconds())
		}
		ctx, cancel := context.WithCancel(bg)
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()
		time.Sleep(headStart(try))
		if err := l.Start(bg); err == nil {
			require.ErrorIs(t, wait(t, done), outbox.ErrAlreadyRunning, "Run beside a Start")
			require.NoError(t, l.Stop(bg))
			cancel()
			continue
		} else {
			require.ErrorIs(t, err, outbox.ErrAlreadyRunning, "Start beside Run")
		}
		cancel()
		require.NoError(t, wait(t, done), "Run once its context ended")
		ran = true
	}

	// The end of Start's context stops the run as Stop would: Start works again after it.
	ctx, cancel := context.WithCancel(bg)
	require.NoError(t, l.Start(ctx))
	cancel()
	require.Eventually(t, func() bool {
		if err := l.Start(bg); err == nil {
			return true
		} else if !errors.Is(err, outbox.ErrAlreadyRunning) {
			t.Errorf("Start after the end of the last Start's context: %v", err)
			return true
		}
		return false
	}, 60*time.Second, 20*time.Millisecond, "the run stopped with its Start's context")

	require.NoError(t, l.Close(), "Close of a running value")
	require.NoError(t, l.Close(), "Close twice")
	assert.ErrorIs(t, l.Start(bg), outbox.ErrClosed, "Start after Close")
	assert.ErrorIs(t, l.Run(bg), outbox.ErrClosed, "Run after Close")
	assert.NoError(t, l.Stop(bg), "Stop after Close")
}

// headStarts is how many times Run is given a head start over a Start beside it, each
// twice the last: 10 ms, then up to 1.28 s.
const headStarts = 8

func headStart(try int) time.Duration { return 10 * time.Millisecond << try }

// wait returns a Run's result; a Run that does not return fails the test.
func wait(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return once its context ended")
		return nil
	}
}
