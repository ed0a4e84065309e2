package outbox

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/go-outbox/outbox/internal/eventrules"
)

// Tx is a database transaction in which the service writes its business rows and its events.
// It is a *sql.Tx: use it for the business statements, then Commit or Rollback it.
type Tx struct {
	*sql.Tx
	store *MySQLStore
	wrote bool
	// wroteDue: it wrote an event that may be due at its commit (no Delay), which the
	// commit's wake-up is for.
	wroteDue bool
	// later are the due times of the delayed events written (a few distinct ones), as
	// offsets from the commit, or instants for NotBefore, by the process clock: hints for
	// wake-ups, never a due time.
	later []dueHint
	// firstInsert is when the first InsertEvent began (process clock).
	firstInsert time.Time
	// lastEventID is the event id of the last event written.
	lastEventID string
}

// Commit commits the transaction and, if it wrote events, wakes the publishers of this
// process that use the same store, so the events are sent at once rather than at the next
// poll. Events written with a Delay or NotBefore wake them when they are due instead (see
// dueWakes).
func (t *Tx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	if t.wrote {
		// A transaction that ran long after its first insert may have committed behind the
		// claims' scan floor: the next claim reaches back to it.
		if time.Since(t.firstInsert) > floorSlack {
			t.store.floor.late(t.firstInsert)
		}
		if t.wroteDue {
			t.store.notify()
		}
		now := time.Now()
		for _, h := range t.later {
			t.store.wakes.add(h.at(now), t.store.notify)
		}
	}
	return nil
}

// BeginTx starts a transaction on the store's database.
func (s *MySQLStore) BeginTx(ctx context.Context, opts *sql.TxOptions) (*Tx, error) {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: could not begin transaction: %w", err)
	}
	return &Tx{Tx: tx, store: s}, nil
}

// WrapTx wraps a transaction the caller already has (from database/sql or an ORM), so that
// events can be written in it. Commit it through the returned Tx, which wakes this
// process's publishers as a transaction from BeginTx does; where the caller or an ORM
// commits the *sql.Tx itself, call [MySQLStore.Notify] after the commit for the same
// effect (without it the events go at the next poll).
func (s *MySQLStore) WrapTx(tx *sql.Tx) *Tx {
	return &Tx{Tx: tx, store: s}
}

// InsertEvent writes ev as a WAIT event in the transaction, due now or when ev.Delay or
// ev.NotBefore says (by the database clock; see docs/delayed-events.md), and returns its event
// id: a new UUIDv7, the [Event.EventID] that every send of the event carries (the eventId
// property consumers deduplicate on). If the transaction rolls back, so does the event;
// once it commits, the publisher will send it. If ctx carries an OpenTelemetry span, its W3C trace
// context is stored with the event and sent with it (see [PropertyTraceParent]). An invalid
// event is refused with an error wrapping [ErrInvalidEvent] and nothing is written.
func (t *Tx) InsertEvent(ctx context.Context, ev EventInput) (eventID string, err error) {
	if _, err := t.insert(ctx, ev); err != nil {
		return "", err
	}
	return t.lastEventID, nil
}

// insert is InsertEvent, returning the row id too (the tests' and the tools' way to it).
func (t *Tx) insert(ctx context.Context, ev EventInput) (int64, error) {
	if err := t.store.validateEvent(ev); err != nil {
		return 0, err
	}
	payload := ev.Payload
	// Generated here, not by the database: MySQL's UUID() is version 1, and MariaDB has
	// UUID_v7() only from 11.7. (The column's default, UUID(), is for other writers'
	// plain INSERTs: see docs/other-writers.md.)
	eventID, err := uuid.NewV7()
	if err != nil {
		return 0, fmt.Errorf("outbox: insert event: generate the event id: %w", err)
	}
	topic := t.store.routes.resolve(ev.Topic, ev.EventType)
	traceParent, traceState := traceOf(ctx)
	if t.firstInsert.IsZero() {
		t.firstInsert = time.Now()
	}
	insert, insertInline := t.store.q.insert, t.store.q.insertInline
	if due := dueExpr(ev); due != "" {
		insert, insertInline = strings.Replace(insert, dueMarker, due, 1), strings.Replace(insertInline, dueMarker, due, 1)
	}
	var res sql.Result
	if len(payload) <= maxInlinePayload {
		res, err = t.ExecContext(ctx, fmt.Sprintf(insertInline, sqlText(eventID.String()), sqlText(ev.BizNo),
			sqlText(ev.EventType), sqlBytes(payload), sqlText(traceParent), sqlText(traceState), sqlText(topic)))
	} else {
		res, err = t.ExecContext(ctx, insert, eventID.String(), ev.BizNo, ev.EventType, payload,
			traceParent, traceState, topic)
	}
	if err != nil {
		return 0, t.store.wrap("insert event", err)
	}
	t.wrote = true
	t.wroteDue = t.wroteDue || ev.Delay == 0
	if h := (dueHint{delay: ev.Delay, notBefore: ev.NotBefore}); (h.delay > 0 || !h.notBefore.IsZero()) &&
		len(t.later) < maxDueHintsPerTx && !slices.Contains(t.later, h) {
		t.later = append(t.later, h)
	}
	t.lastEventID = eventID.String()
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("outbox: insert event: %w", err)
	}
	return id, nil
}

