// Package inboxtest runs an [inbox.Handler] in a service's own test, against the real
// database, with the messages the publisher would have sent, and no broker: [Message] builds
// the delivery of an [outbox.Event] exactly as the inbox's consumer hands it to the handler
// when [outbox.RocketMQSender] sent it, and [Deliver] passes it through [inbox.Inbox.Handle],
// delivering it again after a failure as RocketMQ does, and reports what became of it. A
// test then asserts on the handler's effect and on the [inbox.Outcome]: handled once, a
// second delivery suppressed as a duplicate, a failing handler retried and in the end
// rejected.
//
// With a MemorySender ([github.com/go-outbox/outbox/outboxtest.MemorySender]) it is the
// whole path in one process: the service's transaction writes the event, a real
// [outbox.Publisher] sends it to the MemorySender, and [DeliverAll] hands what the sender
// recorded, duplicates included, to the consumer's handler:
//
//	evs, err := sent.WaitFor(ctx, 1)                      // what the publisher sent
//	ds, err := inboxtest.DeliverAll(ctx, in, handle, evs) // what the consumer did with it
//
// or [Consume] delivers them in the background as they are sent, as a consumer does, and
// the test waits for the deliveries:
//
//	c := inboxtest.Consume(in, handle, sent)
//	defer c.Close()
//	// ... the service's transaction ...
//	ds, err := c.WaitFor(ctx, 1)
//
// The package is apart from package outboxtest so that a test of the publishing side alone does
// not import the inbox, and so that the kit of each side sits beside the package it tests,
// as net/http/httptest beside net/http.
package inboxtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// DefaultTopic is the topic of a message whose event names none ([outbox.Event.Topic] "":
// an event made by hand; a store's events name theirs): the default of
// [outbox.Routes.Topic].
const DefaultTopic = "ORDER_EVENT_TOPIC"

// The message properties the RocketMQ client sets besides the library's own: the keys
// (the biz no), the tag (the event type) and, in key order, the sharding key (the biz no).
const (
	PropertyKeys        = "KEYS"
	PropertyTags        = "TAGS"
	PropertyShardingKey = "SHARDING_KEY"
	// PropertyUniqueKey is the client's id of the message, its MsgID on delivery.
	PropertyUniqueKey = "UNIQ_KEY"
)

// An Option says how the sender the message stands for was configured.
type Option func(*options)

type options struct {
	keyOrder   bool
	ceSource   string
	ceType     string
	cloudEvent bool
}

// KeyOrder makes the message one the sender sent in key order (a store made with
// [outbox.KeyOrder]): its biz no is its sharding key, as an orderly consumer receives it.
func KeyOrder() Option { return func(o *options) { o.keyOrder = true } }

// CloudEvents makes the message carry the event's CloudEvents attributes, as a sender with
// [outbox.RocketMQConfig.CloudEventsSource] set sends them; contentType "" is the sender's
// default, application/json.
func CloudEvents(source, contentType string) Option {
	return func(o *options) {
		o.cloudEvent, o.ceSource, o.ceType = true, source, cmp.Or(contentType, "application/json")
	}
}

// Message returns the first delivery of ev as the inbox's consumer hands it to a handler
// when [outbox.RocketMQSender] sent it: the event id, type and biz no as fields and
// properties (eventId, eventType, bizNo), the payload as the body, the biz no as the
// message's key (KEYS) and the event type as its tag (TAGS), the stored trace context
// (traceparent, tracestate) when it is well formed, the topic (ev.Topic, or [DefaultTopic]
// for an event made by hand without one), a new message id (MsgID, and UNIQ_KEY as the
// client sets it), one delivery, and BornAt now. Each call is a new message: two calls for one event are the event sent twice,
// two messages with one event id, as the consumer sees a duplicate. [Redelivery] is the
// same message delivered again.
//
// The properties the broker adds on its way (MIN_OFFSET, MAX_OFFSET, CONSUME_START_TIME and
// the like) are left out: they say where the message was stored, nothing of the event.
func Message(ev outbox.Event, opts ...Option) *inbox.Message {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	msgID := newMsgID()
	props := map[string]string{
		outbox.PropertyEventID:   ev.EventID,
		outbox.PropertyEventType: ev.EventType,
		outbox.PropertyBizNo:     ev.BizNo,
		PropertyKeys:             ev.BizNo,
		PropertyTags:             ev.EventType,
		PropertyUniqueKey:        msgID,
	}
	if parent, state := traceProperties(ev); parent != "" {
		props[outbox.PropertyTraceParent] = parent
		if state != "" {
			props[outbox.PropertyTraceState] = state
		}
	}
	if o.keyOrder {
		props[PropertyShardingKey] = ev.BizNo
	}
	if o.cloudEvent {
		props["CE_specversion"] = "1.0"
		props["CE_id"] = ev.EventID
		props["CE_source"] = o.ceSource
		props["CE_type"] = ev.EventType
		if !ev.CreateTime.IsZero() {
			props["CE_time"] = ev.CreateTime.UTC().Format("2006-01-02T15:04:05.000Z07:00")
		}
		props["CE_contenttype"] = o.ceType
	}
	return &inbox.Message{
		EventID:    ev.EventID,
		EventType:  ev.EventType,
		BizNo:      ev.BizNo,
		Body:       append([]byte(nil), ev.Payload...),
		Properties: props,
		Topic:      cmp.Or(ev.Topic, DefaultTopic),
		MsgID:      msgID,
		Deliveries: 1,
		BornAt:     time.Now(),
	}
}

