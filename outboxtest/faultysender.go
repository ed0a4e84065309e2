package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-outbox/outbox"
)

// ErrInjected is wrapped by every error a [FaultySender] makes up, so that a test can tell
// an injected failure from a real one (the publisher keeps its text in
// [outbox.Event.LastError], and passes the error itself to [outbox.Config.OnDeadLetter]).
var ErrInjected = errors.New("outboxtest: injected fault")

// FaultySender wraps a sender (a [MemorySender], usually) and makes chosen sends fail, as
// a broker and a network do, so that a service's test can drive its dead-letter alert, its
// retries and its consumer's duplicate check through a real [outbox.Publisher]:
//
//   - [FaultySender.Refuse]: the broker refuses the event for good ([outbox.Permanent]): the
//     publisher dead-letters it at once, and calls [outbox.Config.OnDeadLetter];
//   - [FaultySender.FailFirst]: the event's first n tries fail with an error to retry; each
//     counts against [outbox.Config.MaxAttempts];
//   - [FaultySender.LoseAnswer]: the event reaches the inner sender, but the answer is lost
//     (a retryable error): the publisher sends it again, and the consumer sees a duplicate;
//   - [FaultySender.SetUnavailable]: the broker is down ([outbox.Unavailable]): nothing
//     reaches the inner sender, no retry is counted, and the publisher probes until it is up;
//   - [FaultySender.Block]: the event's send waits until [FaultySender.Release], or until
//     the send's ctx is done (the publisher's send timeout), to test a Stop or Close with a
//     send in flight, or a timeout.
//
// Each fault picks its events by a predicate on the event (nil: every event), and applies
// from the call on; a fault set again replaces the one before. An event meets them in this
// order: unavailable, refused, blocked, failed first, answer lost; one none of them takes is
// passed to the inner sender, and a blocked one, once released, meets them all again. The events of one Send that pass go
// to the inner sender together, in the order given, so a batch stays a batch. With
// keyOrder, a biz no whose event failed goes no further in the call: its later events
// get an error wrapping [outbox.ErrNotSent], as the Sender contract asks. A Send whose ctx
// is done before an event's turn answers it with [outbox.ErrNotSent]. [FaultySender.Counts]
// says what it did.
//
// It is safe for concurrent use, and the faults may be changed while the publisher sends;
// the predicates run outside its lock, and may read it.
// Info is the inner sender's. It has no Close: the publisher's Close leaves it (and the
// sender it wraps) open; a test that wraps a sender with a Close closes it itself.
type FaultySender struct {
	inner outbox.Sender

	mu          sync.Mutex
	unavailable bool
	refuse      func(outbox.Event) bool
	failFirst   faultN
	loseAnswer  faultN
	block       func(outbox.Event) bool
	released    chan struct{}  // closed by Release: the blocked sends go on
	tries       map[string]int // per event id: the sends FailFirst failed
	lost        map[string]int // per event id: the answers LoseAnswer lost
	counts      FaultCounts
	changed     chan struct{} // closed, and replaced, when counts change
}

// faultN is a fault for the first n sends of each event match takes.
type faultN struct {
	n     int
	match func(outbox.Event) bool
}

// FaultCounts are what a [FaultySender] did, each an event count.
type FaultCounts struct {
	Sends       int // events it was given
	Passed      int // events passed to the inner sender, LoseAnswer's included
	Refused     int // events refused for good (Refuse)
	Failed      int // tries failed with an error to retry (FailFirst)
	Lost        int // answers lost after the inner sender accepted the event (LoseAnswer)
	Unavailable int // events failed as unavailable (SetUnavailable)
	Blocked     int // sends that waited at Block (those still waiting included)
	TimedOut    int // blocked sends that gave up because their ctx was done
	NotSent     int // events answered with ErrNotSent: ctx done, or key order stopped them
}

// NewFaultySender returns a FaultySender over inner, with no fault set: every event goes to
// inner. A nil inner is a mistake in the test: it panics with an error wrapping
// [outbox.ErrInvalidConfig].
func NewFaultySender(inner outbox.Sender) *FaultySender {
	if inner == nil {
		panic(fmt.Errorf("%w: outboxtest: NewFaultySender: the inner sender is nil; wrap a MemorySender (NewMemorySender)", outbox.ErrInvalidConfig))
	}
	return &FaultySender{
		inner:    inner,
		released: make(chan struct{}),
		tries:    map[string]int{},
		lost:     map[string]int{},
		changed:  make(chan struct{}),
	}
}

// Info implements [outbox.Sender]: the inner sender's.
func (f *FaultySender) Info() outbox.SenderInfo { return f.inner.Info() }

