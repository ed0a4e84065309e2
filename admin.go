package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/go-outbox/outbox/internal/eventrules"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// ErrInvalidInput is wrapped by every error for an administrative request that cannot be
// run as asked (an unknown status, a negative limit, an empty id range, an event id that is
// not a UUID): nothing was read or changed.
var ErrInvalidInput = errors.New("outbox: invalid input")

// ErrNotDeadLetter is wrapped by the error of [Admin.Requeue] and [Admin.Skip] for an event
// that is not a dead letter (FAIL): only those can be requeued or skipped, and nothing was
// changed.
var ErrNotDeadLetter = errors.New("outbox: the event is not a dead letter (FAIL)")

// ErrPurgeBusy is returned by [MySQLStore.Purge] with [PurgeOptions.Exclusive] when another
// session is purging the same table: this purge did nothing, and the other one does the work.
var ErrPurgeBusy = errors.New("outbox: another purge of this table is running")

// Limits of the administrative operations, as the field docs give them.
const (
	// listLimitDefault is how many rows Admin.List and Admin.Blocked return when asked for 0.
	listLimitDefault = 100
	// listLimitMax is the most rows one List or Blocked returns: a page for a person or a
	// script, never the table.
	listLimitMax = 10000
	// requeueBatchDefault is how many rows one requeue statement changes at most.
	requeueBatchDefault = 500
	// purgeBatchDefault is how many rows one purge DELETE removes at most.
	purgeBatchDefault = 500
	// purgePauseDefault is the retention's pause between two purge DELETEs.
	purgePauseDefault = 100 * time.Millisecond
	// maxAdminBatch bounds a batch: a statement with more ids holds its row locks longer
	// than a publisher's claim should wait for them.
	maxAdminBatch = 10000
)

// Admin is what a person (or a script) runs against a [MySQLStore]'s table: reading
// events, returning dead letters to WAIT, skipping them, and finding the keys they hold
// back. Its calls run short autocommit statements on the store's pool; they are safe for
// concurrent use and beside running publishers, and a call that makes events due wakes the
// publishers of this process that use the store (see [MySQLStore.Notify]). Purging and the
// table's statistics are the store's own ([MySQLStore.Purge], [MySQLStore.Stats]): a
// publisher runs them too.
//
// Everywhere here, id is the row's AUTO_INCREMENT id ([Event.ID]) and event_id the UUID
// consumers see ([Event.EventID]): the eventId they log and deduplicate on, and what
// [Tx.InsertEvent] returns. [Admin.GetByEventID] finds an event by its event_id, and its
// [Event.ID] then names it to [Admin.Requeue] and [Admin.Skip]; [Filter] selects by either.
type Admin struct {
	s *MySQLStore
}

// NewAdmin returns the operator's calls on store's table. It panics if store is nil.
func NewAdmin(store *MySQLStore) *Admin {
	if store == nil {
		panic("outbox: NewAdmin: nil store")
	}
	return &Admin{s: store}
}

// Filter selects events for [Admin.List] and [Admin.RequeueFailed]. Zero fields select
// everything; set fields are ANDed.
type Filter struct {
	// Status keeps events in this status only; "" keeps all.
	Status Status
	// IDs keeps these rows only, when not empty (at most 10000).
	IDs []int64
	// EventIDs keeps the events with these event ids only, when not empty (at most
	// 10000), as [Admin.GetByEventID] finds them: each must be a UUID.
	EventIDs []string
	// EventType and BizNo keep events with exactly this type or business key.
	EventType string
	BizNo     string
	// Topics keeps the events with one of these topics ([Event.Topic]) only, when not empty
	// (at most 10000): a row written without a topic by the topic its routes give it.
	Topics []string
	// MinID and MaxID bound the row id, both inclusive; 0 means no bound.
	MinID, MaxID int64
	// CreatedSince and CreatedUntil bound create_time (UTC, by the database clock):
	// CreatedSince inclusive, CreatedUntil exclusive. The zero time means no bound.
	CreatedSince, CreatedUntil time.Time
	// Limit is how many rows List returns at most, newest id first: 0 means 100, and it is
	// at most 10000. It also bounds how many rows a requeue changes in all when set; 0 there
	// means every matching row.
	Limit int
}

