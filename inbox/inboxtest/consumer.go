package inboxtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/outboxtest"
)

// Consumer hands the events a [outboxtest.MemorySender] records to a handler as they are
// sent, in the background, one at a time and in the order sent, as an [inbox.Consumer] of
// the sender's topic would: each send a message of its own ([Message]), through [Deliver].
// With it, a test runs the whole path as production does, with no broker: the service's
// transaction, a real publisher, the MemorySender, and the consumer's handler through a
// real inbox, and then waits for the handler's deliveries ([Consumer.WaitFor]) and
// asserts on its effect.
//
// A Consumer is stopped by [Consumer.Close]. The sender it reads must not be Reset while
// it runs: it reads the record by position.
type Consumer struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	ds      []Delivery
	changed chan struct{} // closed, and replaced, at each delivery
}

// Consume starts a Consumer that delivers what sent records, from its first event, to h
// through in, each message built with opts.
func Consume(in *inbox.Inbox, h inbox.Handler, sent *outboxtest.MemorySender, opts ...Option) *Consumer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &Consumer{cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	go c.run(ctx, in, h, sent, opts)
	return c
}

func (c *Consumer) run(ctx context.Context, in *inbox.Inbox, h inbox.Handler, sent *outboxtest.MemorySender, opts []Option) {
	defer close(c.done)
	for i := 0; ; i++ {
		evs, err := sent.WaitFor(ctx, i+1)
		if err != nil {
			return // closed
		}
		d := Deliver(ctx, in, h, Message(evs[i], opts...))
		if d.Outcome == inbox.Failed && ctx.Err() != nil {
			return // cut short by Close: not a delivery's outcome
		}
		d.Event = evs[i]
		c.mu.Lock()
		c.ds = append(c.ds, d)
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
	}
}

// Deliveries returns what became of each event delivered so far, in the order sent.
func (c *Consumer) Deliveries() []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Delivery(nil), c.ds...)
}

// WaitFor waits until n events have been delivered (each handled, a duplicate, rejected,
// or failed [MaxDeliveries] times) and returns the first n deliveries, in the order sent.
// If ctx ends first, it returns those it has with an error wrapping ctx's.
func (c *Consumer) WaitFor(ctx context.Context, n int) ([]Delivery, error) {
	for {
		c.mu.Lock()
		ds, changed := c.ds, c.changed
		c.mu.Unlock()
		if len(ds) >= n {
			return append([]Delivery(nil), ds[:max(n, 0)]...), nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return append([]Delivery(nil), ds...), fmt.Errorf("inboxtest: waited for %d deliveries, %d done: %w", n, len(ds), ctx.Err())
		}
	}
}

// Close stops the Consumer and waits for it: a delivery in progress is cancelled (its
// transaction rolls back) and left out. It returns every delivery done. Close is safe to
// call more than once.
func (c *Consumer) Close() []Delivery {
	c.cancel()
	<-c.done
	return c.Deliveries()
}