// Check implements [outbox.Sender]: the inner sender's.
func (f *FaultySender) Check(ctx context.Context, topics []string) error {
	return f.inner.Check(ctx, topics)
}

// Refuse makes every send of an event match takes fail with an error marked
// [outbox.Permanent]: the broker refuses the message for good. nil takes every event.
func (f *FaultySender) Refuse(match func(outbox.Event) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refuse = orAll(match)
}

// FailFirst makes the first n sends of each event match takes (by its
// [outbox.Event.EventID], counted from this call) fail with an error to retry; the sends
// after them go through. nil takes every event; n of 0 turns the fault off.
func (f *FaultySender) FailFirst(n int, match func(outbox.Event) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failFirst = faultN{n: n, match: orAll(match)}
	clear(f.tries)
}

// LoseAnswer makes the first n sends of each event match takes (by its event id, counted
// from this call) lose their answer: the event is passed to the inner sender and, once that
// accepts it, the publisher gets an error to retry instead (an error of the inner sender's
// own is passed on as it is). The publisher sends the event again, so the inner sender
// records it n+1 times, with the same event id, and a consumer must suppress the
// duplicates. nil takes every event; n of 0 turns the fault off.
func (f *FaultySender) LoseAnswer(n int, match func(outbox.Event) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseAnswer = faultN{n: n, match: orAll(match)}
	clear(f.lost)
}

// SetUnavailable makes the broker unavailable (true) or available again (false). While it
// is unavailable every event fails with an error marked [outbox.Unavailable] without
// reaching the inner sender: the publisher counts no retry and probes until a send goes
// through.
func (f *FaultySender) SetUnavailable(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unavailable = down
}

// Block makes the sends of the events match takes wait, before they reach the inner
// sender, until [FaultySender.Release] or until the send's ctx is done; then the send
// gives up with an error wrapping ctx's error (to retry, as a send that timed out).
// nil takes every event. [FaultySender.WaitBlocked] waits for a send to be blocked.
func (f *FaultySender) Block(match func(outbox.Event) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.block = orAll(match)
}

// Release lets every blocked send go on, to the other checks and the inner sender, and
// turns Block off.
func (f *FaultySender) Release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.block = nil
	close(f.released)
	f.released = make(chan struct{})
}

// Reset turns every fault off, as a new FaultySender over the same inner sender, and sets
// the counts to zero. A blocked send is released.
func (f *FaultySender) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unavailable, f.refuse, f.block = false, nil, nil
	f.failFirst, f.loseAnswer = faultN{}, faultN{}
	clear(f.tries)
	clear(f.lost)
	close(f.released)
	f.released = make(chan struct{})
	f.counts = FaultCounts{}
	f.notify()
}

// Counts returns what the sender has done so far.
func (f *FaultySender) Counts() FaultCounts {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts
}

// WaitBlocked waits until at least n sends have been blocked by [FaultySender.Block] (those
// already released included), or ctx ends, and returns an error wrapping ctx's then. A
// test calls it to know that the publisher's send is in flight before it stops the
// publisher, say.
func (f *FaultySender) WaitBlocked(ctx context.Context, n int) error {
	return f.WaitCounts(ctx, func(c FaultCounts) bool { return c.Blocked >= n })
}

// WaitCounts waits until done returns true for the counts, or ctx ends, and returns an
// error wrapping ctx's then, with the counts it saw last.
func (f *FaultySender) WaitCounts(ctx context.Context, done func(FaultCounts) bool) error {
	for {
		f.mu.Lock()
		c, changed := f.counts, f.changed
		f.mu.Unlock()
		if done(c) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("outboxtest: faulty sender: waited for its counts (now %+v): %w", c, ctx.Err())
		}
	}
}

// notify wakes the waiters of WaitCounts; f.mu is held.
func (f *FaultySender) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// count changes the counts under the lock and wakes the waiters.
func (f *FaultySender) count(change func(*FaultCounts)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(&f.counts)
	f.notify()
}