// validate reports what makes f unusable, wrapping ErrInvalidInput.
func (f Filter) validate() error {
	switch f.Status {
	case "", StatusWait, StatusSending, StatusSuccess, StatusFail, StatusSkipped:
	default:
		return fmt.Errorf("%w: unknown status %q (want WAIT, SENDING, SUCCESS, FAIL or SKIPPED)", ErrInvalidInput, string(f.Status))
	}
	if len(f.IDs) > maxAdminBatch {
		return fmt.Errorf("%w: at most %d ids at once, got %d", ErrInvalidInput, maxAdminBatch, len(f.IDs))
	}
	for _, id := range f.IDs {
		if id <= 0 {
			return fmt.Errorf("%w: ids are positive, got %d", ErrInvalidInput, id)
		}
	}
	if len(f.EventIDs) > maxAdminBatch {
		return fmt.Errorf("%w: at most %d event ids at once, got %d", ErrInvalidInput, maxAdminBatch, len(f.EventIDs))
	}
	for _, eventID := range f.EventIDs {
		if _, err := eventIDForms(eventID); err != nil {
			return err
		}
	}
	if f.MinID < 0 || f.MaxID < 0 {
		return fmt.Errorf("%w: ids are positive, got range %d..%d", ErrInvalidInput, f.MinID, f.MaxID)
	}
	if f.MaxID != 0 && f.MinID > f.MaxID {
		return fmt.Errorf("%w: id range %d..%d is empty", ErrInvalidInput, f.MinID, f.MaxID)
	}
	if !f.CreatedSince.IsZero() && !f.CreatedUntil.IsZero() && !f.CreatedSince.Before(f.CreatedUntil) {
		return fmt.Errorf("%w: created-since %s is not before created-until %s", ErrInvalidInput,
			f.CreatedSince.UTC().Format(time.RFC3339), f.CreatedUntil.UTC().Format(time.RFC3339))
	}
	if f.Limit < 0 || f.Limit > listLimitMax {
		return fmt.Errorf("%w: limit must be between 0 and %d, got %d", ErrInvalidInput, listLimitMax, f.Limit)
	}
	if len(f.Topics) > maxAdminBatch {
		return fmt.Errorf("%w: at most %d topics at once, got %d", ErrInvalidInput, maxAdminBatch, len(f.Topics))
	}
	for _, topic := range f.Topics {
		if !eventrules.TopicRE.MatchString(topic) {
			return fmt.Errorf("%w: topic %.140q is not a topic name (1 to 127 letters, digits, '_', '-', '%%' or '|')", ErrInvalidInput, topic)
		}
	}
	if len(f.EventType) > 4*maxKeyLen || len(f.BizNo) > 4*maxKeyLen {
		return fmt.Errorf("%w: event type and biz no are at most %d characters", ErrInvalidInput, maxKeyLen)
	}
	return nil
}

// ListedEvent is an event as [Admin.List] returns it: every column but the payload, whose
// length PayloadSize gives.
type ListedEvent struct {
	Event
	PayloadSize int
}

// RequeueOptions tunes [Admin.RequeueFailed].
type RequeueOptions struct {
	// BatchRows is how many rows one statement changes at most: 0 means 500, and it is at
	// most 10000.
	BatchRows int
	// DryRun only counts the FAIL events the filter selects (at most Filter.Limit, when
	// set) and changes nothing: what the same call without DryRun would requeue now, for a
	// person to confirm first. OnBatch is not called.
	DryRun bool
	// OnBatch, if set, is called after each statement with the ids it was given and how
	// many of them it returned to WAIT (fewer when a row stopped being FAIL meanwhile),
	// e.g. to log it.
	OnBatch func(ids []int64, requeued int64)
	// Topic, if set, sends the requeued events to this topic, one of the store's, in place
	// of the ones on their rows (see [Admin.RequeueTo]); a topic outside the store's set is
	// refused with an error wrapping [ErrInvalidInput]. Not for [Admin.SkipFailed].
	Topic string
}

