package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/go-outbox/outbox/internal/goid"
)

// deadLetters calls [Config.OnDeadLetter] for a publisher: one call at a time, in the order
// the events were dead-lettered, on a goroutine of its own (the dispatcher), whichever loop
// or call dead-lettered them (a round of the scan loop or of PublishPending, a reclaim). A
// round or a reclaim only queues the call, under no lock of the publisher's, so a callback
// never holds up a send and never runs while a round holds the publisher's state.
//
// The queue is not bounded: each entry is an event already recorded FAIL, so a bound would
// mean either dropping a dead letter's alert or making the publishing loops wait for the
// callback, which is what this design avoids; the entries are as many as the events a slow
// callback lets pile up, and each is one event.
//
// A dispatcher runs while the queue has entries and ends when it is empty; the next entry
// starts another. Stop and Close must not wait for the callback they are called from, and
// Close has no context to carry that fact: they ask onDispatcher, which compares the
// caller's goroutine id with the dispatcher's (package internal/goid); it is read only by
// Stop, Close and the waits, never per event.
type deadLetters struct {
	fn  func(ctx context.Context, ev Event, cause error)
	log *slog.Logger

	mu       sync.Mutex
	queue    []deadLetter
	queued   uint64        // entries ever queued
	finished uint64        // entries whose call has returned
	active   bool          // a dispatcher runs
	changed  chan struct{} // closed, and replaced, each time finished grows

	gid atomic.Uint64 // the running dispatcher's goroutine id; 0 when none runs
}

type deadLetter struct {
	ctx   context.Context
	ev    Event
	cause error
}

func (d *deadLetters) init(fn func(context.Context, Event, error), log *slog.Logger) {
	d.fn, d.log = fn, log
	d.changed = make(chan struct{})
}

// add queues the callback for ev, with ctx's values but not its cancellation (the callback
// of a dead letter recorded as the publisher stops still runs, and may still alert). It
// never waits for a callback.
func (d *deadLetters) add(ctx context.Context, ev Event, cause error) {
	if d.fn == nil {
		return
	}
	d.mu.Lock()
	d.queue = append(d.queue, deadLetter{ctx: context.WithoutCancel(ctx), ev: ev, cause: cause})
	d.queued++
	start := !d.active
	d.active = true
	d.mu.Unlock()
	if start {
		go d.dispatch()
	}
}

// dispatch calls the queued callbacks, one after the other, until the queue is empty.
func (d *deadLetters) dispatch() {
	d.gid.Store(goid.ID())
	for {
		d.mu.Lock()
		if len(d.queue) == 0 {
			d.active = false
			d.gid.Store(0) // under mu: a next dispatcher stores its id after this
			d.mu.Unlock()
			return
		}
		dl := d.queue[0]
		d.queue[0] = deadLetter{}
		d.queue = d.queue[1:]
		d.mu.Unlock()
		d.call(dl)
		d.mu.Lock()
		d.finished++
		close(d.changed)
		d.changed = make(chan struct{})
		d.mu.Unlock()
	}
}

// call runs one callback; a panic in it is logged, and the next one runs.
func (d *deadLetters) call(dl deadLetter) {
	defer func() {
		if r := recover(); r != nil {
			d.log.ErrorContext(dl.ctx, "outbox: panic in OnDeadLetter",
				slog.Int64("id", dl.ev.ID), slog.String("event_id", dl.ev.EventID),
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
		}
	}()
	d.fn(dl.ctx, dl.ev, dl.cause)
}

// mark is the count of entries queued so far, for wait.
func (d *deadLetters) mark() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queued
}

// wait waits until the first n entries' callbacks have returned, or ctx ends. Called on
// the dispatcher (from inside a callback), it returns at once: those entries include the
// callback it is called from.
func (d *deadLetters) wait(ctx context.Context, n uint64) error {
	if d.onDispatcher() {
		return nil
	}
	for {
		d.mu.Lock()
		done, changed := d.finished >= n, d.changed
		d.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("outbox: wait for OnDeadLetter: %w", ctx.Err())
		}
	}
}

// backlog is how many queued callbacks have not returned.
func (d *deadLetters) backlog() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.queued - d.finished
}

// onDispatcher reports whether the caller runs inside a callback (on the dispatcher).
func (d *deadLetters) onDispatcher() bool {
	g := d.gid.Load()
	return g != 0 && g == goid.ID()
}
