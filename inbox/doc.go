// Package inbox is the consumer's half of the outbox: it makes the effect of a RocketMQ
// message happen once per consumer group, however often the message is delivered.
//
// The publisher delivers each event at least once: after a crash, a lost acknowledgement or
// a rebalance, a consumer may receive it again. The inbox records the event's id (the
// eventId property, the UUIDv7 [outbox.Tx.InsertEvent] returned) in a table whose primary
// key is (consumer group, event id), inside the transaction in which the handler does its
// effect:
//
//	in, err := inbox.New(db, inbox.Config{Group: "points_service"})
//	err = in.CreateSchema(ctx)
//	handle := func(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
//		_, err := tx.ExecContext(ctx, "INSERT INTO t_points (order_no, points) VALUES (?, ?)", msg.BizNo, 10)
//		return err
//	}
//	c, err := inbox.NewConsumer(in, handle, inbox.ConsumerConfig{NameServers: ns, Topic: "ORDER_EVENT_TOPIC", Tags: "ORDER_CREATED"})
//	if err := c.Start(ctx); err != nil { // consumes in the background until Stop or Close
//		return err
//	}
//	defer c.Close()
//
// The handler's effect and the record commit together or not at all. A delivery whose event
// is recorded already is acknowledged without calling the handler; a handler error rolls
// both back, and the message is delivered again; nothing is acknowledged before the
// transaction has committed. Deduplication holds across consumer instances and restarts,
// and never across groups.
//
// A message that can never be processed is rejected: recorded with its reason, properties
// and body in the rejected table and acknowledged, rather than delivered again and again. That
// is a message without an event id, one the handler refuses with [outbox.Permanent], and
// one that failed [Config.MaxDeliveries] deliveries. [Inbox.Rejected] lists them,
// [Inbox.RejectedByEventID] finds one by the event id, and [Inbox.Replay] runs the handler
// for one again, exactly once.
//
// [Consumer] has the library's lifecycle: Start reports its refusals, Run blocks, Stop is
// bounded by its context, Close by [ConsumerConfig.StopTimeout].
//
// [Inbox.Handle] is the mechanism without RocketMQ: a consumer of another client, or a
// test, calls it with each delivery.
//
// See docs/inbox.md for what each fault costs, the orderly consumer, retention and the
// figures.
package inbox
