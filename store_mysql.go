package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
)

//go:embed schema.sql
var schemaSQL string

const (
	// TableDefault is the outbox table's name unless [MySQLConfig.Table] says otherwise.
	TableDefault = "t_event_record"
	// MaxPayloadBytesDefault is RocketMQ's default message size limit.
	MaxPayloadBytesDefault = 4 << 20
	// maxPayloadColumn is what a MEDIUMBLOB holds.
	maxPayloadColumn = 1<<24 - 1
	maxKeyLen        = 64   // biz_no and event_type
	maxReasonLen     = 1024 // last_error, in characters
	reclaimPage      = 500  // rows per reclaim statement
	maxLockAttempts  = 5    // tries of one statement that hits a deadlock or lock wait timeout
)

// claimTurnWait is how long a batch claim waits for its turn before it goes ahead anyway.
// Whole seconds: GET_LOCK's unit on every server version.
const claimTurnWait = time.Second

// turnPause is how long a store's claims go without turns after one waited claimTurnWait in
// vain: if a session holds the lock and never lets go (a half-open connection the server
// has not noticed yet), one claim in turnPause pays the wait, not every claim.
const turnPause = 10 * time.Second

// releaseTimeout bounds the release of the claim turn, which runs even when the claim's own
// context is done.
const releaseTimeout = 5 * time.Second

var tableNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// MySQLConfig configures a [MySQLStore].
type MySQLConfig struct {
	// Table is the outbox table's name: letters, digits and underscores, at most 64.
	// Defaults to "t_event_record".
	Table string

	// MaxPayloadBytes is the largest payload InsertEvent accepts, at most 16 MiB - 1 (what the
	// payload column holds). Defaults to 4 MiB, RocketMQ's default message size limit.
	MaxPayloadBytes int

	// ConcurrentClaims lets the batch claims of all instances scan the table at the same
	// time, relying on SKIP LOCKED alone. By default they take turns: each holds a named lock
	// (GET_LOCK, one per database and table) while its SELECT ... FOR UPDATE SKIP LOCKED
	// runs, and releases it before it updates the rows, sends and acknowledges. Concurrent
	// scans all start at the head of the index and walk past the rows the others have
	// locked, so the more instances there are, the more work each claim wastes; taking turns
	// keeps the throughput of many instances at that of a few (see the README's figures).
	//
	// The lock orders claims; it does not protect anything. A claim that waits more than a
	// second, or whose GET_LOCK fails or is refused, goes ahead without it (and the store's
	// claims skip the turns for the next ten seconds), and every claim stays correct with
	// or without it. Set ConcurrentClaims where GET_LOCK is unavailable, e.g. behind a
	// proxy that forbids it: such a claim would close its connection every ten seconds.
	// The per-row claim mode ([ClaimPerRow]) never takes the lock.
	ConcurrentClaims bool
}

// MySQLStore is the [Store] for MySQL 8 and MariaDB. It also writes events inside the
// caller's transactions ([MySQLStore.BeginTx], [MySQLStore.WrapTx]) and gives people the
// tools to look at and requeue them.
//
// The *sql.DB should be opened with parseTime=true and loc=UTC (the driver's default loc),
// though the store reads time columns either way.
type MySQLStore struct {
	db               *sql.DB
	table            string
	maxPayload       int
	concurrentClaims bool
	claimTurnWait    time.Duration
	q                mysqlQueries

	// Claims go without turns until turnsPausedUntil, a time since born (monotonic).
	born             time.Time
	turnsPausedUntil atomic.Int64

	// suspectsAhead: the last claim met a reclaimed row, so the next locks only a few rows.
	suspectsAhead atomic.Bool

	lockRetries atomic.Int64

	subsMu sync.Mutex
	subs   map[chan struct{}]struct{}
}

// mysqlQueries holds every statement with the configured table name in place.
type mysqlQueries struct {
	schema, insert, candidates, claim, markSuccess, release, markFail, get, requeue string
	lockDue, claimLocked, payloads, markSuccessBatch, takeClaimTurn, endClaimTurn   string
	expired, reclaim, reclaimFail, owned, releaseOwned                              string
}

