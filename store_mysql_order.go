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

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// The ordered claims (see [KeyOrder]): the batch claim's part of ClaimDue, and the per-row
// claims' candidates (Claim's ordered statement is in orderQueries).
//
// Correctness rests on one fact: SUCCESS and SKIPPED are final. The SELECT's subqueries are
// consistent reads, possibly of a moment ago; a stale one may show an event open that has
// since become done (the key waits a round), never the reverse.

// keyed is a row of an ordered SELECT: the event, its payload's length, and its key's first
// WAIT id at the time the row was read.
type keyed struct {
	ev      Event
	size    int
	keyHead int64
}

// scanKeyed reads the rows of an ordered SELECT.
func scanKeyed(rows *sql.Rows, err error) ([]keyed, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []keyed
	for rows.Next() {
		k := keyed{ev: Event{Status: StatusWait}}
		var (
			ageUS, deferredUS int64
			head              sql.NullInt64
		)
		ev := &k.ev
		if err := rows.Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &ev.RetryCount,
			dbTime{&ev.NextRetryTime}, dbTime{&ev.CreateTime}, &ev.ReclaimCount, &k.size, &ev.TraceParent, &ev.TraceState, &ev.Topic,
			&ageUS, &deferredUS, &head); err != nil {
			return nil, err
		}
		ev.storeAge, ev.readAt = time.Duration(ageUS)*time.Microsecond, time.Now()
		ev.deferred = time.Duration(max(deferredUS, 0)) * time.Microsecond
		k.keyHead = head.Int64
		out = append(out, k)
	}
	return out, rows.Err()
}

// keyRuns applies the two rules that make the ordered SELECT's rows safe to claim together,
// and returns the rows kept, in the SELECT's order:
//   - the head rule: a key is kept only if its smallest row is its first WAIT event. The head
//     may be locked by another claim, which SKIP LOCKED passes over while the subqueries
//     still see it WAIT, so its followers come back without it;
//   - the gap rule: a key's rows are kept up to the first WAIT event of the key the SELECT
//     did not return (another claim holds it, it is due later, or LIMIT cut it off), read
//     by one lock-free range read on idx_biz_no_status.
func (s *MySQLStore) keyRuns(ctx context.Context, q querier, rows []keyed) ([]keyed, error) {
	byKey := map[string][]int64{}
	var order []string
	keyHead := make(map[int64]int64, len(rows))
	for _, r := range rows {
		k := r.ev.BizNo
		if _, ok := byKey[k]; !ok {
			order = append(order, k)
		}
		byKey[k] = append(byKey[k], r.ev.ID)
		keyHead[r.ev.ID] = r.keyHead
	}
	keep := map[int64]bool{}
	var runs []string // keys of two rows or more, whose runs the gap rule checks
	for _, k := range order {
		ids := byKey[k]
		slices.Sort(ids)
		if ids[0] != keyHead[ids[0]] {
			continue // the head rule
		}
		if len(ids) == 1 {
			keep[ids[0]] = true
			continue
		}
		runs = append(runs, k)
	}
	if len(runs) > 0 {
		conds := make([]string, len(runs))
		args := make([]any, 0, 3*len(runs))
		for i, k := range runs {
			ids := byKey[k]
			conds[i] = "(biz_no = ? AND id BETWEEN ? AND ?)"
			args = append(args, k, ids[0], ids[len(ids)-1])
		}
		waiting := map[string][]int64{}
		rs, err := q.QueryContext(ctx, fmt.Sprintf(s.oq.gap, strings.Join(conds, " OR ")), args...)
		if err != nil {
			return nil, err
		}
		for rs.Next() {
			var (
				k  string
				id int64
			)
			if err := rs.Scan(&k, &id); err != nil {
				_ = rs.Close()
				return nil, err
			}
			waiting[k] = append(waiting[k], id)
		}
		if err := rs.Close(); err != nil {
			return nil, err
		}
		for _, k := range runs {
			ids, w := byKey[k], waiting[k]
			// The server compares biz nos in the column's collation, so keys that differ
			// only in case are one key to the SELECT and the gap read: a row of such a
			// twin may hold a run back a round (its head rule fails), never let it run
			// ahead. waiting is keyed by the exact value read.
			for i, id := range ids {
				if i >= len(w) || w[i] != id {
					break
				}
				keep[id] = true
			}
		}
	}
	out := rows[:0:0]
	for _, r := range rows {
		if keep[r.ev.ID] {
			out = append(out, r)
		}
	}
	return out, nil
}