// Send implements [outbox.Sender], with the faults set.
func (f *FaultySender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	errs := make([]error, len(evs))
	f.count(func(c *FaultCounts) { c.Sends += len(evs) })
	var (
		stopped map[string]bool // with keyOrder: the biz nos that failed in this call
		run     []int           // events waiting to go to the inner sender, as one call
		lose    map[int]bool    // events of run whose answer is to be lost
	)
	fail := func(i int, err error) {
		errs[i] = err
		if keyOrder && err != nil && !errors.Is(err, outbox.ErrUnconfirmed) {
			if stopped == nil {
				stopped = map[string]bool{}
			}
			stopped[evs[i].BizNo] = true
		}
	}
	flush := func() {
		if len(run) == 0 {
			return
		}
		batch := make([]outbox.Event, len(run))
		for j, i := range run {
			batch[j] = evs[i]
		}
		answers := f.inner.Send(ctx, batch, keyOrder)
		lost := 0
		for j, i := range run {
			var err error
			if j < len(answers) {
				err = answers[j]
			} else {
				err = fmt.Errorf("outboxtest: faulty sender: the inner sender answered %d of %d events", len(answers), len(batch))
			}
			if lose[i] && err == nil {
				lost++
				err = fmt.Errorf("outboxtest: the answer to a send was lost (the event was sent): %w", ErrInjected)
			}
			fail(i, err)
		}
		f.count(func(c *FaultCounts) { c.Passed += len(run); c.Lost += lost })
		run, lose = run[:0], nil
	}
	for i, ev := range evs {
		if ctx.Err() != nil {
			flush()
			errs[i] = fmt.Errorf("outboxtest: faulty sender: %w: %w", outbox.ErrNotSent, ctx.Err())
			f.count(func(c *FaultCounts) { c.NotSent++ })
			continue
		}
		for {
			act := f.decide(ev)
			if act != actPass && act != actLose {
				flush() // the events before it are answered before its fault, as a broker would
			}
			if stopped[ev.BizNo] {
				errs[i] = fmt.Errorf("outboxtest: faulty sender: %w: an earlier event of biz no %q failed in this call", outbox.ErrNotSent, ev.BizNo)
				f.count(func(c *FaultCounts) { c.NotSent++ })
				break
			}
			switch act {
			case actBlock:
				if err := f.wait(ctx); err != nil {
					fail(i, err)
					break
				}
				continue // released: the event meets the other faults as if it came now
			case actUnavailable:
				fail(i, outbox.Unavailable(fmt.Errorf("outboxtest: the broker is unavailable: %w", ErrInjected)))
				f.count(func(c *FaultCounts) { c.Unavailable++ })
			case actRefuse:
				fail(i, outbox.Permanent(fmt.Errorf("outboxtest: the broker refused the event: %w", ErrInjected)))
				f.count(func(c *FaultCounts) { c.Refused++ })
			case actFail:
				fail(i, fmt.Errorf("outboxtest: a send failed (to retry): %w", ErrInjected))
				f.count(func(c *FaultCounts) { c.Failed++ })
			case actLose:
				if lose == nil {
					lose = map[int]bool{}
				}
				lose[i] = true
				run = append(run, i)
			default:
				run = append(run, i)
			}
			break
		}
	}
	flush()
	return errs
}

// The actions Send takes for an event.
type action int

const (
	actPass action = iota
	actUnavailable
	actRefuse
	actFail
	actLose
	actBlock
)

// decide picks ev's action by the faults set, and counts a FailFirst or LoseAnswer try.
// The predicates run outside the lock, so that one may read the sender (its Counts, say).
func (f *FaultySender) decide(ev outbox.Event) action {
	f.mu.Lock()
	unavailable, refuse, block, failFirst, loseAnswer := f.unavailable, f.refuse, f.block, f.failFirst, f.loseAnswer
	f.mu.Unlock()
	switch {
	case unavailable:
		return actUnavailable
	case refuse != nil && refuse(ev):
		return actRefuse
	case block != nil && block(ev):
		return actBlock
	}
	if failFirst.n > 0 && failFirst.match(ev) && f.try(f.tries, ev.EventID, failFirst.n) {
		return actFail
	}
	if loseAnswer.n > 0 && loseAnswer.match(ev) && f.try(f.lost, ev.EventID, loseAnswer.n) {
		return actLose
	}
	return actPass
}

// try counts one more of an event's faults in tries, if fewer than n are counted, and
// reports whether it did.
func (f *FaultySender) try(tries map[string]int, eventID string, n int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if tries[eventID] >= n {
		return false
	}
	tries[eventID]++
	return true
}

// wait blocks one send until Release or ctx is done.
func (f *FaultySender) wait(ctx context.Context) error {
	f.mu.Lock()
	released := f.released
	f.counts.Blocked++
	f.notify()
	f.mu.Unlock()
	select {
	case <-released:
		return nil
	case <-ctx.Done():
		f.count(func(c *FaultCounts) { c.TimedOut++ })
		return fmt.Errorf("outboxtest: a blocked send gave up: %w (%w)", ctx.Err(), ErrInjected)
	}
}

// orAll is match, or a predicate that takes every event for nil.
func orAll(match func(outbox.Event) bool) func(outbox.Event) bool {
	if match == nil {
		return func(outbox.Event) bool { return true }
	}
	return match
}