// PurgeOptions tunes [MySQLStore.Purge]. A purge deletes in small batches with a pause
// between them so that it never holds many row locks, never fills the redo log in one
// statement, and leaves replicas and the publishers' claims room between its statements.
type PurgeOptions struct {
	// BatchRows is how many rows one DELETE removes at most: 0 means 500, and it is at most
	// 10000.
	BatchRows int
	// Pause is the wait between two DELETEs; zero waits none. The publisher's retention
	// waits [Tuning.RetentionPause], 100 ms by default, and outboxctl purge as long.
	Pause time.Duration
	// Limit stops the purge once it has deleted this many rows; 0 means no limit.
	Limit int64
	// Exclusive makes the purge hold a named lock (GET_LOCK, one per database and table)
	// while it runs, and return [ErrPurgeBusy] at once if another session holds it, so that
	// several instances purging on a timer never purge side by side.
	Exclusive bool
	// DryRun only counts the rows the purge would delete now (at most Limit, when set),
	// through the same index, and deletes nothing: for a person to confirm first. It takes
	// no lock (Exclusive does not apply) and calls no OnBatch. On a partitioned table it
	// counts the rows in the catch-all partition that the real purge would first move into
	// partitions ahead and then remove, without moving them.
	DryRun bool
	// OnBatch, if set, is called after each DELETE with the rows it removed.
	OnBatch func(deleted int64)
}

func (o PurgeOptions) withDefaults() (PurgeOptions, error) {
	o.BatchRows = cmp.Or(o.BatchRows, purgeBatchDefault)
	if o.BatchRows < 0 || o.BatchRows > maxAdminBatch {
		return o, fmt.Errorf("%w: purge batch must be between 1 and %d rows, got %d", ErrInvalidInput, maxAdminBatch, o.BatchRows)
	}
	if o.Pause < 0 {
		return o, fmt.Errorf("%w: purge pause must not be negative, got %s", ErrInvalidInput, o.Pause)
	}
	if o.Limit < 0 {
		return o, fmt.Errorf("%w: purge limit must be positive, got %d", ErrInvalidInput, o.Limit)
	}
	return o, nil
}

// noLease reports schema.sql's "nobody holds it": 1970-01-01 00:00:00, read in whatever
// location the driver reads times in.
func noLease(t time.Time) bool {
	y, m, d := t.Date()
	h, mi, sec := t.Clock()
	return y == 1970 && m == time.January && d == 1 && h == 0 && mi == 0 && sec == 0 && t.Nanosecond() == 0
}

// Get returns the event whose row id is id, payload and all, or an error wrapping
// [ErrNotFound].
func (a *Admin) Get(ctx context.Context, id int64) (Event, error) { return a.s.get(ctx, id) }

// get reads the row with the given id whole.
func (s *MySQLStore) get(ctx context.Context, id int64) (Event, error) {
	var (
		ev                 Event
		owner, lastErr     sql.NullString
		failures           sql.NullString
		status             string
		payload            []byte
		nextRetry, claimed time.Time
	)
	err := s.db.QueryRowContext(ctx, s.q.get, id).Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &payload, &status,
		&ev.RetryCount, &ev.ReclaimCount, dbTime{&nextRetry}, &owner, dbTime{&claimed}, &lastErr,
		dbTime{&ev.CreateTime}, dbTime{&ev.UpdateTime}, &ev.TraceParent, &ev.TraceState, &ev.Topic, &failures)
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
	ev.ClaimOwner, ev.LastError, ev.Failures = owner.String, lastErr.String, parseFailures(failures.String)
	ev.Topic = s.routes.resolve(ev.Topic, ev.EventType)
	return ev, nil
}

// GetByEventID returns the event whose event id is eventID ([Event.EventID], the eventId
// consumers see), payload and all, found through the table's index on event_id (uk_event_id,
// or idx_event_id on a partitioned table). eventID is a UUID of any version, as
// [Tx.InsertEvent] returns it or a plain SQL INSERT's UUID() default writes it; it is matched
// in the canonical lower-case form those write, in upper case, and as given. An event id no
// row has is an error wrapping [ErrNotFound]; an empty or malformed one, or one that two rows
// share (possible only on a partitioned table, whose index on event_id is not unique), an
// error wrapping [ErrInvalidInput]. Nothing is changed. To requeue or skip the event, pass
// its ID to [Admin.Requeue] or [Admin.Skip]: a row's id never changes, and those calls check
// its status themselves.
func (a *Admin) GetByEventID(ctx context.Context, eventID string) (Event, error) {
	id, err := a.s.idOfEventID(ctx, eventID)
	if err != nil {
		return Event{}, err
	}
	return a.s.get(ctx, id)
}

