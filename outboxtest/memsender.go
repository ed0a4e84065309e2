package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/go-outbox/outbox"
)

// MemorySender is an [outbox.Sender] that keeps in memory every event it is given, for a
// service's own tests: the test runs the service's business transaction against a real
// [outbox.MySQLStore], a real [outbox.Publisher] sends through the MemorySender, and the
// test waits for the event and asserts on it, with no broker:
//
//	sent := outboxtest.NewMemorySender()
//	publisher, err := outbox.NewPublisher(store, sent, outbox.Config{PollInterval: 50 * time.Millisecond})
//	// ... Start, run the service's transaction ...
//	evs, err := sent.WaitFor(ctx, 1) // the first event sent, once it is
//
// It is the wire alone: what is sent when, retried or dead-lettered is decided by the
// library ([outbox.Dispatch], the publisher's rounds) exactly as for the real sender. It
// refuses, as [outbox.Permanent], what a RocketMQ broker refuses: an event without a
// topic, an empty payload, and a payload over MaxMessageBytes (the broker's
// maxMessageSize). Made with topics, it knows those topics only, as a cluster that does
// not create topics on demand: Check refuses the others, and a send to one fails as
// [outbox.Unavailable] (no route), as the real sender's does. It accepts every other event
// at once and records a copy of it, in the order the publisher sent them, duplicates
// included: an event sent twice (a lost answer, a reclaim) is recorded twice, with the
// same [outbox.Event.EventID]. With keyOrder it keeps each biz no's events in the order
// given, and a biz no whose event it refuses goes no further in the call (its later events
// get [outbox.ErrNotSent]), as the Sender contract asks. A Send whose ctx is done records
// nothing and answers every event with an error wrapping [outbox.ErrNotSent], as a sender
// whose timeout passed before the event's turn.
//
// It is safe for concurrent use: several publishers may send through one MemorySender at
// once while the test reads it. It has no Close, so the publisher's Close leaves it as it
// was: the record stays readable after the publisher has closed, and one MemorySender may
// serve publishers one after another. Wrap it in a [FaultySender] to make sends fail.
type MemorySender struct {
	// MaxMessageBytes is the largest payload it takes, as the broker's maxMessageSize: a
	// larger one is refused as [outbox.Permanent]. Zero: 4 MiB, the broker's default.
	MaxMessageBytes int

	topics map[string]bool // nil: any topic

	mu      sync.Mutex
	events  []outbox.Event
	calls   int
	changed chan struct{} // closed, and replaced, whenever the record changes
}

// defaultMaxMessageBytes is a RocketMQ broker's default maxMessageSize.
const defaultMaxMessageBytes = 4 << 20

// NewMemorySender returns an empty MemorySender. With topics, it knows those topics only
// (see MemorySender); without, any.
func NewMemorySender(topics ...string) *MemorySender {
	s := &MemorySender{changed: make(chan struct{})}
	if len(topics) > 0 {
		s.topics = make(map[string]bool, len(topics))
		for _, t := range topics {
			s.topics[t] = true
		}
	}
	return s
}

// Info implements [outbox.Sender]: System "memory", and no send timeout of its own (the
// publisher's [outbox.Tuning.SendTimeout] bounds the sends).
func (s *MemorySender) Info() outbox.SenderInfo {
	return outbox.SenderInfo{System: "memory"}
}

