package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// The ordered claims (see [KeyOrder]): the per-row claims' candidates (Claim's ordered
// statement is in orderQueries), and the batch claim's part of ClaimDue, which takes whole
// keys (lockOrdered).
//
// Correctness rests on one fact: SUCCESS and SKIPPED are final. The statements' subqueries
// are consistent reads, possibly of a moment ago; a stale one may show an event open that
// has since become done (the key waits a round), never the reverse.

// keyed is a row of an ordered SELECT: the event, its payload's length, and (in the
// candidates' SELECT) its key's first WAIT id at the time the row was read.
type keyed struct {
	ev      Event
	size    int
	keyHead int64
}

// scanKeyed reads the rows of the candidates' ordered SELECT.
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
		ev.Read.Age, ev.Read.At = time.Duration(ageUS)*time.Microsecond, time.Now()
		ev.Read.Deferred = time.Duration(max(deferredUS, 0)) * time.Microsecond
		k.keyHead = head.Int64
		out = append(out, k)
	}
	return out, rows.Err()
}

// keyRuns applies the two rules that make the candidates' ordered SELECT's rows safe to
// claim one after the other, and returns the rows kept, in the SELECT's order:
//   - the head rule: a key is kept only if its smallest row is its first WAIT event, as
//     the SELECT's subquery read it;
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

// orderedSizing is what an ordered batch claim leaves the next one, to size it: how long
// the keys' runs were, and how many head candidates other claims held.
type orderedSizing struct {
	// run is the mean length of the keys' runs in the last claim that read them, the head
	// counted, in sixteenths of an event; 0 before the first.
	run atomic.Int64
	// extra is how many head candidates the window reads beyond the heads asked for: about
	// as many as other claims held in the last one.
	extra atomic.Int64
}

// heads returns how many heads a claim of limit events locks (at most scan): as many as
// keys of the last claim's mean run fill the limit.
func (z *orderedSizing) heads(limit, scan int) int {
	run := max(z.run.Load(), 16)
	return max(1, min(int((int64(limit)*16+run-1)/run), scan))
}

// lockOrdered is the batch claim in key order. It takes whole keys: first it locks up to a
// number of the keys' heads (headsSelect), SKIP LOCKED, so that concurrent claims take
// different keys; then, for the keys it holds, the due WAIT events behind each head, in id
// order, up to the first that is not due, that another claim holds, or that comes after
// the key's first SENDING (or, in KeyOrder, FAIL) event, until the claim's limit: read by
// one lock-free range read on idx_biz_no_status and locked by primary key. It returns the
// events the claim takes, each key's head followed by its run, with their payload sizes;
// more reports that due events may be left. A reclaimed head is taken alone, as the
// unordered claim takes it (suspect), and a reclaimed event in a run cuts it; MaxBytes
// cuts the list, a key's events stay a prefix of its run.
//
// Safe because the head is locked: no other claim takes a key's events without first
// locking its head, and while the head stays WAIT nothing after it may be claimed by
// anyone (the per-row claim re-checks that atomically), so the run behind it is this
// claim's to take.
func (s *MySQLStore) lockOrdered(ctx context.Context, q querier, o Ordering, inline, scan, limit, maxBytes int, ahead bool) (evs []Event, sizes []int, more, suspect bool, err error) {
	want := s.sizing.heads(limit, scan)
	extra := int(s.sizing.extra.Load())
	window := want + extra
	heads, found, err := s.lockHeads(ctx, q, o, inline, window, want)
	if err != nil {
		return nil, nil, false, false, s.wrap("lock due events in key order: lock the keys' heads", err)
	}
	// The next window: half as many candidates again beyond the heads as other claims held
	// in this one: the candidates passed over before the last head was locked; all of them
	// if too few were locked; if none was, the statement returned no row to count them by,
	// and the whole window counts as others' heads (it may as well have held nothing: a
	// wider window costs little then).
	passed := found - len(heads)
	switch {
	case len(heads) == 0 && ahead:
		// A claim beside a send expects the keys in flight: nothing to learn.
		return nil, nil, false, false, nil
	case len(heads) == 0:
		passed = window
	case len(heads) == want:
		last := 0
		for _, h := range heads {
			last = max(last, h.pos)
		}
		passed = last - len(heads)
	}
	s.sizing.extra.Store(int64(min(passed+passed/2, 2*limit)))
	// More may be due: the heads asked for were locked, or the window was full. A claim that
	// locked nothing cannot tell a window of others' heads from an empty one: it says more
	// may be due only while its window, widened by others' heads in the claims before,
	// may widen further; else the poll (or a commit's wake-up) brings the next claim.
	more = len(heads) == want || found == window && len(heads) > 0 ||
		len(heads) == 0 && extra > 0 && extra < 2*limit
	if len(heads) == 0 {
		return nil, nil, more, false, nil
	}
	slices.SortFunc(heads, func(a, b headRow) int {
		if c := a.ev.NextRetryTime.Compare(b.ev.NextRetryTime); c != 0 {
			return c
		}
		return cmp.Compare(a.ev.ID, b.ev.ID)
	})
	// A reclaimed head goes alone, and no head after a reclaimed one goes: the rule of the
	// unordered claim (claimable).
	if heads[0].ev.ReclaimCount > 0 {
		return []Event{heads[0].ev}, []int{heads[0].size}, true, true, nil
	}
	for i, h := range heads {
		if h.ev.ReclaimCount > 0 {
			heads, suspect, more = heads[:i], true, true
			break
		}
	}
	budget := limit - len(heads)
	runs, reads, cut, err := s.lockRuns(ctx, q, o, inline, heads, budget)
	if err != nil {
		return nil, nil, false, false, s.wrap("lock due events in key order: lock the keys' runs", err)
	}
	s.learnRuns(heads, runs, reads, budget)
	more = more || cut
	// Each key's head and run, the keys in scan order, as long as the payloads add up to at
	// most maxBytes (the first event always).
	total := 0
	for i, h := range heads {
		for _, r := range append([]keyed{{ev: h.ev, size: h.size}}, runs[i]...) {
			total += r.size
			if len(evs) > 0 && total > maxBytes {
				return evs, sizes, true, suspect, nil
			}
			evs, sizes = append(evs, r.ev), append(sizes, r.size)
		}
	}
	return evs, sizes, more, suspect, nil
}

