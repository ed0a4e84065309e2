package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"
)

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

// Requeue returns a dead-lettered (FAIL) event to WAIT, for a person who has fixed the
// cause and wants it sent again: retry and reclaim counts reset, due now, claim columns
// cleared, and this process's publishers woken. Only a FAIL event changes: an event in any
// other status is refused with an error wrapping [ErrNotDeadLetter], a missing id with
// [ErrNotFound], and nothing changes.
func (a *Admin) Requeue(ctx context.Context, id int64) error {
	if err := a.deadLetterOnly(ctx, "requeue", a.s.q.requeue, id); err != nil {
		return err
	}
	a.s.Notify()
	return nil
}

// deadLetterOnly runs query, an UPDATE of the row id guarded by status = 'FAIL', and when it
// changes nothing tells why: the row is missing ([ErrNotFound]) or not FAIL
// ([ErrNotDeadLetter]). The guard is the statement's, so a row that is not FAIL is never
// changed, whatever happens between the statement and the read; a row that became FAIL in
// between (a publisher dead-lettered it) is tried again.
func (a *Admin) deadLetterOnly(ctx context.Context, op, query string, id int64) error {
	if id <= 0 {
		return fmt.Errorf("%w: ids are positive, got %d", ErrInvalidInput, id)
	}
	for range 3 {
		changed, err := a.s.execOne(ctx, op, query, id)
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

// purgeLockName is the SQL expression naming the purge lock of table in the session's
// database (lock names are server-wide and at most 64 characters, hence the hash).
func purgeLockName(table string) string {
	return fmt.Sprintf("CONCAT('outbox-purge:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', '%s')))", table)
}

// adminColumns are the columns List reads: every column but the payload, and its length.
const adminColumns = `id, event_id, biz_no, event_type, OCTET_LENGTH(payload), status, retry_count, reclaim_count,
	next_retry_time, claim_owner, claimed_at, last_error, create_time, update_time`

// where writes f as an SQL condition (never empty) and its arguments.
func (f Filter) where() (string, []any) {
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
	if f.EventType != "" {
		conds, args = append(conds, "event_type = ?"), append(args, f.EventType)
	}
	if f.BizNo != "" {
		conds, args = append(conds, "biz_no = ?"), append(args, f.BizNo)
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
	cond, args := f.where()
	q := "SELECT " + adminColumns + " FROM `" + s.table + "` WHERE " + cond + " ORDER BY id DESC LIMIT ?"
	rows, err := s.db.QueryContext(ctx, q, append(args, cmp.Or(f.Limit, listLimitDefault))...)
	if err != nil {
		return nil, s.wrap("list events", err)
	}
	defer rows.Close()
	var out []ListedEvent
	for rows.Next() {
		var le ListedEvent
		if err := scanListed(rows, &le); err != nil {
			return nil, s.wrap("list events", err)
		}
		out = append(out, le)
	}
	return out, s.wrap("list events", rows.Err())
}

// scanListed reads a row of adminColumns into le, then the row's further columns into
// extra.
func scanListed(rows *sql.Rows, le *ListedEvent, extra ...any) error {
	var (
		lastErr            sql.NullString
		status             string
		nextRetry, claimed time.Time
	)
	dest := []any{&le.ID, &le.EventID, &le.BizNo, &le.EventType, &le.PayloadSize, &status,
		&le.RetryCount, &le.ReclaimCount, dbTime{&nextRetry}, &le.ClaimOwner, dbTime{&claimed}, &lastErr,
		dbTime{&le.CreateTime}, dbTime{&le.UpdateTime}}
	if err := rows.Scan(append(dest, extra...)...); err != nil {
		return err
	}
	if noLease(claimed) {
		claimed = time.Time{}
	}
	le.Status, le.NextRetryTime, le.ClaimedAt, le.LastError = Status(status), nextRetry, claimed, lastErr.String
	return nil
}

// countFailed reports how many FAIL events f (already through failedOnly) selects, at most
// f.Limit when set.
func (s *MySQLStore) countFailed(ctx context.Context, f Filter) (int64, error) {
	cond, args := f.where()
	var n int64
	err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+s.table+"` WHERE "+cond, args...).Scan(&n)
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
	f, err := failedOnly(f)
	if err != nil {
		return 0, err
	}
	batch := cmp.Or(opts.BatchRows, requeueBatchDefault)
	if batch < 0 || batch > maxAdminBatch {
		return 0, fmt.Errorf("%w: requeue batch must be between 1 and %d rows, got %d", ErrInvalidInput, maxAdminBatch, batch)
	}
	s := a.s
	if opts.DryRun {
		return s.countFailed(ctx, f)
	}
	cond, args := f.where()
	sel := "SELECT id FROM `" + s.table + "` WHERE " + cond + " AND id > ? ORDER BY id LIMIT ?"
	var total int64
	var after int64
	for f.Limit == 0 || total < int64(f.Limit) {
		n := batch
		if f.Limit > 0 {
			n = min(n, f.Limit-int(total))
		}
		ids, err := s.selectIDs(ctx, "requeue dead letters", sel, append(append([]any{}, args...), after, n)...)
		if err != nil || len(ids) == 0 {
			return total, err
		}
		after = ids[len(ids)-1]
		changed, err := s.exec(ctx, "requeue dead letters", fmt.Sprintf(s.q.requeueIDs, idList(ids)))
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

// Purge deletes SUCCESS events whose last update (their acknowledgement) is older than
// olderThan by the database clock, then SKIPPED events (dead letters a person skipped)
// last updated as long ago, and reports how many it deleted. Both are final, and done for
// per-key ordering, so a key's later events never wait for a purged row. WAIT, SENDING and
// FAIL rows are never deleted, however old. It deletes at most opts.BatchRows rows per statement,
// by primary key, with opts.Pause between statements, so that the table's writers barely
// notice it; it stops when no old row is left, at opts.Limit, or when ctx ends.
//
// With opts.Exclusive it runs only if no other session is purging the table (see
// [PurgeOptions]), and returns [ErrPurgeBusy] otherwise. With opts.DryRun it deletes nothing
// and reports how many rows it would delete now.
func (s *MySQLStore) Purge(ctx context.Context, olderThan time.Duration, opts PurgeOptions) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("%w: purge age must be positive, got %s", ErrInvalidInput, olderThan)
	}
	if olderThan > maxBackoffLimit*100 {
		return 0, fmt.Errorf("%w: purge age %s is beyond any row", ErrInvalidInput, olderThan)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return 0, err
	}
	if opts.DryRun {
		return s.countPurgeable(ctx, olderThan, opts.Limit)
	}
	if opts.Exclusive {
		release, err := s.takePurgeLock(ctx)
		if err != nil {
			return 0, err
		}
		defer release()
	}
	age := olderThan.Microseconds()
	var total int64
	// One status at a time: each is one range of idx_status_claimed_at, read in order.
	for _, status := range []Status{StatusSuccess, StatusSkipped} {
		for {
			n := opts.BatchRows
			if opts.Limit > 0 {
				n = int(min(int64(n), opts.Limit-total))
			}
			if n <= 0 {
				return total, nil
			}
			ids, err := s.selectIDs(ctx, "purge", s.q.purgeCandidates, string(status), age, age, n)
			if err != nil {
				return total, err
			}
			if len(ids) == 0 {
				break
			}
			deleted, err := s.exec(ctx, "purge", fmt.Sprintf(s.q.purge, idList(ids)), age)
			if err != nil {
				return total, err
			}
			total += deleted
			if opts.OnBatch != nil {
				opts.OnBatch(deleted)
			}
			if opts.Limit > 0 && total >= opts.Limit {
				return total, nil
			}
			if len(ids) < n {
				break
			}
			if opts.Pause > 0 {
				if err := sleep(ctx, opts.Pause); err != nil {
					return total, err
				}
			}
		}
	}
	return total, nil
}

// takePurgeLock takes the table's purge lock on a connection of its own, without waiting,
// and returns the function that lets it go.
func (s *MySQLStore) takePurgeLock(ctx context.Context) (func(), error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, s.wrap("purge lock", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, s.q.takePurgeLock).Scan(&got); err != nil {
		_ = conn.Close()
		return nil, s.wrap("purge lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		_ = conn.Close()
		return nil, ErrPurgeBusy
	}
	if s.purgeHook != nil {
		s.purgeHook(true)
	}
	return func() {
		if s.purgeHook != nil {
			s.purgeHook(false)
		}
		// A fresh context: the caller's may have ended, and the lock must go either way. If
		// the statement fails, closing the connection ends the session, which frees the lock.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(rctx, s.q.endPurgeLock); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}, nil
}

// countPurgeable reports how many SUCCESS and SKIPPED rows a purge with olderThan would
// delete now, at most limit when positive. It counts through the same index as the purge.
func (s *MySQLStore) countPurgeable(ctx context.Context, olderThan time.Duration, limit int64) (int64, error) {
	age := olderThan.Microseconds()
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q.countPurgeable, age, age).Scan(&n); err != nil {
		return 0, s.wrap("count purgeable events", err)
	}
	if limit > 0 {
		n = min(n, limit)
	}
	return n, nil
}