// Redelivery returns msg delivered once more: the same message (its MsgID too) with one
// delivery more, as RocketMQ delivers a message whose handler failed. msg is not changed.
func Redelivery(msg *inbox.Message) *inbox.Message {
	m := *msg
	m.Body = append([]byte(nil), msg.Body...)
	m.Properties = make(map[string]string, len(msg.Properties))
	for k, v := range msg.Properties {
		m.Properties[k] = v
	}
	m.Deliveries++
	return &m
}

// MaxDeliveries bounds the deliveries of one message by [Deliver]: a handler that fails
// every time with a fault the inbox never rejects for ([outbox.Unavailable], a lost
// connection) would otherwise be delivered forever, as RocketMQ would.
const MaxDeliveries = 16

// A Delivery is what became of one message: its last delivery, and that delivery's
// outcome and error ([inbox.Inbox.Handle]'s).
type Delivery struct {
	Event   outbox.Event   // the event the message was built from (set by DeliverAll)
	Message *inbox.Message // the last delivery; Message.Deliveries is how many there were
	Outcome inbox.Outcome
	Err     error // nil unless Outcome is Failed
}

// Deliver hands msg to h through in ([inbox.Inbox.Handle]) and, while the outcome is
// [inbox.Failed], delivers it again ([Redelivery]) as RocketMQ does, until it is handled, a
// duplicate or rejected ([inbox.Config.MaxDeliveries] rejects it), or until it has been
// delivered [MaxDeliveries] times, or ctx is done. It returns the last delivery, its
// outcome and its error. There is no pause between deliveries: RocketMQ's backoff is not
// the handler's concern. A nil in is reported as a failure with an error wrapping
// [outbox.ErrInvalidConfig]; a nil h or msg, as [inbox.Inbox.Handle] reports them.
func Deliver(ctx context.Context, in *inbox.Inbox, h inbox.Handler, msg *inbox.Message) Delivery {
	d := Delivery{Message: msg}
	if in == nil {
		d.Outcome, d.Err = inbox.Failed, fmt.Errorf("%w: inboxtest: the inbox is nil", outbox.ErrInvalidConfig)
		return d
	}
	for {
		d.Outcome, d.Err = in.Handle(ctx, d.Message, h)
		if d.Outcome != inbox.Failed || d.Message.Deliveries >= MaxDeliveries || ctx.Err() != nil {
			return d
		}
		d.Message = Redelivery(d.Message)
	}
}

// DeliverAll delivers each event of evs, in order, as a message of its own ([Message], with
// opts) through [Deliver], and returns what became of each, in the same order. Events sent
// twice (recorded twice by a MemorySender) are two messages with one event id: the second
// is a duplicate the inbox suppresses. It stops at the first event it cannot finish because
// ctx is done, and returns the deliveries so far with ctx's error.
func DeliverAll(ctx context.Context, in *inbox.Inbox, h inbox.Handler, evs []outbox.Event, opts ...Option) ([]Delivery, error) {
	ds := make([]Delivery, 0, len(evs))
	for _, ev := range evs {
		if err := ctx.Err(); err != nil {
			return ds, fmt.Errorf("inboxtest: %d of %d events delivered: %w", len(ds), len(evs), err)
		}
		d := Deliver(ctx, in, h, Message(ev, opts...))
		d.Event = ev
		ds = append(ds, d)
	}
	return ds, nil
}

// Count returns how many of ds had the outcome.
func Count(ds []Delivery, o inbox.Outcome) int {
	n := 0
	for _, d := range ds {
		if d.Outcome == o {
			n++
		}
	}
	return n
}

// newMsgID is a message id of the form the RocketMQ client gives: 32 hexadecimal digits,
// upper case.
func newMsgID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b))
}

// traceProperties is the trace context the sender sends for ev: none unless the stored
// traceparent is well formed, and a tracestate only if it is too.
func traceProperties(ev outbox.Event) (parent, state string) {
	if ev.TraceParent == "" {
		return "", ""
	}
	carrier := propagation.MapCarrier{"traceparent": ev.TraceParent}
	if ev.TraceState != "" {
		carrier["tracestate"] = ev.TraceState
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	if !sc.IsValid() {
		return "", ""
	}
	if ev.TraceState != "" && sc.TraceState().String() != "" {
		state = ev.TraceState
	}
	return ev.TraceParent, state
}