// NewMySQLStore returns a store for the outbox table in db. It does not create the table;
// see [MySQLStore.CreateSchema].
func NewMySQLStore(db *sql.DB, cfg MySQLConfig) (*MySQLStore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	table := cmp.Or(cfg.Table, TableDefault)
	if !tableNameRE.MatchString(table) {
		return nil, fmt.Errorf("%w: table name %q must be letters, digits and underscores, at most 64, not starting with a digit",
			ErrInvalidConfig, table)
	}
	maxPayload := cmp.Or(cfg.MaxPayloadBytes, MaxPayloadBytesDefault)
	if maxPayload < 0 || maxPayload > maxPayloadColumn {
		return nil, fmt.Errorf("%w: MaxPayloadBytes must be between 1 and %d (the payload column's size), got %d",
			ErrInvalidConfig, maxPayloadColumn, cfg.MaxPayloadBytes)
	}
	return &MySQLStore{db: db, table: table, maxPayload: maxPayload, concurrentClaims: cfg.ConcurrentClaims,
		claimTurnWait: claimTurnWait, q: newMySQLQueries(table), born: time.Now()}, nil
}

// The statements, written against t_event_record and renamed to the configured table.
//
// Every time is UTC_TIMESTAMP(3): the database's clock, the same for every session whatever
// its time_zone. (NOW() returns session-local time, so two instances whose connections have
// different time zones would disagree about every lease by hours.)
func newMySQLQueries(table string) mysqlQueries {
	r := strings.NewReplacer("t_event_record", "`"+table+"`")
	return mysqlQueries{
		schema: r.Replace(schemaSQL),

		insert: r.Replace(`INSERT INTO t_event_record
	(event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, create_time, update_time)
	VALUES (?, ?, ?, ?, 'WAIT', 0, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))`),

		// Candidates only: no lock, no ownership. Several instances seeing the same row is
		// expected. Served by idx_status_next_retry.
		candidates: r.Replace(`SELECT id, event_id, biz_no, event_type, payload, retry_count, next_retry_time, create_time,
	       reclaim_count, OCTET_LENGTH(payload)
	FROM t_event_record
	WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)
	ORDER BY next_retry_time ASC LIMIT ?`),

		// The claim. status = 'WAIT' is the gate: InnoDB serialises concurrent UPDATEs of the
		// row, and once the first commits the others match nothing and affect 0 rows.
		// retry_count = ? and next_retry_time <= now go beyond the article's claim: without
		// them, a candidate read before another instance failed it and pushed it back (WAIT
		// again, retry later) would be claimed early, with a stale retry count.
		claim: r.Replace(`UPDATE t_event_record
	SET status = 'SENDING', claim_owner = ?, claimed_at = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'WAIT' AND retry_count = ? AND next_retry_time <= UTC_TIMESTAMP(3)`),

		// The batch claim, in one short transaction: lock up to n due WAIT rows, skipping rows
		// another instance has locked (so instances never wait on each other), then claim
		// exactly those rows. Served by idx_status_next_retry.
		//
		// A payload longer than the first %d bytes is left out (NULL) and read by the payloads
		// query once the claim has chosen its rows, so that a claim never holds more than about
		// limit times that plus maxBytes in memory, however large the payloads are.
		lockDue: r.Replace(`SELECT id, event_id, biz_no, event_type, IF(OCTET_LENGTH(payload) <= %d, payload, NULL),
	       retry_count, next_retry_time, create_time, reclaim_count, OCTET_LENGTH(payload)
	FROM t_event_record
	WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)
	ORDER BY next_retry_time ASC LIMIT %d
	FOR UPDATE SKIP LOCKED`),
		payloads: r.Replace(`SELECT id, payload FROM t_event_record WHERE id IN (%s)`),
		// The claim turn (see MySQLConfig.ConcurrentClaims): a named lock per database and
		// table. Lock names are server-wide and at most 64 characters, hence the hash.
		takeClaimTurn: "SELECT GET_LOCK(" + claimLockName(table) + ", %d)",
		endClaimTurn:  fmt.Sprintf("DO RELEASE_LOCK(%s)", claimLockName(table)),
		claimLocked: r.Replace(`UPDATE t_event_record
	SET status = 'SENDING', claim_owner = ?, claimed_at = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'WAIT'`),

		// Success for a whole batch, only for the rows whose lease is still ours.
		markSuccessBatch: r.Replace(`UPDATE t_event_record
	SET status = 'SUCCESS', update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claim_owner = ?`),

		// Success, only under our own lease: a late acknowledgement from an instance whose
		// lease was reclaimed (and re-sent by another) affects 0 rows and cannot overwrite
		// the true state.
		markSuccess: r.Replace(`UPDATE t_event_record
	SET status = 'SUCCESS', update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'SENDING' AND claim_owner = ?`),

		// Failure: release only our own lease, back to WAIT with a later retry time. Without
		// claim_owner, A could push back into the queue an event B is sending right now.
		release: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', claim_owner = '', claimed_at = '1970-01-01', retry_count = ?,
	    next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND),
	    last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'SENDING' AND claim_owner = ?`),

		// Past the retry limit: dead letter, under our own lease; automatic sending stops.
		markFail: r.Replace(`UPDATE t_event_record
	SET status = 'FAIL', retry_count = ?, last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'SENDING' AND claim_owner = ?`),

		// Reclaim zombies, judged by claimed_at, never next_retry_time: a row just claimed
		// and being sent has an old next_retry_time, and reclaiming it would send it twice.
		//
		// In two steps: a lock-free SELECT of expired ids (served by idx_status_claimed_at),
		// then an UPDATE of those ids by primary key that checks the same condition again. A
		// single range UPDATE takes next-key locks on idx_status_claimed_at, and under load
		// those deadlock with the claims and acks that move rows in and out of that range.
		expired: r.Replace(`SELECT id, reclaim_count FROM t_event_record
	WHERE status = 'SENDING' AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)
	LIMIT ?`),
		reclaim: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', claim_owner = '', claimed_at = '1970-01-01', reclaim_count = reclaim_count + 1,
	    update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)`),
		// A reclaim past MaxReclaims: a poison event, dead-lettered under the same condition.
		reclaimFail: r.Replace(`UPDATE t_event_record
	SET status = 'FAIL', reclaim_count = reclaim_count + 1, last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)`),

		// The rows an instance still holds when it has nothing in flight: after a claim whose
		// COMMIT outcome is unknown, and when it stops. A lock-free SELECT (served by
		// idx_status_claimed_at: SENDING rows are few) and an UPDATE by primary key that
		// checks the owner again, as the reclaim does. Only the owner's own rows: another
		// instance's are never touched before their lease ends.
		owned: r.Replace(`SELECT id FROM t_event_record WHERE status = 'SENDING' AND claim_owner = ? LIMIT ?`),
		releaseOwned: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', claim_owner = '', claimed_at = '1970-01-01', next_retry_time = UTC_TIMESTAMP(3),
	    last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claim_owner = ?`),

		get: r.Replace(`SELECT id, event_id, biz_no, event_type, payload, status, retry_count, reclaim_count, next_retry_time,
	       claim_owner, claimed_at, last_error, create_time, update_time
	FROM t_event_record WHERE id = ?`),

		// A person's re-send of a dead letter: a fresh start, due now.
		requeue: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', retry_count = 0, reclaim_count = 0, next_retry_time = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'FAIL'`),
	}
}

