package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/go-outbox/outbox"
)

// Resend publishes the rejected message id again through sender, as the same event (its
// event id, type, biz no, body and trace context), and deletes its row once the broker has
// accepted it: for an operator, once the cause is fixed, to have the running consumers
// handle it (outboxctl inbox resend does this). It goes to the topic it was consumed from
// ([Message.Topic]): every group subscribed to that topic receives it again; those that
// handled the event already suppress it as a duplicate, by its event id. A row whose delete fails after the send stays, and a second resend is suppressed
// too. A message without a valid event id cannot be resent: nothing would tell its copies
// apart. A missing id is an error wrapping [outbox.ErrNotFound]; [Inbox.RejectedByEventID]
// finds the id of an event's rejected message.
func (in *Inbox) Resend(ctx context.Context, id int64, sender outbox.Sender) error {
	if sender == nil {
		return fmt.Errorf("%w: the sender is nil", outbox.ErrInvalidConfig)
	}
	r, err := scanRejected(in.db.QueryRowContext(ctx, in.q.getRejected, id))
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: no rejected message %d in group %s", outbox.ErrNotFound, id, in.cfg.Group)
	}
	if err != nil {
		return fmt.Errorf("inbox: read rejected message %d: %w", id, schemaError(in.rejected, err))
	}
	m := r.Message
	if !validEventID(m.EventID) {
		return fmt.Errorf("%w: rejected message %d has no valid event id (%s): it cannot be resent", outbox.ErrInvalidInput, id, r.ReasonClass)
	}
	ev := outbox.Event{
		EventID: m.EventID, EventType: m.EventType, BizNo: m.BizNo, Payload: m.Body, Topic: m.Topic,
		TraceParent: m.Properties[outbox.PropertyTraceParent], TraceState: m.Properties[outbox.PropertyTraceState],
	}
	errs := sender.Send(ctx, []outbox.Event{ev}, false)
	if len(errs) != 1 {
		return fmt.Errorf("inbox: resend %d: the sender returned %d results for 1 event", id, len(errs))
	}
	if errs[0] != nil {
		return fmt.Errorf("inbox: resend %d: %w", id, errs[0])
	}
	if _, err := in.db.ExecContext(ctx, in.q.dropRejected, id); err != nil {
		return fmt.Errorf("inbox: resent %d, but could not delete its row (a second resend is harmless): %w", id, err)
	}
	return nil
}
