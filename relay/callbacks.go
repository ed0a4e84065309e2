package relay

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/goid"
)

// deadLetters runs Config.OnDeadLetter one call at a time, in the order the dead letters
// were recorded, on a goroutine of its own that lives while calls are queued: the term that
// records a dead letter never waits for the callback, so a callback that calls Stop or
// Close does not wait for itself. A panic in a call is logged on log, and the next call
// runs.
type deadLetters struct {
	fn  func(ctx context.Context, ev outbox.Event, cause error)
	log *slog.Logger

	mu    sync.Mutex
	queue []deadLetter
	busy  bool          // a goroutine runs the queue
	idle  chan struct{} // closed once the goroutine that runs the queue has emptied it
	// caller is the id of the goroutine that runs the queue (0 when none): Stop called on it
	// is called from inside OnDeadLetter.
	caller atomic.Uint64
}

type deadLetter struct {
	ctx   context.Context
	ev    outbox.Event
	cause error
}

// call queues a call of OnDeadLetter for ev.
func (d *deadLetters) call(ctx context.Context, ev outbox.Event, cause error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.queue = append(d.queue, deadLetter{ctx: context.WithoutCancel(ctx), ev: ev, cause: cause})
	if !d.busy {
		d.busy, d.idle = true, make(chan struct{})
		go d.run()
	}
}

func (d *deadLetters) run() {
	d.caller.Store(goid.ID())
	for {
		d.mu.Lock()
		if len(d.queue) == 0 {
			d.busy = false
			d.caller.Store(0)
			close(d.idle)
			d.mu.Unlock()
			return
		}
		next := d.queue[0]
		d.queue[0] = deadLetter{}
		d.queue = d.queue[1:]
		d.mu.Unlock()
		d.callOne(next)
	}
}

// callOne runs one call; a panic in it is logged.
func (d *deadLetters) callOne(dl deadLetter) {
	defer func() {
		if r := recover(); r != nil {
			d.log.ErrorContext(dl.ctx, "relay: panic in OnDeadLetter",
				slog.Int64("id", dl.ev.ID), slog.String("event_id", dl.ev.EventID),
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
		}
	}()
	d.fn(dl.ctx, dl.ev, dl.cause)
}

// wait waits, bounded by ctx, until the calls queued have returned; called from inside
// OnDeadLetter it returns at once.
func (d *deadLetters) wait(ctx context.Context) error {
	if d == nil || d.caller.Load() == goid.ID() {
		return nil
	}
	d.mu.Lock()
	busy, idle, queued := d.busy, d.idle, len(d.queue)
	d.mu.Unlock()
	if !busy {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("relay: stop: %w: OnDeadLetter is still running, with %d more calls queued after it; they go on in the background",
			ctx.Err(), queued)
	}
}