// Table is the outbox table's name.
func (s *MySQLStore) Table() string { return s.table }

// CreateSchema creates the outbox table and its indexes (schema.sql) if the table is missing.
// A table that exists is left as it is, but one made before event ids (without the event_id
// column) is reported, so that a service finds out at startup rather than in its first
// business transaction.
func (s *MySQLStore) CreateSchema(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.q.schema); err != nil {
		return fmt.Errorf("outbox: could not create table %s: %w", s.table, err)
	}
	var missing []string
	for _, col := range newerColumns {
		var n int
		if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.columns
	WHERE table_schema = DATABASE() AND table_name = ? AND column_name = ?`, s.table, col).Scan(&n); err != nil {
			return fmt.Errorf("outbox: could not check table %s: %w", s.table, err)
		}
		if n == 0 {
			missing = append(missing, col)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("outbox: table %s has no %s column: %s", s.table, strings.Join(missing, " or "), upgradeHint)
	}
	return nil
}

// newerColumns are the columns a table created by an earlier version of this package lacks.
var newerColumns = []string{"event_id", "reclaim_count"}

// upgradeHint explains a table made by an earlier version.
const upgradeHint = "it was created by an earlier version of this package " +
	"(add the columns as the README's \"Upgrading\" section says, or drop the table if its events are all sent)"

// Tx is a database transaction in which the service writes its business rows and its events.
// It is a *sql.Tx: use it for the business statements, then Commit or Rollback it.
type Tx struct {
	*sql.Tx
	store *MySQLStore
	wrote bool
}

// Commit commits the transaction and, if it wrote events, wakes the publishers of this
// process that use the same store, so the events are sent at once rather than at the next
// poll.
func (t *Tx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	if t.wrote {
		t.store.Notify()
	}
	return nil
}

// Subscribe returns a channel that receives a signal (coalesced: at most one waits) whenever
// events committed through this store may be due, and a function that ends the subscription.
// [Publisher.Run] subscribes when its store offers this.
func (s *MySQLStore) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.subsMu.Lock()
	if s.subs == nil {
		s.subs = map[chan struct{}]struct{}{}
	}
	s.subs[ch] = struct{}{}
	s.subsMu.Unlock()
	return ch, func() {
		s.subsMu.Lock()
		delete(s.subs, ch)
		s.subsMu.Unlock()
	}
}

// Notify wakes the subscribed publishers. [Tx.Commit] calls it; call it yourself after
// committing a transaction wrapped with WrapTx that you committed directly. It never blocks.
func (s *MySQLStore) Notify() {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// BeginTx starts a transaction on the store's database.
func (s *MySQLStore) BeginTx(ctx context.Context, opts *sql.TxOptions) (*Tx, error) {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("outbox: could not begin transaction: %w", err)
	}
	return &Tx{Tx: tx, store: s}, nil
}

// WrapTx wraps a transaction the caller already has (from an ORM, say), so that events can be
// written in it. The caller still commits or rolls it back: through the returned Tx's Commit
// to wake this process's publishers at once, or directly (then the next poll, or a call to
// Notify, picks the events up).
func (s *MySQLStore) WrapTx(tx *sql.Tx) *Tx {
	return &Tx{Tx: tx, store: s}
}

// InsertEvent writes ev as a WAIT event due now, in the transaction, and returns its row id.
// If the transaction rolls back, so does the event; once it commits, the publisher will send
// it. The event also gets its [Event.EventID] here, a new UUIDv7, which every send of it
// carries; [MySQLStore.Get] shows it. An invalid event is refused with an error wrapping
// [ErrInvalidEvent] and nothing is written.
func (t *Tx) InsertEvent(ctx context.Context, ev EventInput) (int64, error) {
	if err := t.store.validateEvent(ev); err != nil {
		return 0, err
	}
	payload := ev.Payload
	if payload == nil {
		payload = []byte{}
	}
	// Generated here, not by the database: MySQL's UUID() is version 1, and MariaDB has
	// UUID_v7() only from 11.7.
	eventID, err := uuid.NewV7()
	if err != nil {
		return 0, fmt.Errorf("outbox: insert event: generate the event id: %w", err)
	}
	res, err := t.ExecContext(ctx, t.store.q.insert, eventID.String(), ev.BizNo, ev.EventType, payload)
	if err != nil {
		return 0, t.store.wrap("insert event", err)
	}
	t.wrote = true
	id, err := res.LastInsertId()
	if err != nil {
		return 0, fmt.Errorf("outbox: insert event: %w", err)
	}
	return id, nil
}

func (s *MySQLStore) validateEvent(ev EventInput) error {
	if err := validateKey("BizNo", ev.BizNo); err != nil {
		return err
	}
	if err := validateKey("EventType", ev.EventType); err != nil {
		return err
	}
	if len(ev.Payload) > s.maxPayload {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrPayloadTooLarge, len(ev.Payload), s.maxPayload)
	}
	return nil
}

// validateKey checks a biz no or event type: required, at most 64 characters, printable
// UTF-8 (they become message keys, tags and properties, where control characters are
// separators).
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
	}
	return nil
}

// Candidates implements [Store].
func (s *MySQLStore) Candidates(ctx context.Context, limit int) ([]Event, error) {
	evs, _, err := scanEvents(s.db.QueryContext(ctx, s.q.candidates, limit))
	if err != nil {
		return nil, s.wrap("select candidates", err)
	}
	return evs, nil
}

// scanEvents reads the rows of the candidates and lockDue queries: WAIT events, and the
// length of each one's payload (lockDue may leave a long payload out).
func scanEvents(rows *sql.Rows, err error) ([]Event, []int, error) {
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var (
		events []Event
		sizes  []int
	)
	for rows.Next() {
		ev := Event{Status: StatusWait}
		var size int
		if err := rows.Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &ev.RetryCount,
			dbTime{&ev.NextRetryTime}, dbTime{&ev.CreateTime}, &ev.ReclaimCount, &size); err != nil {
			return nil, nil, err
		}
		events = append(events, ev)
		sizes = append(sizes, size)
	}
	return events, sizes, rows.Err()
}

// Claim implements [Store].
func (s *MySQLStore) Claim(ctx context.Context, ev Event, owner string) (bool, error) {
	return s.execOne(ctx, "claim", s.q.claim, owner, ev.ID, ev.RetryCount)
}

// ClaimDue implements [Store]: SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE of the rows
// it locked, in one READ COMMITTED transaction (no gap locks, so the business transactions'
// inserts never wait on a claim). Unless [MySQLConfig.ConcurrentClaims] is set, the SELECT
// runs in this table's claim turn, which may mean waiting up to a second for other
// instances' SELECTs. A deadlock or lock wait timeout runs it again.
//
// Reclaimed rows keep their old next_retry_time, so after an instance died they come first:
// each is claimed alone, and while they come the claim locks only a few rows at a time
// (suspectLimit) instead of a whole batch to take one.
func (s *MySQLStore) ClaimDue(ctx context.Context, owner string, limit, maxBytes int) ([]Event, bool, error) {
	if limit <= 0 || maxBytes <= 0 {
		return nil, false, fmt.Errorf("outbox: claim due events: limit (%d) and maxBytes (%d) must be positive", limit, maxBytes)
	}
	var more bool
	evs, err := retryOnLockConflict(ctx, s, func() (evs []Event, err error) {
		evs, more, err = s.claimDue(ctx, owner, limit, maxBytes)
		return evs, err
	})
	return evs, more, err
}

// suspectLimit is how many rows a claim locks while reclaimed rows are at the head.
const suspectLimit = 16

// minInlinePayload is the least payload size the claim's SELECT reads inline.
const minInlinePayload = 4 << 10

func (s *MySQLStore) claimDue(ctx context.Context, owner string, limit, maxBytes int) (evs []Event, more bool, err error) {
	// A connection of its own, so that it can be thrown away if it might still hold the
	// claim turn.
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, false, s.wrap("claim due events", err)
	}
	defer conn.Close()
	// A session whose GET_LOCK failed may hold the lock all the same: once the claim is done
	// (after its commit or rollback), it is closed, not returned to the pool.
	turn := turnSkipped
	defer func() {
		if turn == turnFailed {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, false, s.wrap("claim due events", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreDone(tx.Rollback()))
		}
	}()
	// If taking or releasing the turn fails, the session may hold the lock, and would keep it
	// idle in the pool, where no other instance's claim could get it: close the connection.
	discard := func(err error) error {
		err = errors.Join(err, ignoreDone(tx.Rollback()))
		_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		return err
	}
	if !s.concurrentClaims {
		if turn, err = s.takeClaimTurn(ctx, tx); err != nil {
			return nil, false, discard(err)
		}
	}
	scan := limit
	if s.suspectsAhead.Load() {
		scan = min(limit, suspectLimit)
	}
	inline := max(maxBytes/limit, minInlinePayload)
	evs, sizes, err := scanEvents(tx.QueryContext(ctx, fmt.Sprintf(s.q.lockDue, inline, scan)))
	if err != nil {
		err = s.wrap("lock due events", err)
	}
	if turn == turnTaken {
		if endErr := s.endClaimTurn(ctx, tx); endErr != nil {
			return nil, false, discard(errors.Join(err, endErr))
		}
	}
	if err != nil {
		return nil, false, err
	}
	if len(evs) == 0 {
		s.suspectsAhead.Store(false)
		return nil, false, s.wrap("claim due events", tx.Commit())
	}
	n, suspect := claimable(evs, sizes, maxBytes)
	s.suspectsAhead.Store(suspect)
	more = len(evs) == scan || n < len(evs)
	evs = evs[:n] // the other rows stay WAIT; their locks end with the transaction
	ids := make([]int64, len(evs))
	var long []int64 // rows whose payload the SELECT left out
	for i, ev := range evs {
		ids[i] = ev.ID
		if ev.Payload == nil && sizes[i] > 0 {
			long = append(long, ev.ID)
		}
	}
	res, err := tx.ExecContext(ctx, fmt.Sprintf(s.q.claimLocked, idList(ids)), owner)
	if err != nil {
		return nil, false, s.wrap("claim due events", err)
	}
	if n, err := res.RowsAffected(); err != nil || n != int64(len(evs)) {
		// The rows were locked by this transaction: anything else is a broken invariant.
		return nil, false, fmt.Errorf("outbox: claim due events: claimed %d of %d locked rows (%v)", n, len(evs), err)
	}
	if len(long) > 0 {
		if err := s.readPayloads(ctx, tx, evs, long); err != nil {
			return nil, false, err
		}
	}
	if err := tx.Commit(); err != nil {
		// The outcome is unknown: the rows may be SENDING under owner. The publisher
		// releases its own rows before it claims again (Store.ReleaseOwned).
		return nil, false, s.wrap("claim due events: commit", err)
	}
	for i := range evs {
		evs[i].Status, evs[i].ClaimOwner = StatusSending, owner
		if evs[i].Payload == nil {
			evs[i].Payload = []byte{}
		}
	}
	return evs, more, nil
}

// claimable says how many of the locked rows, in order, one claim takes: a reclaimed row at
// the head alone; otherwise the rows before the first reclaimed one, as long as their
// payloads add up to at most maxBytes (the first row always). suspect reports that the claim
// stopped at (or took) a reclaimed row, so more may follow.
func claimable(evs []Event, sizes []int, maxBytes int) (n int, suspect bool) {
	if evs[0].ReclaimCount > 0 {
		return 1, true
	}
	total := 0
	for n = 0; n < len(evs); n++ {
		if evs[n].ReclaimCount > 0 {
			return n, true
		}
		total += sizes[n]
		if n > 0 && total > maxBytes {
			return n, false
		}
	}
	return n, false
}

// readPayloads fills in the payloads the claim's SELECT left out, for the claimed rows ids.
func (s *MySQLStore) readPayloads(ctx context.Context, tx *sql.Tx, evs []Event, ids []int64) error {
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(s.q.payloads, idList(ids)))
	if err != nil {
		return s.wrap("claim due events: read payloads", err)
	}
	defer rows.Close()
	byID := make(map[int64][]byte, len(ids))
	for rows.Next() {
		var (
			id      int64
			payload []byte
		)
		if err := rows.Scan(&id, &payload); err != nil {
			return s.wrap("claim due events: read payloads", err)
		}
		byID[id] = payload
	}
	if err := rows.Err(); err != nil {
		return s.wrap("claim due events: read payloads", err)
	}
	for i := range evs {
		if p, ok := byID[evs[i].ID]; ok {
			evs[i].Payload = p
		}
	}
	return nil
}

// claimTurn is what became of a claim's request for its turn.
type claimTurn int

const (
	// turnSkipped: no turn, and no lock held. Turns are paused, or the wait timed out.
	turnSkipped claimTurn = iota
	// turnTaken: the session holds the lock and releases it after its SELECT.
	turnTaken
	// turnFailed: GET_LOCK failed or was refused (its wait was killed, a proxy forbids it,
	// the server answered with an error). The claim goes on without the turn, but the
	// session may hold the lock, so its connection is closed after the claim.
	turnFailed
)

// takeClaimTurn waits for this table's claim lock. Not getting it is never the claim's
// error: when the wait runs out (claimTurnWait), is killed, or GET_LOCK fails or is refused,
// the claim goes ahead without the turn, and so do this store's claims for the next
// turnPause. It returns an error only for a connection that is gone or a ctx that is done
// (the claim cannot go on without them), and for a deadlock or lock wait timeout, after
// which ClaimDue runs the claim again, without the turn.
func (s *MySQLStore) takeClaimTurn(ctx context.Context, tx *sql.Tx) (claimTurn, error) {
	if time.Since(s.born) < time.Duration(s.turnsPausedUntil.Load()) {
		return turnSkipped, nil
	}
	var got sql.NullInt64 // 1: ours; 0: timed out; NULL: an error such as a killed wait
	query := fmt.Sprintf(s.q.takeClaimTurn, int(s.claimTurnWait/time.Second))
	err := tx.QueryRowContext(ctx, query).Scan(&got)
	switch {
	case err != nil && !turnRefused(ctx, err):
		if isLockConflict(err) {
			s.pauseTurns() // the claim runs again (retryOnLockConflict), without the turn
		}
		return turnSkipped, s.wrap("claim due events: take the claim lock with GET_LOCK", err)
	case err != nil || !got.Valid:
		s.pauseTurns()
		return turnFailed, nil
	case got.Int64 != 1:
		s.pauseTurns()
		return turnSkipped, nil
	}
	return turnTaken, nil
}

// pauseTurns makes this store's claims go without turns for the next turnPause.
func (s *MySQLStore) pauseTurns() {
	s.turnsPausedUntil.Store(int64(time.Since(s.born) + turnPause))
}

// turnRefused reports whether GET_LOCK's error is the server's (or a proxy's) answer on a
// connection that lives on, so that the claim can go on without the turn: not a lost or
// killed connection, not a done ctx, and not a deadlock or lock wait timeout (which may have
// rolled back the claim's transaction; the claim runs again).
func turnRefused(ctx context.Context, err error) bool {
	var me *mysql.MySQLError
	if ctx.Err() != nil || !errors.As(err, &me) || isLockConflict(err) {
		return false
	}
	switch me.Number {
	case 1053, // ER_SERVER_SHUTDOWN
		1927, // ER_CONNECTION_KILLED (MariaDB)
		4031: // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
		return false
	}
	return true
}

// endClaimTurn releases the claim lock, even when ctx is done, so that the other instances
// do not wait for it.
func (s *MySQLStore) endClaimTurn(ctx context.Context, tx *sql.Tx) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_, err := tx.ExecContext(ctx, s.q.endClaimTurn)
	return s.wrap("claim due events: release the claim lock", err)
}

// claimLockName is the SQL expression naming the claim lock of table in the session's
// database.
func claimLockName(table string) string {
	return fmt.Sprintf("CONCAT('outbox-claim:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', '%s')))", table)
}

// noLease reports schema.sql's "nobody holds it": 1970-01-01 00:00:00, read in whatever
// location the driver reads times in.
func noLease(t time.Time) bool {
	y, m, d := t.Date()
	h, mi, sec := t.Clock()
	return y == 1970 && m == time.January && d == 1 && h == 0 && mi == 0 && sec == 0 && t.Nanosecond() == 0
}

// MarkSuccessBatch implements [Store].
func (s *MySQLStore) MarkSuccessBatch(ctx context.Context, ids []int64, owner string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.exec(ctx, "mark success", fmt.Sprintf(s.q.markSuccessBatch, idList(ids)), owner)
}

// MarkSuccess implements [Store].
func (s *MySQLStore) MarkSuccess(ctx context.Context, id int64, owner string) (bool, error) {
	return s.execOne(ctx, "mark success", s.q.markSuccess, id, owner)
}

// ReleaseForRetry implements [Store].
func (s *MySQLStore) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, reason string) (bool, error) {
	return s.execOne(ctx, "release for retry", s.q.release,
		retryCount, delay.Microseconds(), truncateReason(reason), id, owner)
}

// MarkFail implements [Store].
func (s *MySQLStore) MarkFail(ctx context.Context, id int64, owner string, retryCount int, reason string) (bool, error) {
	return s.execOne(ctx, "mark fail", s.q.markFail, retryCount, truncateReason(reason), id, owner)
}

// ReclaimExpired implements [Store]. It works in pages of reclaimPage rows, so that no
// statement locks many rows at once.
func (s *MySQLStore) ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (int64, []Event, error) {
	var (
		requeued int64
		dead     []Event
	)
	for {
		rows, err := s.expired(ctx, lease)
		if err != nil || len(rows) == 0 {
			return requeued, dead, err
		}
		var again, poison []int64
		for _, r := range rows {
			if maxReclaims != RetryForever && r.reclaims+1 >= maxReclaims {
				poison = append(poison, r.id)
			} else {
				again = append(again, r.id)
			}
		}
		if len(again) > 0 {
			n, err := s.exec(ctx, "reclaim expired leases", fmt.Sprintf(s.q.reclaim, idList(again)), lease.Microseconds())
			requeued += n
			if err != nil {
				return requeued, dead, err
			}
		}
		if len(poison) > 0 {
			reason := fmt.Sprintf("reclaimed %d times: each instance that claimed it died or stalled before recording an outcome (a poison event?)", maxReclaims)
			if _, err := s.exec(ctx, "dead-letter a reclaimed event", fmt.Sprintf(s.q.reclaimFail, idList(poison)),
				reason, lease.Microseconds()); err != nil {
				return requeued, dead, err
			}
			for _, id := range poison {
				ev, err := s.Get(ctx, id)
				if err != nil {
					return requeued, dead, err
				}
				if ev.Status == StatusFail && ev.LastError == reason {
					dead = append(dead, ev)
				}
			}
		}
		if len(rows) < reclaimPage {
			return requeued, dead, nil
		}
	}
}

type expiredRow struct {
	id       int64
	reclaims int
}

func (s *MySQLStore) expired(ctx context.Context, lease time.Duration) ([]expiredRow, error) {
	rows, err := s.db.QueryContext(ctx, s.q.expired, lease.Microseconds(), reclaimPage)
	if err != nil {
		return nil, s.wrap("select expired leases", err)
	}
	defer rows.Close()
	var out []expiredRow
	for rows.Next() {
		var r expiredRow
		if err := rows.Scan(&r.id, &r.reclaims); err != nil {
			return nil, s.wrap("select expired leases", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("select expired leases", err)
	}
	return out, nil
}

// ReleaseOwned implements [Store], in pages of reclaimPage rows.
func (s *MySQLStore) ReleaseOwned(ctx context.Context, owner, reason string) (int64, error) {
	var total int64
	for {
		ids, err := s.ownedIDs(ctx, owner)
		if err != nil || len(ids) == 0 {
			return total, err
		}
		n, err := s.exec(ctx, "release owned events", fmt.Sprintf(s.q.releaseOwned, idList(ids)), truncateReason(reason), owner)
		total += n
		if err != nil || len(ids) < reclaimPage {
			return total, err
		}
	}
}

func (s *MySQLStore) ownedIDs(ctx context.Context, owner string) ([]int64, error) {
	rows, err := s.db.QueryContext(ctx, s.q.owned, owner, reclaimPage)
	if err != nil {
		return nil, s.wrap("select owned events", err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, s.wrap("select owned events", err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("select owned events", err)
	}
	return ids, nil
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
		dbTime{&ev.CreateTime}, dbTime{&ev.UpdateTime})
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

// LockRetries is how many statements were run again after a deadlock (1213) or a lock wait
// timeout (1205) since the store was made. Such retries are normal under contention and
// invisible to callers; a steady rise says the instances contend more than they should.
func (s *MySQLStore) LockRetries() int64 { return s.lockRetries.Load() }

// execOne runs a statement that targets one row and reports whether it changed it.
func (s *MySQLStore) execOne(ctx context.Context, op, query string, args ...any) (bool, error) {
	n, err := s.exec(ctx, op, query, args...)
	return n == 1, err
}

// exec runs one autocommit statement and returns the rows it changed. Every statement here
// is conditional, so running it again after a lock conflict is safe.
func (s *MySQLStore) exec(ctx context.Context, op, query string, args ...any) (int64, error) {
	n, err := retryOnLockConflict(ctx, s, func() (int64, error) {
		res, err := s.db.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	return n, s.wrap(op, err)
}

// retryOnLockConflict runs fn again, up to maxLockAttempts times in all, while it fails with a
// deadlock or lock wait timeout: either rolls back the statement (or the transaction) whole,
// so nothing of the failed try remains. Each retry is counted in s.lockRetries.
func retryOnLockConflict[T any](ctx context.Context, s *MySQLStore, fn func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := fn()
		if err == nil || attempt == maxLockAttempts || !isLockConflict(err) {
			return v, err
		}
		s.lockRetries.Add(1)
		if pauseAfterConflict(ctx, attempt) != nil {
			return v, err
		}
	}
}

// pauseAfterConflict waits a short, jittered while, so that the transaction that won the
// lock finishes first.
func pauseAfterConflict(ctx context.Context, attempt int) error {
	t := time.NewTimer(time.Duration(attempt) * time.Duration(1+mrand.IntN(4)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// idList writes ids as an SQL list of integer literals. Literals rather than one placeholder
// each: a statement with parameters is prepared, run and closed (three round trips, unless
// the DSN sets interpolateParams), and integers cannot carry anything but a number.
func idList(ids []int64) string {
	b := make([]byte, 0, len(ids)*8)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(b)
}

// ignoreDone drops the error of a rollback on a transaction that has already ended.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) {
		// Ended already, or its connection is gone, which ends it: the error that made the
		// caller roll back says all there is to say.
		return nil
	}
	return err
}

// isLockConflict reports a deadlock or lock wait timeout: the statement was rolled back and
// may simply be run again.
func isLockConflict(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// wrap names the operation, and the fix where the driver's error has an obvious one.
func (s *MySQLStore) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1146 { // ER_NO_SUCH_TABLE
		return fmt.Errorf("outbox: %s: table %s does not exist (create it with CreateSchema or schema.sql): %w", op, s.table, err)
	}
	if errors.As(err, &me) && me.Number == 1054 { // ER_BAD_FIELD_ERROR
		for _, col := range newerColumns {
			if strings.Contains(me.Message, col) {
				return fmt.Errorf("outbox: %s: table %s has no %s column: %s: %w", op, s.table, col, upgradeHint, err)
			}
		}
	}
	return fmt.Errorf("outbox: %s: %w", op, err)
}

func truncateReason(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	if utf8.RuneCountInString(s) <= maxReasonLen {
		return s
	}
	r := []rune(s)
	return string(r[:maxReasonLen-3]) + "..."
}

// dbTime scans a DATETIME column whether or not the DSN has parseTime=true; NULL scans as the
// zero time. The column holds UTC.
type dbTime struct{ t *time.Time }

func (d dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*d.t = time.Time{}
	case time.Time:
		*d.t = x
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	default:
		return fmt.Errorf("outbox: cannot scan %T into a time", v)
	}
	return nil
}

func (d dbTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("outbox: cannot parse time %q: %w", s, err)
	}
	*d.t = t
	return nil
}
