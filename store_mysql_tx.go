package outbox

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Tx is a database transaction in which the service writes its business rows and its events.
// It is a *sql.Tx: use it for the business statements, then Commit or Rollback it.
type Tx struct {
	*sql.Tx
	store *MySQLStore
	wrote bool
	// firstInsert is when the first InsertEvent began (process clock).
	firstInsert time.Time
	// lastEventID is the event id of the last event written.
	lastEventID string
}

// Commit commits the transaction and, if it wrote events, wakes the publishers of this
// process that use the same store, so the events are sent at once rather than at the next
// poll.
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
		t.store.notify()
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

// InsertEvent writes ev as a WAIT event due now, in the transaction, and returns its event
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
	traceParent, traceState := traceOf(ctx)
	if t.firstInsert.IsZero() {
		t.firstInsert = time.Now()
	}
	var res sql.Result
	if len(payload) <= maxInlinePayload {
		res, err = t.ExecContext(ctx, fmt.Sprintf(t.store.q.insertInline, sqlText(eventID.String()), sqlText(ev.BizNo),
			sqlText(ev.EventType), sqlBytes(payload), sqlText(traceParent), sqlText(traceState)))
	} else {
		res, err = t.ExecContext(ctx, t.store.q.insert, eventID.String(), ev.BizNo, ev.EventType, payload,
			traceParent, traceState)
	}
	if err != nil {
		return 0, t.store.wrap("insert event", err)
	}
	t.wrote = true
	t.lastEventID = eventID.String()
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("outbox: insert event: %w", err)
	}
	return id, nil
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
	if err := validateKey("BizNo", ev.BizNo); err != nil {
		return err
	}
	if err := validateKey("EventType", ev.EventType); err != nil {
		return err
	}
	switch {
	case strings.Contains(ev.EventType, "||"):
		return fmt.Errorf("%w: EventType %q contains \"||\", which separates tags in a RocketMQ subscription: no consumer could subscribe to it", ErrInvalidEvent, ev.EventType)
	case ev.EventType == "*":
		return fmt.Errorf("%w: EventType \"*\" is RocketMQ's subscription to every tag: no consumer could subscribe to it alone", ErrInvalidEvent)
	}
	if len(ev.Payload) == 0 {
		return fmt.Errorf("%w: the payload is empty: RocketMQ does not take a message without a body, so the event could never be sent", ErrInvalidEvent)
	}
	if len(ev.Payload) > s.maxPayload {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrPayloadTooLarge, len(ev.Payload), s.maxPayload)
	}
	return nil
}

// validateKey checks a biz no or event type: required, at most 64 characters, printable
// UTF-8 without spaces. They become the message's key, tag and properties: control
// characters separate the properties, RocketMQ splits a message's keys on spaces (a biz no
// "A B" would be found by a lookup of "A" and of "B", never of "A B"), and a subscription
// trims the spaces around a tag.
func validateKey(name, v string) error {
	switch {
	case v == "":
		return fmt.Errorf("%w: %s is empty", ErrInvalidEvent, name)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEvent, name)
	case utf8.RuneCountInString(v) > maxKeyLen:
		return fmt.Errorf("%w: %s is %d characters, at most %d", ErrInvalidEvent, name, utf8.RuneCountInString(v), maxKeyLen)
	case strings.IndexFunc(v, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: %s %q contains a control character", ErrInvalidEvent, name, v)
	case strings.IndexFunc(v, unicode.IsSpace) >= 0:
		return fmt.Errorf("%w: %s %q contains a space: RocketMQ splits message keys on spaces and trims them around tags", ErrInvalidEvent, name, v)
	}
	return nil
}
