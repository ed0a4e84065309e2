package outbox

import (
	"fmt"
	"strings"
)

// The statements of the ordered claims (see [KeyOrder]), written against t_event_record and
// renamed to the configured table, as mysqlQueries.
//
// Every "is an earlier event of the key still open?" question is asked as "the first entry of
// (biz_no, status)": one index dive in idx_biz_no_status per status, which never reads an
// entry of a SUCCESS or SKIPPED row, however long the key's history. (A range such as
// status <> 'SUCCESS', or a correlated id < t.id, makes the server read the key's entries one
// by one, SUCCESS ones included.) FORCE INDEX: with idx_biz_no beside it, or with
// idx_status_next_retry (status = const), the optimizer may pick an index that reads the
// whole key, or every WAIT row.

// orderQueries holds the ordered statements, one per ordered mode where they differ
// (index 0: KeyOrder, 1: KeyOrderSkipDeadLetters).
type orderQueries struct {
	lockDue    [2]string // the batch claim's locking SELECT; %d: inline payload bytes, limit
	candidates [2]string // the per-row mode's SELECT; ?: limit
	claim      [2]string // the per-row claim with its atomic re-check
	gap        string    // the gap rule's lock-free read; %s: the keys' ranges
	skip       string
	blocked    string
}

// orderIndex is the index ordered claims need: the key's entries by status, then id.
const orderIndex = "idx_biz_no_status"

// orderedSelect is the ordered claim's SELECT (research note 1.2): due WAIT rows, oldest
// first, whose key lets them go, and each one's key head (the key's first WAIT id), for the
// head rule. A row qualifies when
//   - its key's first WAIT comes no later than it in the scan order (next_retry_time), so
//     that its head is in front of it in this very scan, or it is the head;
//   - nothing earlier of its key is SENDING;
//   - in KeyOrder, nothing earlier of its key is FAIL.
//
// Earlier SUCCESS and SKIPPED rows are never looked at: they are done, and done is final.
func orderedSelect(o Ordering, payload, tail string) string {
	first := func(alias, status, col string) string {
		return "(SELECT " + alias + "." + col + " FROM t_event_record " + alias + " FORCE INDEX (" + orderIndex + ")" +
			" WHERE " + alias + ".biz_no = t.biz_no AND " + alias + ".status = '" + status + "' ORDER BY " + alias + ".id LIMIT 1)"
	}
	q := `SELECT t.id, t.event_id, t.biz_no, t.event_type, ` + payload + `,
	       t.retry_count, t.next_retry_time, t.create_time, t.reclaim_count, OCTET_LENGTH(t.payload), t.trace_parent, t.trace_state,
	       TIMESTAMPDIFF(MICROSECOND, t.create_time, UTC_TIMESTAMP(3)),
	       ` + first("w", "WAIT", "id") + ` AS key_head
	FROM t_event_record t
	WHERE t.status = 'WAIT' AND t.next_retry_time <= UTC_TIMESTAMP(3)
	  AND ` + first("w", "WAIT", "next_retry_time") + ` <= t.next_retry_time
	  AND COALESCE(` + first("s", "SENDING", "id") + `, t.id) >= t.id`
	if o == KeyOrder {
		q += `
	  AND COALESCE(` + first("f", "FAIL", "id") + `, t.id) >= t.id`
	}
	return q + `
	ORDER BY t.next_retry_time ASC ` + tail
}

// openStatuses are the statuses that hold a key's later events back under o.
func openStatuses(o Ordering) string {
	if o == KeyOrderSkipDeadLetters {
		return "'WAIT', 'SENDING'"
	}
	return "'WAIT', 'SENDING', 'FAIL'"
}

func newOrderQueries(table string) orderQueries {
	r := strings.NewReplacer("t_event_record", "`"+table+"`")
	var q orderQueries
	for i, o := range []Ordering{KeyOrder, KeyOrderSkipDeadLetters} {
		q.lockDue[i] = r.Replace(orderedSelect(o, "IF(OCTET_LENGTH(t.payload) <= %d, t.payload, NULL)", "LIMIT %d\n\tFOR UPDATE SKIP LOCKED"))
		q.candidates[i] = r.Replace(orderedSelect(o, "t.payload", "LIMIT ?"))
		// The per-row claim (note 1.4): the claim statement, and no earlier open event of
		// the key, in one statement. The inner read is a derived table with LIMIT, which the
		// server materialises: MySQL refuses the target table in a plain subquery of an
		// UPDATE (error 1093), not in a materialised derived table. Its biz no and id are
		// parameters, so it is a range on (biz_no, status, id) that reads at most one entry.
		q.claim[i] = r.Replace(`UPDATE t_event_record
	SET status = 'SENDING', claim_owner = ?, claimed_at = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'WAIT' AND retry_count = ? AND next_retry_time <= UTC_TIMESTAMP(3)
	  AND NOT EXISTS (SELECT 1 FROM (SELECT e.id FROM t_event_record e FORCE INDEX (` + orderIndex + `)
	                                  WHERE e.biz_no = ? AND e.status IN (` + openStatuses(o) + `) AND e.id < ?
	                                  LIMIT 1) AS earlier)`)
	}
	// The gap rule's read: the WAIT rows of each key between its head and the last row the
	// claim holds, a range on idx_biz_no_status read from the index alone.
	q.gap = r.Replace(`SELECT biz_no, id FROM t_event_record FORCE INDEX (` + orderIndex + `)
	WHERE status = 'WAIT' AND (%s)
	ORDER BY biz_no, id`)
	q.skip = r.Replace(`UPDATE t_event_record SET status = 'SKIPPED', update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'FAIL'`)
	// Dead letters with WAIT events of their biz no behind them, each with how many: one
	// range count per FAIL row. No FORCE INDEX: the statement also serves a table without
	// idx_biz_no_status (an unordered one, where a FAIL blocks nothing but a person may
	// still ask), and with it the range (biz_no, status, id > ?) is the obvious plan.
	q.blocked = r.Replace(`SELECT * FROM (
	SELECT f.id, f.event_id, f.biz_no, f.event_type, OCTET_LENGTH(f.payload), f.status, f.retry_count, f.reclaim_count,
	       f.next_retry_time, f.claim_owner, f.claimed_at, f.last_error, f.create_time, f.update_time,
	       (SELECT COUNT(*) FROM t_event_record w WHERE w.biz_no = f.biz_no AND w.status = 'WAIT' AND w.id > f.id) AS behind
	FROM t_event_record f WHERE f.status = 'FAIL') AS d
	WHERE behind > 0 ORDER BY id LIMIT ?`)
	return q
}

// orderIndexOf is the index of o's statements in orderQueries.
func orderIndexOf(o Ordering) int {
	if o == KeyOrderSkipDeadLetters {
		return 1
	}
	return 0
}

// validOrdered checks that o is one of the ordered modes.
func validOrdered(op string, o Ordering) error {
	if o != KeyOrder && o != KeyOrderSkipDeadLetters {
		return fmt.Errorf("%w: %s: ordering %s is not an ordered mode (want KeyOrder or KeyOrderSkipDeadLetters)", ErrInvalidInput, op, o)
	}
	return nil
}
