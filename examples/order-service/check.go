package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// checkTimeout bounds -check's wait for the points service.
const checkTimeout = 3 * time.Minute

// result is what a run left in the tables: its events in the outbox table, the points
// service's inbox records of them, and its awards.
type result struct {
	events, sent, byRelay int            // the run's events; those sent; those a relay sent
	sentTo                map[string]int // the events sent, by topic
	consumed              int            // the events of the points service's topic
	handled, rejected     int            // of those, the ones the inbox recorded as handled, and as rejected
	awarded, twice, paid  int            // orders awarded points once, more than once; with -ordered, orders marked paid
}

// check waits until the points service has handled (or rejected) every event of the run,
// prints what the run did, and returns an error if anything is wrong: an order without
// points, or with points twice; an event not sent or rejected; with -ordered, an order's
// points not marked paid (its ORDER_PAID arrived before its ORDER_CREATED); with -relay, no
// event sent by a relay.
func check(ctx context.Context, db *sql.DB, o options, start time.Time) error {
	deadline := time.Now().Add(checkTimeout)
	var r result
	for {
		var err error
		if r, err = measure(ctx, db, o); err != nil {
			return err
		}
		if r.sent == r.events && r.handled+r.rejected == r.consumed || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	header := fmt.Sprintf("%d orders through %d instances", o.orders, o.instances)
	if o.instances == 1 {
		header = fmt.Sprintf("%d orders through 1 instance", o.orders)
	}
	if o.ordered {
		header += ", in key order"
	}
	if o.relay {
		header += ", through the relay"
	}
	var topics []string
	for _, t := range slices.Sorted(maps.Keys(r.sentTo)) {
		topics = append(topics, fmt.Sprintf("%s %d", t, r.sentTo[t]))
	}
	w := o.out
	fmt.Fprintf(w, "\ncheck: %s, %s\n", header, time.Since(start).Round(time.Millisecond))
	fmt.Fprintf(w, "  events sent           %6d   (%s)\n", r.sent, strings.Join(topics, ", "))
	if o.relay {
		fmt.Fprintf(w, "  sent by a relay       %6d\n", r.byRelay)
	}
	fmt.Fprintf(w, "  handled by the inbox  %6d   (of %d on %s)\n", r.handled, r.consumed, o.topic)
	fmt.Fprintf(w, "  rejected              %6d\n", r.rejected)
	fmt.Fprintf(w, "  awarded once          %6d\n", r.awarded)
	fmt.Fprintf(w, "  awarded twice         %6d\n", r.twice)
	fmt.Fprintf(w, "  not awarded           %6d\n", o.orders-r.awarded-r.twice)
	if o.ordered {
		fmt.Fprintf(w, "  paid after created    %6d\n", r.paid)
	}

	var problems []string
	fail := func(n int, what string) {
		if n > 0 {
			problems = append(problems, fmt.Sprintf("%d %s", n, what))
		}
	}
	fail(r.events-r.sent, "events not sent")
	fail(r.consumed-r.handled-r.rejected, fmt.Sprintf("events not handled by the points service within %s", checkTimeout))
	fail(r.rejected, "events rejected by the points service")
	fail(o.orders-r.awarded-r.twice, "orders without points")
	fail(r.twice, "orders awarded points more than once")
	if o.ordered {
		fail(o.orders-r.paid, "orders not marked paid (an ORDER_PAID that arrives before its ORDER_CREATED finds no points to mark)")
	}
	if o.relay && r.byRelay == 0 {
		problems = append(problems, "no event sent by a relay")
	}
	if len(problems) > 0 {
		return errors.New("check failed: " + strings.Join(problems, "; "))
	}
	fmt.Fprintln(w, "ok")
	return nil
}

// measure reads the run's result from the tables: the outbox table's rows of its orders, the
// inbox's records of those the points service consumes, and the points of its orders.
func measure(ctx context.Context, db *sql.DB, o options) (result, error) {
	r := result{sentTo: map[string]int{}}
	prefix := o.runID + "%"
	rows, err := db.QueryContext(ctx, "SELECT topic, COUNT(*), COUNT(CASE WHEN status = 'SUCCESS' THEN 1 END), "+
		"COUNT(CASE WHEN status = 'SUCCESS' AND claim_owner LIKE 'relay-%' THEN 1 END) "+
		"FROM `"+o.table+"` WHERE biz_no LIKE ? GROUP BY topic", prefix)
	if err != nil {
		return r, fmt.Errorf("check the events: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var topic string
		var events, sent, byRelay int
		if err := rows.Scan(&topic, &events, &sent, &byRelay); err != nil {
			return r, err
		}
		r.events, r.sent, r.byRelay = r.events+events, r.sent+sent, r.byRelay+byRelay
		r.sentTo[topic] = sent
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	// The inbox keys its records by (consumer group, event id), and a rejected message with
	// an event id by (consumer group, event id) too.
	err = db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(i.event_id), COUNT(j.id) FROM `"+o.table+"` e "+
		"LEFT JOIN t_inbox i ON i.consumer_group = ? AND i.event_id = e.event_id "+
		"LEFT JOIN t_inbox_rejected j ON j.consumer_group = ? AND j.msg_key = e.event_id "+
		"WHERE e.biz_no LIKE ? AND e.topic = ?", o.group, o.group, prefix, o.topic).Scan(&r.consumed, &r.handled, &r.rejected)
	if err != nil {
		return r, fmt.Errorf("check the inbox: %w", err)
	}
	err = db.QueryRowContext(ctx, "SELECT COUNT(CASE WHEN n = 1 THEN 1 END), COUNT(CASE WHEN n > 1 THEN 1 END), COUNT(CASE WHEN paid THEN 1 END) "+
		"FROM (SELECT COUNT(*) AS n, MAX(paid) AS paid FROM example_points WHERE order_no LIKE ? GROUP BY order_no) p", prefix).
		Scan(&r.awarded, &r.twice, &r.paid)
	if err != nil {
		return r, fmt.Errorf("check the points: %w", err)
	}
	return r, nil
}
