package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-outbox/outbox"
)

// RejectedMessage is a message the group could not process, as the rejected table keeps it.
type RejectedMessage struct {
	ID int64 // the row's id in the rejected table
	// Key is the event id, or "msgId:" and the broker's id for a message without one.
	Key         string
	Message     Message // as delivered; Deliveries is the deliveries recorded
	ReasonClass string  // no_event_id, invalid_event_id, permanent or max_deliveries
	Reason      string  // the error, or what was wrong with the message
	FirstAt     time.Time
	LastAt      time.Time
}

// Rejected lists the group's rejected messages with an id above after, oldest first, at
// most limit of them (1 to 1000).
func (in *Inbox) Rejected(ctx context.Context, after int64, limit int) ([]RejectedMessage, error) {
	if limit < 1 || limit > 1000 {
		return nil, fmt.Errorf("%w: limit must be between 1 and 1000, got %d", outbox.ErrInvalidInput, limit)
	}
	rows, err := in.db.QueryContext(ctx, in.q.rejected, after, limit)
	if err != nil {
		return nil, fmt.Errorf("inbox: list rejected messages: %w", schemaError(in.rejected, err))
	}
	defer rows.Close()
	var out []RejectedMessage
	for rows.Next() {
		r, err := scanRejected(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func scanRejected(row interface{ Scan(...any) error }) (RejectedMessage, error) {
	var (
		r     RejectedMessage
		props string
	)
	m := &r.Message
	err := row.Scan(&r.ID, &r.Key, &m.EventID, &m.MsgID, &m.Topic, &r.ReasonClass, &r.Reason, &props, &m.Body,
		&m.Deliveries, &r.FirstAt, &r.LastAt)
	if err != nil {
		return r, err
	}
	if m.Properties, err = decodeProperties(props); err != nil {
		return r, err
	}
	m.EventType, m.BizNo = m.Properties[outbox.PropertyEventType], m.Properties[outbox.PropertyBizNo]
	if m.EventID == "" {
		m.EventID = m.Properties[outbox.PropertyEventID]
	}
	return r, nil
}

// RejectedByEventID is the group's rejected message of the event eventID (the eventId
// property, the id [outbox.Tx.InsertEvent] returned and consumers log), read through the
// table's unique key on (consumer_group, msg_key): a message with a valid event id is kept
// under it. Its ID is the one [Inbox.Replay] and [Inbox.Resend] take:
//
//	r, err := in.RejectedByEventID(ctx, eventID)
//	if err != nil {
//		return err // wraps outbox.ErrNotFound when the group has no such rejected message
//	}
//	outcome, err := in.Replay(ctx, r.ID, handle)
//
// An eventID that is not a UUID is an error wrapping [outbox.ErrInvalidInput] (a message
// without a valid event id is kept under its broker message id: list it with
// [Inbox.Rejected]); one the group has no rejected message of wraps [outbox.ErrNotFound].
func (in *Inbox) RejectedByEventID(ctx context.Context, eventID string) (RejectedMessage, error) {
	if !validEventID(eventID) {
		return RejectedMessage{}, fmt.Errorf("%w: event id %.64q is not a UUID", outbox.ErrInvalidInput, eventID)
	}
	r, err := scanRejected(in.db.QueryRowContext(ctx, in.q.getRejectedByEvent, eventID))
	if errors.Is(err, sql.ErrNoRows) {
		return RejectedMessage{}, fmt.Errorf("%w: no rejected message of event %s in group %s", outbox.ErrNotFound, eventID, in.cfg.Group)
	}
	if err != nil {
		return RejectedMessage{}, fmt.Errorf("inbox: read the rejected message of event %s: %w", eventID, schemaError(in.rejected, err))
	}
	return r, nil
}

// Replay runs h once more for the rejected message id, as a delivery would (the event id
// recorded in the inbox in h's transaction), and deletes the rejected row in the same
// transaction, so that the message's effect happens once and the row goes with it. The
// outcome is Handled, or Duplicate when the group has handled the event since (the row is
// deleted then too); an error leaves the row as it is: a message without a valid event id
// cannot be replayed (there is nothing to deduplicate it on), and h's error is returned as
// it is. A missing id is an error wrapping [outbox.ErrNotFound]; [Inbox.RejectedByEventID]
// finds the id of an event's rejected message.
func (in *Inbox) Replay(ctx context.Context, id int64, h Handler) (Outcome, error) {
	if h == nil {
		return Failed, fmt.Errorf("%w: the handler is nil", outbox.ErrInvalidConfig)
	}
	r, err := scanRejected(in.db.QueryRowContext(ctx, in.q.getRejected, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Failed, fmt.Errorf("%w: no rejected message %d in group %s", outbox.ErrNotFound, id, in.cfg.Group)
	}
	if err != nil {
		return Failed, fmt.Errorf("inbox: read rejected message %d: %w", id, schemaError(in.rejected, err))
	}
	if !validEventID(r.Message.EventID) {
		return Failed, fmt.Errorf("%w: rejected message %d has no valid event id (%s): it cannot be replayed exactly once",
			outbox.ErrInvalidInput, id, r.ReasonClass)
	}
	msg := r.Message
	start := time.Now()
	tx, err := in.db.BeginTx(ctx, in.cfg.TxOptions)
	if err != nil {
		return Failed, fmt.Errorf("inbox: replay %d: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, in.q.dropRejected, id); err != nil {
		return Failed, fmt.Errorf("inbox: replay %d: %w", id, err)
	}
	outcome := Handled
	switch _, err := tx.ExecContext(ctx, in.q.record(msg.EventID)); {
	case isDuplicate(err):
		outcome = Duplicate
	case err != nil:
		return Failed, fmt.Errorf("inbox: replay %d: record event %s: %w", id, msg.EventID, err)
	default:
		if err := callHandler(ctx, h, tx, &msg); err != nil {
			return Failed, fmt.Errorf("inbox: replay %d: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return Failed, fmt.Errorf("inbox: replay %d: commit: %w", id, err)
	}
	in.m.delivered(ctx, &msg, outcome, start)
	return outcome, nil
}

// Purge deletes the table's inbox rows, every group's, recorded more than olderThan ago, in
// batches of 500 with pause between them, and reports how many it deleted. Only one purge
// of a table runs at a time, whichever group's inbox runs it (a named lock): while another
// session's purge of the table runs, Purge returns at once, deleting nothing, with an error
// wrapping [outbox.ErrPurgeBusy] (the consumer's retention then tries again at its next
// interval). A duplicate of an event whose row was purged is handled again, so olderThan
// must be longer than any redelivery or resend can come late: a failed delivery comes again
// through the group's retry topic after RocketMQ's growing pause (10 s, 30 s, 1 min, ... up
// to 2 h, and every 2 h after that: the consumer raises the client's MaxReconsumeTimes so
// that the client never gives a message up, [Config.MaxDeliveries] does, and a delivery that
// fails for a fault comes again for as long as the fault lasts), and the publisher resends
// an event after its lease (15 s by default). Rejected messages are never purged.
func (in *Inbox) Purge(ctx context.Context, olderThan, pause time.Duration) (int64, error) {
	if olderThan <= 0 || pause < 0 {
		return 0, fmt.Errorf("%w: olderThan must be positive and pause not negative, got %s and %s", outbox.ErrInvalidInput, olderThan, pause)
	}
	conn, err := in.db.Conn(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: purge: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+in.q.retainLock+", 0)").Scan(&got); err != nil {
		return 0, fmt.Errorf("inbox: purge: take the purge lock: %w", err)
	}
	if got.Int64 != 1 {
		return 0, fmt.Errorf("inbox: purge %s: %w", in.table, outbox.ErrPurgeBusy)
	}
	defer func() { _, _ = conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK("+in.q.retainLock+")") }()
	var total int64
	for {
		res, err := conn.ExecContext(ctx, in.q.purge, olderThan.Microseconds(), retentionBatch)
		if err != nil {
			return total, fmt.Errorf("inbox: purge: %w", schemaError(in.table, err))
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("inbox: purge: %w", err)
		}
		total += n
		if n < retentionBatch {
			return total, nil
		}
		select {
		case <-ctx.Done():
			return total, ctx.Err()
		case <-time.After(pause):
		}
	}
}