// Check implements [outbox.Sender]: made with topics, it refuses, in one error wrapping
// [outbox.ErrInvalidConfig], the topics it does not know.
func (s *MemorySender) Check(_ context.Context, topics []string) error {
	if s.topics == nil {
		return nil
	}
	var missing []string
	for _, t := range topics {
		if !s.topics[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: outboxtest: the memory sender has no topic %s", outbox.ErrInvalidConfig, strings.Join(missing, ", "))
	}
	return nil
}

// Send implements [outbox.Sender]: it records a copy of each event of evs it accepts (see
// MemorySender), or, when ctx is done, records none and answers each with an error wrapping
// [outbox.ErrNotSent].
func (s *MemorySender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	errs := make([]error, len(evs))
	if err := ctx.Err(); err != nil {
		for i := range errs {
			errs[i] = fmt.Errorf("outboxtest: memory sender: %w: %w", outbox.ErrNotSent, err)
		}
		return errs
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	var stopped map[string]error // with keyOrder: the biz nos refused in this call
	recorded := 0
	for i, ev := range evs {
		if cause := stopped[ev.BizNo]; cause != nil {
			errs[i] = &notSentAfter{bizNo: ev.BizNo, cause: cause}
			continue
		}
		if errs[i] = s.refuse(ev); errs[i] != nil {
			if keyOrder {
				if stopped == nil {
					stopped = map[string]error{}
				}
				stopped[ev.BizNo] = errs[i]
			}
			continue
		}
		s.events = append(s.events, copyEvent(ev))
		recorded++
	}
	if recorded > 0 {
		s.notify()
	}
	return errs
}

// refuse returns why the broker would not take ev, or nil.
func (s *MemorySender) refuse(ev outbox.Event) error {
	limit := s.MaxMessageBytes
	if limit <= 0 {
		limit = defaultMaxMessageBytes
	}
	switch {
	case ev.Topic == "":
		return outbox.Permanent(errors.New("outboxtest: memory sender: the event names no topic"))
	case s.topics != nil && !s.topics[ev.Topic]:
		return outbox.Unavailable(fmt.Errorf("outboxtest: memory sender: topic %s has no route (the sender was made without it)", ev.Topic))
	case len(ev.Payload) == 0:
		return outbox.Permanent(errors.New("outboxtest: memory sender: the payload is empty; the broker takes no message without a body"))
	case len(ev.Payload) > limit:
		return outbox.Permanent(fmt.Errorf("outboxtest: memory sender: the payload is %d bytes, over the broker's %d", len(ev.Payload), limit))
	}
	return nil
}

// notify wakes every waiter; s.mu is held.
func (s *MemorySender) notify() {
	if s.changed == nil { // a MemorySender not made by NewMemorySender
		return
	}
	close(s.changed)
	s.changed = make(chan struct{})
}

// Events returns a copy of every event recorded so far, in the order they were sent.
func (s *MemorySender) Events() []outbox.Event {
	return s.Match(nil)
}

// Match returns a copy of the recorded events for which match returns true, in the order
// they were sent; a nil match takes every event.
func (s *MemorySender) Match(match func(outbox.Event) bool) []outbox.Event {
	evs, _ := s.snapshot()
	return pick(evs, -1, match)
}

// snapshot returns the events recorded so far, and the channel that is closed at the next
// change. The events are shared, not copied: the record only grows by append (a Reset
// starts a new one), so the snapshot's elements never change; they are read outside the
// lock, where a predicate may call the sender's methods.
func (s *MemorySender) snapshot() ([]outbox.Event, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil { // a MemorySender not made by NewMemorySender
		s.changed = make(chan struct{})
	}
	return s.events[:len(s.events):len(s.events)], s.changed
}

// pick returns copies of the first n events of evs that match takes (n < 0: all of them;
// a nil match takes every event).
func pick(evs []outbox.Event, n int, match func(outbox.Event) bool) []outbox.Event {
	var out []outbox.Event
	for _, ev := range evs {
		if len(out) == n {
			break
		}
		if match == nil || match(ev) {
			out = append(out, copyEvent(ev))
		}
	}
	return out
}

// ByBizNo returns the recorded events of the biz no, in the order they were sent.
func (s *MemorySender) ByBizNo(bizNo string) []outbox.Event {
	return s.Match(func(ev outbox.Event) bool { return ev.BizNo == bizNo })
}

// ByType returns the recorded events of the event type, in the order they were sent.
func (s *MemorySender) ByType(eventType string) []outbox.Event {
	return s.Match(func(ev outbox.Event) bool { return ev.EventType == eventType })
}

// ByTopic returns the recorded events whose [outbox.Event.Topic] is topic, in the order
// they were sent.
func (s *MemorySender) ByTopic(topic string) []outbox.Event {
	return s.Match(func(ev outbox.Event) bool { return ev.Topic == topic })
}

// Len returns how many events have been recorded, duplicates included.
func (s *MemorySender) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.events)
}

// Calls returns how many Send calls recorded events: the publisher's batches.
func (s *MemorySender) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// Reset forgets every event recorded so far (and the count of calls); a WaitFor in
// progress then waits for events sent after the Reset.
func (s *MemorySender) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events, s.calls = nil, 0
	s.notify()
}

// WaitFor waits until at least n events have been recorded and returns the first n, in
// the order they were sent. If ctx ends first, it returns what it has with an error
// wrapping ctx's that says how many it had. A test bounds the wait by its context, e.g.
// context.WithTimeout(t.Context(), 10*time.Second): no sleeping, and no fixed pause.
func (s *MemorySender) WaitFor(ctx context.Context, n int) ([]outbox.Event, error) {
	return s.WaitForMatch(ctx, n, nil)
}

// WaitForMatch waits until at least n of the recorded events satisfy match (nil: every
// event) and returns the first n of them, in the order they were sent. If ctx ends first,
// it returns those it has with an error wrapping ctx's. match runs outside the sender's
// lock, and may read the sender.
func (s *MemorySender) WaitForMatch(ctx context.Context, n int, match func(outbox.Event) bool) ([]outbox.Event, error) {
	for {
		evs, changed := s.snapshot()
		got := pick(evs, max(n, 0), match)
		if len(got) >= n {
			return got, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return got, fmt.Errorf("outboxtest: waited for %d events, %d sent: %w", n, len(got), ctx.Err())
		}
	}
}

// copyEvent is ev with slices of its own, so that neither the sender's caller nor the
// test can change what the other sees.
func copyEvent(ev outbox.Event) outbox.Event {
	ev.Payload = slices.Clone(ev.Payload)
	ev.Failures = slices.Clone(ev.Failures)
	return ev
}

// notSentAfter is the error of an event not sent because an earlier event of its biz no
// was refused in the same key-ordered call. It is [outbox.ErrNotSent], and names, but does
// not wrap, the refusal: the event is not charged with it.
type notSentAfter struct {
	bizNo string
	cause error
}

func (e *notSentAfter) Error() string {
	return "outboxtest: memory sender: " + outbox.ErrNotSent.Error() + ": an earlier event of biz no " + e.bizNo + " failed: " + e.cause.Error()
}

func (e *notSentAfter) Is(target error) bool { return target == outbox.ErrNotSent }