// headRow is a head the claim locked: the event, its payload's length, whether a WAIT event
// of its key follows it, and its place among the window's candidates.
type headRow struct {
	ev      Event
	size    int
	hasNext bool
	pos     int
}

// lockHeads runs the heads statement: it locks up to want heads among a window of
// candidates, and returns them with how many candidates the window held.
func (s *MySQLStore) lockHeads(ctx context.Context, q querier, o Ordering, inline, window, want int) ([]headRow, int, error) {
	rows, err := q.QueryContext(ctx, fmt.Sprintf(s.oq.heads[orderIndexOf(o)], inline, window, want))
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var (
		out   []headRow
		found int
	)
	for rows.Next() {
		var (
			h    headRow
			next sql.NullInt64
		)
		if err := scanEventRow(rows, &h.ev, &h.size, &next, &found, &h.pos); err != nil {
			return nil, 0, err
		}
		h.hasNext = next.Valid
		out = append(out, h)
	}
	return out, found, rows.Err()
}

// runRead is what a claim read of a key's run, to learn the runs' mean length: whether the
// read reached the key, how many WAIT ids behind the head it found (before the claim's
// limit cut them), and how many of them it kept within the limit.
type runRead struct {
	reached     bool
	found, kept int
}

// length is the key's run as the claim found it, the head counted: what it took, or, if
// the limit cut the run and the lock took all it was given, what it found.
func (r runRead) length(took int) int {
	if took == r.kept {
		return 1 + r.found
	}
	return 1 + took
}