// eventIDForms checks that s is an event id (a UUID) and returns the texts a row may hold
// it as: the canonical lower-case form (what InsertEvent and MySQL's UUID() write), upper
// case, and s itself when it has the column's 36 characters (a plain INSERT may write any
// case). The column is ascii_bin, so each is an exact match on its index.
func eventIDForms(s string) ([]any, error) {
	if s == "" {
		return nil, fmt.Errorf("%w: the event id is empty (want a UUID, e.g. 0190b1d2-7c4e-7a3b-9f00-1c2d3e4f5a6b)", ErrInvalidInput)
	}
	u, err := uuid.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: event id %.60q is not a UUID (want e.g. 0190b1d2-7c4e-7a3b-9f00-1c2d3e4f5a6b)", ErrInvalidInput, s)
	}
	canon := u.String()
	forms := []any{canon, strings.ToUpper(canon)}
	if len(s) == len(canon) && s != canon && s != strings.ToUpper(canon) {
		forms = append(forms, s)
	}
	return forms, nil
}

// eventIDQuery is the lookup of an event id's row: an equality range on the index on
// event_id for each form (see eventIDForms), at most two rows (enough to tell a shared id).
// No ORDER BY: on a small table the server would rather read the primary key in order.
// No index hint either: the index is uk_event_id or idx_event_id, as the table is
// partitioned or not, and a store (outboxctl's) need not be told which.
func (s *MySQLStore) eventIDQuery(forms int) string {
	return "SELECT id FROM `" + s.table + "` WHERE event_id IN (" + placeholders(forms) + ") LIMIT 2"
}

// idOfEventID returns the row id of the event whose event id is eventID.
func (s *MySQLStore) idOfEventID(ctx context.Context, eventID string) (int64, error) {
	forms, err := eventIDForms(eventID)
	if err != nil {
		return 0, err
	}
	ids, err := s.selectIDs(ctx, "look up event id", s.eventIDQuery(len(forms)), forms...)
	switch {
	case err != nil:
		return 0, err
	case len(ids) == 0:
		return 0, fmt.Errorf("%w: event id %s", ErrNotFound, eventID)
	case len(ids) > 1:
		slices.Sort(ids)
		return 0, fmt.Errorf("%w: event id %s is held by more than one row (ids %d and %d, at least): name the event by its id",
			ErrInvalidInput, eventID, ids[0], ids[1])
	}
	return ids[0], nil
}

// placeholders writes n SQL parameters: ?, ?, ...
func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

// Requeue returns a dead-lettered (FAIL) event to WAIT, for a person who has fixed the
// cause and wants it sent again: retry and reclaim counts reset, due now, claim columns
// cleared, and this process's publishers woken. Only a FAIL event changes: an event in any
// other status is refused with an error wrapping [ErrNotDeadLetter], a missing id with
// [ErrNotFound], and nothing changes.
func (a *Admin) Requeue(ctx context.Context, id int64) error {
	return a.RequeueTo(ctx, id, "")
}

// RequeueTo is [Admin.Requeue] that also sends the event to topic, one of the store's
// ([MySQLConfig.Routes]) in place of the one on its row: for a dead letter whose topic was
// wrong (a typo in a plain INSERT, a topic the broker refused). It keeps its id, so in key
// order it stays where it was among its biz no's events: their head, sent before those
// behind it. "" keeps the row's topic. A topic outside the store's set is refused with an
// error wrapping [ErrInvalidInput] that names the set, and nothing changes.
func (a *Admin) RequeueTo(ctx context.Context, id int64, topic string) error {
	if err := a.s.requeueTopic(topic); err != nil {
		return err
	}
	if err := a.deadLetterOnly(ctx, "requeue", a.s.q.requeue, id, topic); err != nil {
		return err
	}
	a.s.Notify()
	return nil
}

// requeueTopic refuses a topic a requeue may not send to: one outside the store's set.
func (s *MySQLStore) requeueTopic(topic string) error {
	if topic != "" && !s.routes.known[topic] {
		return fmt.Errorf("%w: topic %.140q is not one of the store's topics (%s)", ErrInvalidInput, topic, strings.Join(s.routes.set, ", "))
	}
	return nil
}