// Wake-ups at the due times of delayed events. A commit wakes this process's publishers for
// the events due at once; an event written with a delay is due later, and without a wake-up
// would wait for the first round after that, up to Config.PollInterval. So the commit also
// sets a wake-up at each delayed event's due time, by this process's clock: a hint, since
// the claim judges by the database's (a wake-up a little early finds nothing due, and the
// poll follows). At most maxDueWakes are pending per store, and maxDueHintsPerTx per
// transaction; what is beyond, and what other processes write, the poll finds.
const (
	maxDueWakes      = 1024
	maxDueHintsPerTx = 16
	// dueWakeMargin is added to each wake-up: the due time is rounded up to the millisecond.
	dueWakeMargin = 2 * time.Millisecond
)

// dueHint is when a delayed event falls due: delay after the commit (the insert was before
// it, so no earlier than due), or at notBefore.
type dueHint struct {
	delay     time.Duration
	notBefore time.Time
}

func (h dueHint) at(commit time.Time) time.Time {
	if h.delay > 0 {
		return commit.Add(h.delay).Add(dueWakeMargin)
	}
	return h.notBefore.Add(dueWakeMargin)
}

// dueWakes are a store's pending wake-ups, earliest first, with one timer for the earliest.
type dueWakes struct {
	mu    sync.Mutex
	times []time.Time // ascending; at most maxDueWakes
	timer *time.Timer
	armed time.Time // when the timer fires; zero when it is not set
}

// add sets a wake-up at at (process clock), which calls wake.
func (w *dueWakes) add(at time.Time, wake func()) {
	if !at.After(time.Now()) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	i, _ := slices.BinarySearchFunc(w.times, at, time.Time.Compare)
	if len(w.times) >= maxDueWakes {
		if i == len(w.times) {
			return // later than every pending one: the poll finds it
		}
		w.times = w.times[:len(w.times)-1] // the latest goes instead
	}
	w.times = slices.Insert(w.times, i, at)
	w.armLocked(wake)
}

// armLocked sets the timer for the earliest wake-up, if it is not set earlier already.
func (w *dueWakes) armLocked(wake func()) {
	if len(w.times) == 0 || (!w.armed.IsZero() && !w.times[0].Before(w.armed)) {
		return
	}
	w.armed = w.times[0]
	if w.timer == nil {
		w.timer = time.AfterFunc(time.Until(w.armed), func() { w.fire(wake) })
		return
	}
	w.timer.Reset(time.Until(w.armed))
}

// fire drops the wake-ups that are due, sets the timer for the next, and wakes.
func (w *dueWakes) fire(wake func()) {
	w.mu.Lock()
	now := time.Now()
	n := 0
	for n < len(w.times) && !w.times[n].After(now) {
		n++
	}
	w.times = slices.Delete(w.times, 0, n)
	w.armed = time.Time{}
	w.armLocked(wake)
	w.mu.Unlock()
	wake()
}

// maxInlinePayload is the largest payload InsertEvent writes in the statement's text, as
// hex: one round trip instead of two, and no statement for the server to prepare and close.
// A longer payload goes as a parameter of a prepared statement, which the driver sends in
// pieces when it is long, whatever the server's max_allowed_packet.
const maxInlinePayload = 64 << 10

// sqlText is v as a SQL string literal: hex digits with a utf8mb4 introducer, the same
// string on every server and under every sql_mode and connection character set, whatever v
// holds.
func sqlText(v string) string { return "_utf8mb4 X'" + hex.EncodeToString([]byte(v)) + "'" }

// sqlBytes is b as a SQL binary string literal.
func sqlBytes(b []byte) string { return "X'" + hex.EncodeToString(b) + "'" }

func (s *MySQLStore) validateEvent(ev EventInput) error {
	if err := eventrules.Check(ev.BizNo, ev.EventType, ev.Delay, ev.NotBefore); err != nil {
		return err
	}
	if err := s.routes.check(ev.Topic); err != nil {
		return err
	}
	return eventrules.Payload(len(ev.Payload), s.maxPayload)
}

// dueExpr is the SQL for a valid event's next_retry_time when it is not due at once, ""
// when it is. A delay is added to the database clock; a NotBefore is compared with it, so
// that a time that has passed by that clock is due now, never behind the claims' scan floor
// (see store_mysql_floor.go). Both in whole milliseconds, which a DATETIME(3) holds exactly.
// Only digits and the fixed text below: the expression is written into the statement.
func dueExpr(ev EventInput) string {
	switch {
	case ev.Delay > 0:
		ms := int64(ev.Delay / time.Millisecond)
		if ev.Delay%time.Millisecond != 0 {
			ms++
		}
		return fmt.Sprintf("DATE_ADD(UTC_TIMESTAMP(3), INTERVAL %d MICROSECOND)", ms*1000)
	case !ev.NotBefore.IsZero():
		at := eventrules.CeilMilli(ev.NotBefore.UTC())
		if at.Year() < 1970 {
			at = time.Unix(0, 0).UTC() // long past either way; keeps the literal in DATETIME's range
		}
		return "GREATEST(UTC_TIMESTAMP(3), CAST('" + at.Format("2006-01-02 15:04:05.000") + "' AS DATETIME(3)))"
	}
	return ""
}