// lockIDs locks the rows of all, the ids of the heads' runs (ids, per head, in id order),
// and returns each head's run: the prefix of its ids the lock took, each WAIT, due, of the
// head's very biz no, and not reclaimed.
func (s *MySQLStore) lockIDs(ctx context.Context, q querier, inline int, heads []headRow, ids [][]int64, all []int64) ([][]keyed, error) {
	runs := make([][]keyed, len(heads))
	if len(all) == 0 {
		return runs, nil
	}
	rows, err := q.QueryContext(ctx, fmt.Sprintf(s.oq.lockRuns, inline, idList(all)))
	if err != nil {
		return nil, err
	}
	locked := make(map[int64]keyed, len(all))
	for rows.Next() {
		var r keyed
		if err := scanEventRow(rows, &r.ev, &r.size); err != nil {
			_ = rows.Close()
			return nil, err
		}
		locked[r.ev.ID] = r
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	for i := range heads {
		for _, id := range ids[i] {
			r, ok := locked[id]
			// A twin (a biz no equal to the head's in the column's collation, not byte for
			// byte) cuts the run: its own order is kept when it is a head.
			if !ok || r.ev.ReclaimCount > 0 || r.ev.BizNo != heads[i].ev.BizNo {
				break
			}
			runs[i] = append(runs[i], r)
		}
	}
	return runs, nil
}

// lockRuns locks, for each of the heads the claim holds, the run behind it: its key's next
// WAIT events in id order, each due and not held by another claim, up to budget events in
// all. It returns each head's run (in the heads' order), which keys the read reached, and
// whether a run may go on past what was taken (the budget ran out).
//
// One lock-free read of idx_biz_no_status (runs) gives, for the keys with a WAIT event
// behind their heads, their WAIT ids in index order, at most budget of them behind the
// heads, and, in the same read view, their SENDING (in KeyOrder also FAIL) ids. A key's
// run is a prefix of its WAIT ids after its head and before the first of the others: cut
// at the first the lock did not take (another claim holds it, or it is not due) or that
// was reclaimed. The server compares biz nos in the column's collation, so keys that
// differ only in case are one key to it: an id of such a twin of a head cuts every run
// there (the twin is held back a claim, never let run ahead).
func (s *MySQLStore) lockRuns(ctx context.Context, q querier, o Ordering, inline int, heads []headRow, budget int) (runs [][]keyed, reads []runRead, cut bool, err error) {
	reads = make([]runRead, len(heads))
	headOf := make(map[string]int, len(heads))
	var keys []string
	for i, h := range heads {
		if h.hasNext {
			headOf[h.ev.BizNo] = i
			keys = append(keys, sqlText(h.ev.BizNo))
		} else {
			reads[i].reached = true // no run
		}
	}
	if len(keys) == 0 || budget <= 0 {
		return make([][]keyed, len(heads)), reads, len(keys) > 0, nil
	}
	limit := budget + len(keys) // the heads are read too
	rs, err := q.QueryContext(ctx, fmt.Sprintf(s.oq.runs[orderIndexOf(o)], strings.Join(keys, ", "), limit))
	if err != nil {
		return nil, nil, false, err
	}
	var (
		ids   = make([][]int64, len(heads))
		stop  = make([]int64, len(heads)) // the first SENDING or FAIL id behind the head; 0: none
		read  int                         // WAIT ids read
		twin  int64                       // the least id of a twin of a head's key; 0: none
		first = func(a, b int64) bool { return a == 0 || b < a }
	)
	for rs.Next() {
		var (
			k, status string
			id        int64
		)
		if err := rs.Scan(&k, &status, &id); err != nil {
			_ = rs.Close()
			return nil, nil, false, err
		}
		wait := status == string(StatusWait)
		if wait {
			read++
		}
		i, ok := headOf[k]
		switch {
		case !ok:
			if first(twin, id) {
				twin = id
			}
		case id <= heads[i].ev.ID:
			reads[i].reached = reads[i].reached || wait
		case wait:
			reads[i].reached = true
			ids[i] = append(ids[i], id)
		case first(stop[i], id):
			stop[i] = id
		}
	}
	if err := rs.Close(); err != nil {
		return nil, nil, false, err
	}
	truncated := read == limit // the keys the read did not reach may have runs too
	var all []int64
	for i := range ids {
		n := 0
		for n < len(ids[i]) && (stop[i] == 0 || ids[i][n] < stop[i]) && (twin == 0 || ids[i][n] < twin) {
			n++
		}
		reads[i].found = n
		n = min(n, budget-len(all))
		all = append(all, ids[i][:n]...)
		ids[i], reads[i].kept = ids[i][:n], n
	}
	runs, err = s.lockIDs(ctx, q, inline, heads, ids, all)
	if err != nil {
		return nil, nil, false, err
	}
	return runs, reads, truncated || len(all) == budget, nil
}

// learnRuns learns the mean length of the keys' runs the claim found (runRead.length), the
// head counted, over the keys whose runs it read, for the number of heads the next claim
// locks. When the heads left no room for the runs (budget), it guesses: each key with a
// run counted as a run of two (the least it can be), so that the next claim leaves room to
// read them and learns how long they are.
func (s *MySQLStore) learnRuns(heads []headRow, runs [][]keyed, reads []runRead, budget int) {
	var keys, events, withNext int
	for i, h := range heads {
		if h.hasNext {
			withNext++
		}
		if reads[i].reached {
			keys++
			events += reads[i].length(len(runs[i]))
		}
	}
	switch {
	case budget <= 0:
		s.sizing.run.Store(int64(16 + 16*withNext/len(heads)))
	case keys > 0:
		s.sizing.run.Store(int64(events) * 16 / int64(keys))
	}
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