// prefixRuns keeps, of each key's rows, the longest prefix in id order that lies wholly in
// the rows given, and returns the kept rows grouped by key: the keys in the order of their
// first row, each key's rows in id order. all holds every row the rules kept; taken the
// ones the claim may take (a cut by size or at a reclaimed row may leave a hole in a run).
func prefixRuns(all, taken []keyed) []keyed {
	in := make(map[int64]bool, len(taken))
	for _, r := range taken {
		in[r.ev.ID] = true
	}
	byKey := map[string][]keyed{}
	var order []string
	for _, r := range all {
		if _, ok := byKey[r.ev.BizNo]; !ok {
			order = append(order, r.ev.BizNo)
		}
		byKey[r.ev.BizNo] = append(byKey[r.ev.BizNo], r)
	}
	var out []keyed
	for _, k := range order {
		run := byKey[k]
		slices.SortFunc(run, func(a, b keyed) int { return cmp.Compare(a.ev.ID, b.ev.ID) })
		for _, r := range run {
			if !in[r.ev.ID] {
				break
			}
			out = append(out, r)
		}
	}
	return out
}

// lockOrdered runs the ordered SELECT of a batch claim and the head and gap rules, and
// returns the events the claim may take, grouped by key in id order, with their payload
// sizes; more reports that due events may be left.
func (s *MySQLStore) lockOrdered(ctx context.Context, q querier, o Ordering, inline, scan, maxBytes int) (evs []Event, sizes []int, more, suspect bool, err error) {
	rows, err := scanKeyed(q.QueryContext(ctx, fmt.Sprintf(s.oq.lockDue[orderIndexOf(o)], inline, scan)))
	if err != nil {
		return nil, nil, false, false, s.wrap("lock due events in key order", err)
	}
	kept, err := s.keyRuns(ctx, q, rows)
	if err != nil {
		return nil, nil, false, false, s.wrap("lock due events in key order: read the keys' runs", err)
	}
	evs, sizes = make([]Event, len(kept)), make([]int, len(kept))
	for i, r := range kept {
		evs[i], sizes[i] = r.ev, r.size
	}
	// The existing rules, in the SELECT's order: a reclaimed row alone, MaxBytes.
	n, suspect := claimable(evs, sizes, maxBytes)
	taken := prefixRuns(kept, kept[:n])
	more = len(rows) == scan || n < len(kept)
	evs, sizes = make([]Event, len(taken)), make([]int, len(taken))
	for i, r := range taken {
		evs[i], sizes[i] = r.ev, r.size
	}
	return evs, sizes, more, suspect, nil
}