// deadLetterOnly runs query, an UPDATE of the row id guarded by status = 'FAIL', and when it
// changes nothing tells why: the row is missing ([ErrNotFound]) or not FAIL
// ([ErrNotDeadLetter]). The guard is the statement's, so a row that is not FAIL is never
// changed, whatever happens between the statement and the read; a row that became FAIL in
// between (a publisher dead-lettered it) is tried again.
func (a *Admin) deadLetterOnly(ctx context.Context, op, query string, id int64, before ...any) error {
	if id <= 0 {
		return fmt.Errorf("%w: ids are positive, got %d", ErrInvalidInput, id)
	}
	for range 3 {
		changed, err := a.s.execOne(ctx, op, query, append(before, id)...)
		if err != nil || changed {
			return err
		}
		ev, err := a.s.get(ctx, id)
		if err != nil {
			return err
		}
		if ev.Status != StatusFail {
			return fmt.Errorf("%w: id %d is %s", ErrNotDeadLetter, id, ev.Status)
		}
	}
	return fmt.Errorf("%w: id %d keeps changing status (FAIL when read, not when changed); nothing changed", ErrNotDeadLetter, id)
}

// adminColumns are the columns List reads: every column but the payload, and its length.
const adminColumns = `id, event_id, biz_no, event_type, OCTET_LENGTH(payload), status, retry_count, reclaim_count,
	next_retry_time, claim_owner, claimed_at, last_error, create_time, update_time, topic, failures`

// where writes f as an SQL condition (never empty) and its arguments.
func (f Filter) where(s *MySQLStore) (string, []any) {
	var (
		conds []string
		args  []any
	)
	if f.Status != "" {
		conds, args = append(conds, "status = ?"), append(args, string(f.Status))
	}
	if len(f.IDs) > 0 {
		conds = append(conds, "id IN ("+idList(f.IDs)+")")
	}
	if len(f.EventIDs) > 0 {
		var forms []any
		for _, eventID := range f.EventIDs {
			fs, _ := eventIDForms(eventID) // validated
			forms = append(forms, fs...)
		}
		conds, args = append(conds, "event_id IN ("+placeholders(len(forms))+")"), append(args, forms...)
	}
	if f.EventType != "" {
		conds, args = append(conds, "event_type = ?"), append(args, f.EventType)
	}
	if f.BizNo != "" {
		conds, args = append(conds, "biz_no = ?"), append(args, f.BizNo)
	}
	if len(f.Topics) > 0 {
		// A row a plain INSERT wrote without a topic goes where the routes say: its claim
		// writes that topic on it, and until then the filter resolves it alike.
		conds, args = append(conds, s.q.routeTopic+" IN ("+placeholders(len(f.Topics))+")"), append(args, s.routeArgs...)
		for _, topic := range f.Topics {
			args = append(args, topic)
		}
	}
	if f.MinID > 0 {
		conds, args = append(conds, "id >= ?"), append(args, f.MinID)
	}
	if f.MaxID > 0 {
		conds, args = append(conds, "id <= ?"), append(args, f.MaxID)
	}
	// Times as UTC text: the column holds UTC, whatever loc the DSN gives the driver.
	if !f.CreatedSince.IsZero() {
		conds, args = append(conds, "create_time >= ?"), append(args, sqlTime(f.CreatedSince))
	}
	if !f.CreatedUntil.IsZero() {
		conds, args = append(conds, "create_time < ?"), append(args, sqlTime(f.CreatedUntil))
	}
	if len(conds) == 0 {
		return "1 = 1", nil
	}
	return strings.Join(conds, " AND "), args
}

func sqlTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") }

// List returns the events f selects, newest id first, at most f.Limit of them (100 when
// 0). Payload is left empty (PayloadSize says how long it is): a listing is for finding
// rows; [Admin.Get] reads one whole. A filter that cannot be run (an unknown status, an
// empty id range) is an error wrapping [ErrInvalidInput].
func (a *Admin) List(ctx context.Context, f Filter) ([]ListedEvent, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	s := a.s
	cond, args := f.where(s)
	q := "SELECT " + adminColumns + " FROM " + mysqldialect.Quote(s.table) + " WHERE " + cond + " ORDER BY id DESC LIMIT ?"
	rows, err := s.db.QueryContext(ctx, q, append(args, cmp.Or(f.Limit, listLimitDefault))...)
	if err != nil {
		return nil, s.wrap("list events", err)
	}
	defer rows.Close()
	var out []ListedEvent
	for rows.Next() {
		var le ListedEvent
		if err := scanListed(rows, s.routes, &le); err != nil {
			return nil, s.wrap("list events", err)
		}
		out = append(out, le)
	}
	return out, s.wrap("list events", rows.Err())
}

