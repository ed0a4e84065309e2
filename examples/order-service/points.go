package main

// The points service: in a real system a service of its own, with a database of its own,
// consuming the events the order service publishes; here it shares the order service's.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// startPointsService starts the points service: an inbox consumer of the order events in
// -group, which runs awardPoints once for each event, however often it is delivered.
func startPointsService(ctx context.Context, db *sql.DB, o options) (*inbox.Consumer, error) {
	cfg := inbox.Config{Group: o.group, MeterProvider: o.meter}
	tags := "ORDER_CREATED"
	if o.ordered {
		// A failure that may pass (the database down) holds its queue until it passes,
		// rather than being rejected after five deliveries and overtaken by the order's
		// next event.
		cfg.MaxDeliveries = outbox.RetryForever
		tags = "ORDER_CREATED || ORDER_PAID"
	}
	in, err := inbox.New(db, cfg)
	if err != nil {
		return nil, err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return nil, err
	}
	c, err := inbox.NewConsumer(in, awardPoints, inbox.ConsumerConfig{
		NameServers: []string{o.namesrv},
		Topic:       o.topic,
		Tags:        tags,
		Orderly:     o.ordered, // each queue's messages one after another: an order's events in order
	})
	if err != nil {
		return nil, err
	}
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// awardPoints is the points service's handler. It runs in tx, the transaction in which the
// inbox has recorded the event's id, and its writes commit with that record or not at all:
// an error rolls both back, and the message is delivered again. A message it can never
// process it refuses with outbox.Permanent, and the inbox records it as rejected, rather
// than have RocketMQ deliver it again for hours.
func awardPoints(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
	var ord order
	if err := json.Unmarshal(msg.Body, &ord); err != nil {
		return outbox.Permanent(fmt.Errorf("the body is not an order: %w", err))
	}
	if ord.OrderNo == "" {
		return outbox.Permanent(errors.New("the body is not an order: no orderNo"))
	}
	switch msg.EventType {
	case "ORDER_CREATED":
		_, err := tx.ExecContext(ctx, "INSERT INTO example_points (order_no, user_id, points) VALUES (?, ?, ?)",
			ord.OrderNo, ord.UserID, ord.Amount/10)
		return err
	case "ORDER_PAID":
		// With -ordered: the order's ORDER_CREATED, sent before it into the same queue, has
		// been handled already; had it not, there would be no points to mark paid.
		res, err := tx.ExecContext(ctx, "UPDATE example_points SET paid = TRUE WHERE order_no = ?", ord.OrderNo)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err == nil && n == 0 {
			slog.WarnContext(ctx, "points service: ORDER_PAID before its order's ORDER_CREATED", "order_no", ord.OrderNo)
		}
	}
	return nil
}