// recordSucceeded marks SUCCESS, in the claim's transaction and before its SELECT, the
// request's successes that are still the owner's, so that the SELECT already sees them
// done and takes their keys' next events.
func (s *MySQLStore) recordSucceeded(ctx context.Context, q querier, req ClaimRequest) (int64, error) {
	res, err := q.ExecContext(ctx, fmt.Sprintf(s.q.markSuccessBatch, idList(req.Succeeded)), req.Owner)
	if err != nil {
		return 0, s.wrap("claim due events: record successes", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.wrap("claim due events: record successes", err)
	}
	return n, nil
}

// orderedCandidates is Candidates in key order: due WAIT events whose key lets them go, at
// most limit rows read.
func (s *MySQLStore) orderedCandidates(ctx context.Context, limit int) ([]Event, error) {
	rows, err := scanKeyed(s.db.QueryContext(ctx, s.oq.candidates[orderIndexOf(s.ordering)], limit))
	if err != nil {
		return nil, s.wrap("select candidates in key order", err)
	}
	kept, err := s.keyRuns(ctx, s.db, rows)
	if err != nil {
		return nil, s.wrap("select candidates in key order: read the keys' runs", err)
	}
	kept = prefixRuns(kept, kept)
	evs := make([]Event, len(kept))
	for i, r := range kept {
		evs[i] = r.ev
		if evs[i].Payload == nil {
			evs[i].Payload = []byte{}
		}
	}
	s.resolveTopics(evs)
	return evs, nil
}

// The index lines of schema.sql: the unordered one, and what an ordered table has instead.
const (
	bizNoIndexLine   = "KEY idx_biz_no (biz_no)"
	orderedIndexLine = "KEY " + orderIndex + " (biz_no, status, id)"
)

// orderedSchema is the CREATE TABLE with idx_biz_no_status in place of idx_biz_no.
func orderedSchema(schema string) string {
	if !strings.Contains(schema, bizNoIndexLine) {
		panic("outbox: schema.sql has no line " + bizNoIndexLine) // caught by the tests
	}
	return strings.Replace(schema, bizNoIndexLine, orderedIndexLine, 1)
}

// The statements that make an existing table fit for ordered claims; CheckOrdering names
// the ones a table needs, with its name in place of t_event_record.
const (
	// Appending a member to an ENUM changes no row: instant on MariaDB 10.3+ and MySQL 8.
	alterSkipped = "ALTER TABLE t_event_record MODIFY status ENUM('WAIT', 'SENDING', 'SUCCESS', 'FAIL', 'SKIPPED') NOT NULL DEFAULT 'WAIT'"
	// An online index build: the table takes writes while it runs.
	alterOrderIndex = "ALTER TABLE t_event_record DROP INDEX idx_biz_no, ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE"
	// For a table without idx_biz_no (dropped, or never made).
	alterAddOrderIndex = "ALTER TABLE t_event_record ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE"
	// For a table with an index of that name on other columns.
	alterRedoOrderIndex = "ALTER TABLE t_event_record DROP INDEX idx_biz_no_status, ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE"
)

// indexColumns reads the table's indexes: name -> columns in order, comma-separated.
func (s *MySQLStore) indexColumns(ctx context.Context) (map[string]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT INDEX_NAME, GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX SEPARATOR ',')
	FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?
	GROUP BY INDEX_NAME`, s.table)
	if err != nil {
		return nil, s.wrap("check ordering: read the indexes", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, cols string
		if err := rows.Scan(&name, &cols); err != nil {
			return nil, s.wrap("check ordering: read the indexes", err)
		}
		out[name] = strings.ToLower(cols)
	}
	return out, s.wrap("check ordering: read the indexes", rows.Err())
}

// hasSkipped reports whether the status column allows SKIPPED (a table made before it does
// not; in non-strict SQL modes writing it there would store ” instead of failing).
func (s *MySQLStore) hasSkipped(ctx context.Context) (bool, error) {
	var typ string
	err := s.db.QueryRowContext(ctx, `SELECT COLUMN_TYPE FROM information_schema.COLUMNS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'status'`, s.table).Scan(&typ)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("outbox: table %s does not exist or has no status column", s.table)
	}
	if err != nil {
		return false, s.wrap("read the status column's type", err)
	}
	return strings.Contains(typ, "'SKIPPED'"), nil
}

// checkSkipped refuses a table whose status column does not allow SKIPPED, with the ALTER
// TABLE that adds it.
func (s *MySQLStore) checkSkipped(ctx context.Context) error {
	ok, err := s.hasSkipped(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("outbox: skip: table %s's status column does not allow 'SKIPPED'; run: %s; (see docs/ordering.md)",
			s.table, strings.ReplaceAll(alterSkipped, "t_event_record", mysqldialect.Quote(s.table)))
	}
	return nil
}