// scanListed reads a row of adminColumns into le, then the row's further columns into
// extra.
func scanListed(rows *sql.Rows, routes routing, le *ListedEvent, extra ...any) error {
	var (
		lastErr, failures  sql.NullString
		status             string
		nextRetry, claimed time.Time
	)
	dest := []any{&le.ID, &le.EventID, &le.BizNo, &le.EventType, &le.PayloadSize, &status,
		&le.RetryCount, &le.ReclaimCount, dbTime{&nextRetry}, &le.ClaimOwner, dbTime{&claimed}, &lastErr,
		dbTime{&le.CreateTime}, dbTime{&le.UpdateTime}, &le.Topic, &failures}
	if err := rows.Scan(append(dest, extra...)...); err != nil {
		return err
	}
	le.Topic = routes.resolve(le.Topic, le.EventType)
	if noLease(claimed) {
		claimed = time.Time{}
	}
	le.Status, le.NextRetryTime, le.ClaimedAt, le.LastError = Status(status), nextRetry, claimed, lastErr.String
	le.Failures = parseFailures(failures.String)
	return nil
}

// countFailed reports how many FAIL events f (already through failedOnly) selects, at most
// f.Limit when set.
func (s *MySQLStore) countFailed(ctx context.Context, f Filter) (int64, error) {
	cond, args := f.where(s)
	var n int64
	err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+mysqldialect.Quote(s.table)+" WHERE "+cond, args...).Scan(&n)
	if err != nil {
		return 0, s.wrap("count dead letters", err)
	}
	if f.Limit > 0 {
		n = min(n, int64(f.Limit))
	}
	return n, nil
}

func failedOnly(f Filter) (Filter, error) {
	if f.Status != "" && f.Status != StatusFail {
		return f, fmt.Errorf("%w: only FAIL events are requeued, not %s", ErrInvalidInput, f.Status)
	}
	f.Status = StatusFail
	return f, f.validate()
}

// RequeueFailed returns every FAIL event f selects to WAIT, as [Admin.Requeue] does one:
// retry and reclaim counts reset, due now, claim columns cleared. It changes at most
// opts.BatchRows rows per statement, in id order, and each statement changes its batch
// whole or not at all; opts.OnBatch hears of each, and each batch that changed rows wakes
// this process's publishers. Rows that are not FAIL are never touched, whatever f says
// (f.Status must be "" or FAIL). It reports how many events it requeued, or with
// opts.DryRun how many it would requeue, changing nothing. A filter or batch size that
// cannot be run is an error wrapping [ErrInvalidInput], DryRun or not.
func (a *Admin) RequeueFailed(ctx context.Context, f Filter, opts RequeueOptions) (int64, error) {
	if err := a.s.requeueTopic(opts.Topic); err != nil {
		return 0, err
	}
	return a.changeFailed(ctx, "requeue dead letters", a.s.q.requeueIDs, f, opts, opts.Topic)
}

// SkipFailed marks every FAIL event f selects SKIPPED, as [Admin.Skip] does one: never to be
// sent, and done for per-key ordering, so the events of their biz nos behind them go on. It
// runs as [Admin.RequeueFailed] does, in batches of opts.BatchRows in id order, each batch
// whole or not at all, opts.OnBatch told of each, the publishers woken; with opts.DryRun it
// only counts. Rows that are not FAIL are never touched (f.Status must be "" or FAIL). A
// table whose status column does not allow SKIPPED yet is refused with the ALTER TABLE to
// run, DryRun or not.
func (a *Admin) SkipFailed(ctx context.Context, f Filter, opts RequeueOptions) (int64, error) {
	if err := a.s.checkSkipped(ctx); err != nil {
		return 0, err
	}
	if opts.Topic != "" {
		return 0, fmt.Errorf("%w: a skip sends nothing: RequeueOptions.Topic is for a requeue", ErrInvalidInput)
	}
	return a.changeFailed(ctx, "skip dead letters", a.s.oq.skipIDs, f, opts)
}

