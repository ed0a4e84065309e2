package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// noLease reports schema.sql's "nobody holds it": 1970-01-01 00:00:00, read in whatever
// location the driver reads times in.
func noLease(t time.Time) bool {
	y, m, d := t.Date()
	h, mi, sec := t.Clock()
	return y == 1970 && m == time.January && d == 1 && h == 0 && mi == 0 && sec == 0 && t.Nanosecond() == 0
}

// Get returns the event with the given id, or an error wrapping [ErrNotFound].
func (s *MySQLStore) Get(ctx context.Context, id int64) (Event, error) {
	var (
		ev                 Event
		owner, lastErr     sql.NullString
		status             string
		payload            []byte
		nextRetry, claimed time.Time
	)
	err := s.db.QueryRowContext(ctx, s.q.get, id).Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &payload, &status,
		&ev.RetryCount, &ev.ReclaimCount, dbTime{&nextRetry}, &owner, dbTime{&claimed}, &lastErr,
		dbTime{&ev.CreateTime}, dbTime{&ev.UpdateTime}, &ev.TraceParent, &ev.TraceState)
	if errors.Is(err, sql.ErrNoRows) {
		return Event{}, fmt.Errorf("%w: id %d", ErrNotFound, id)
	}
	if err != nil {
		return Event{}, s.wrap("get event", err)
	}
	if noLease(claimed) {
		claimed = time.Time{}
	}
	ev.Payload, ev.Status, ev.NextRetryTime, ev.ClaimedAt = payload, Status(status), nextRetry, claimed
	ev.ClaimOwner, ev.LastError = owner.String, lastErr.String
	return ev, nil
}

// Requeue returns a dead-lettered (FAIL) event to WAIT with its retry count reset, for a
// person who has fixed the cause and wants it sent again. It reports false if the event is
// not FAIL.
func (s *MySQLStore) Requeue(ctx context.Context, id int64) (bool, error) {
	return s.execOne(ctx, "requeue", s.q.requeue, id)
}