// changeFailed runs stmt (an UPDATE of the ids in its %s, guarded by status = 'FAIL') over
// the FAIL events f selects, batch by batch: RequeueFailed and SkipFailed.
func (a *Admin) changeFailed(ctx context.Context, op, stmt string, f Filter, opts RequeueOptions, before ...any) (int64, error) {
	f, err := failedOnly(f)
	if err != nil {
		return 0, err
	}
	batch := cmp.Or(opts.BatchRows, requeueBatchDefault)
	if batch < 0 || batch > maxAdminBatch {
		return 0, fmt.Errorf("%w: batch must be between 1 and %d rows, got %d", ErrInvalidInput, maxAdminBatch, batch)
	}
	s := a.s
	if opts.DryRun {
		return s.countFailed(ctx, f)
	}
	cond, args := f.where(s)
	sel := "SELECT id FROM " + mysqldialect.Quote(s.table) + " WHERE " + cond + " AND id > ? ORDER BY id LIMIT ?"
	var total int64
	var after int64
	for f.Limit == 0 || total < int64(f.Limit) {
		n := batch
		if f.Limit > 0 {
			n = min(n, f.Limit-int(total))
		}
		ids, err := s.selectIDs(ctx, op, sel, append(append([]any{}, args...), after, n)...)
		if err != nil || len(ids) == 0 {
			return total, err
		}
		after = ids[len(ids)-1]
		changed, err := s.exec(ctx, op, fmt.Sprintf(stmt, idList(ids)), before...)
		if err != nil {
			return total, err
		}
		total += changed
		if changed > 0 {
			s.Notify()
		}
		if opts.OnBatch != nil {
			opts.OnBatch(ids, changed)
		}
		if len(ids) < n {
			break
		}
	}
	return total, nil
}

// Skip marks a dead letter (FAIL) SKIPPED: a person decided it is never to be sent. SKIPPED
// is final and counts as done for ordering, so under [KeyOrder] the events of its biz no
// behind it go on, and this process's publishers are woken; [Admin.Requeue] is the other way
// to unblock a key (the event is sent after all). Only a FAIL event changes: an event in any
// other status is refused with an error wrapping [ErrNotDeadLetter], a missing id with
// [ErrNotFound]. A table whose status column does not allow SKIPPED yet is refused with the
// ALTER TABLE to run.
func (a *Admin) Skip(ctx context.Context, id int64) error {
	if id <= 0 {
		return fmt.Errorf("%w: ids are positive, got %d", ErrInvalidInput, id)
	}
	s := a.s
	if err := s.checkSkipped(ctx); err != nil {
		return err
	}
	if err := a.deadLetterOnly(ctx, "skip", s.oq.skip, id); err != nil {
		return err
	}
	s.Notify()
	return nil
}

// BlockedKey is a dead letter with events of its biz no waiting behind it, as
// [Admin.Blocked] lists it. Under [KeyOrder] those events are held back until a person
// requeues or skips the dead letter.
type BlockedKey struct {
	// ListedEvent is the dead letter (FAIL), without its payload.
	ListedEvent
	// Waiting is how many WAIT events of its biz no have a larger id.
	Waiting int64
}

// Blocked lists dead letters (FAIL) that have WAIT events of the same biz no after them,
// oldest id first, with how many wait behind each: under [KeyOrder], the keys that stand
// still until a person requeues ([Admin.Requeue]) or skips ([Admin.Skip]) their dead
// letter. It pages by the dead letter's id: the ones with an id above after, at most limit
// of them (0 means 100, at most 10000); the next page starts after the last id returned.
// It reads every FAIL row and, for each, on an ordered table, one range of
// idx_biz_no_status that holds only the key's WAIT events, never a SUCCESS row; on an
// unordered table (idx_biz_no) it reads every event of each dead letter's biz no.
func (a *Admin) Blocked(ctx context.Context, after int64, limit int) ([]BlockedKey, error) {
	if limit < 0 || limit > listLimitMax {
		return nil, fmt.Errorf("%w: limit must be between 0 and %d, got %d", ErrInvalidInput, listLimitMax, limit)
	}
	if after < 0 {
		return nil, fmt.Errorf("%w: after is an id (0 for the first page), got %d", ErrInvalidInput, after)
	}
	s := a.s
	rows, err := s.db.QueryContext(ctx, s.oq.blocked, after, cmp.Or(limit, listLimitDefault))
	if err != nil {
		return nil, s.wrap("list blocked keys", err)
	}
	defer rows.Close()
	var out []BlockedKey
	for rows.Next() {
		var b BlockedKey
		if err := scanListed(rows, s.routes, &b.ListedEvent, &b.Waiting); err != nil {
			return nil, s.wrap("list blocked keys", err)
		}
		out = append(out, b)
	}
	return out, s.wrap("list blocked keys", rows.Err())
}
