package outbox

import (
	_ "embed"
	"fmt"
	"strings"
)

//go:embed schema.sql
var schemaSQL string

// The statements, written against t_event_record and renamed to the configured table.
//
// Every time is UTC_TIMESTAMP(3): the database's clock, the same for every session whatever
// its time_zone. (NOW() returns session-local time, so two instances whose connections have
// different time zones would disagree about every lease by hours.)
func newMySQLQueries(table string) mysqlQueries {
	r := strings.NewReplacer("t_event_record", "`"+table+"`")
	q := mysqlQueries{
		schema: r.Replace(schemaSQL),

		insert: r.Replace(`INSERT INTO t_event_record
	(event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, create_time, update_time,
	 trace_parent, trace_state)
	VALUES (?, ?, ?, ?, 'WAIT', 0, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), ?, ?)`),

		// Candidates only: no lock, no ownership. Several instances seeing the same row is
		// expected. Served by idx_status_next_retry.
		//
		// The last column of this and the claim's SELECT is the event's age by the database
		// clock, for the commit-to-send latency.
		candidates: r.Replace(`SELECT id, event_id, biz_no, event_type, payload, retry_count, next_retry_time, create_time,
	       reclaim_count, OCTET_LENGTH(payload), trace_parent, trace_state,
	       TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(3))
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
		// exactly those rows. Served by idx_status_next_retry. This is the claim of a backlog;
		// lockDueSteady below is the claim at a steady rate.
		//
		// A payload longer than the first %d bytes is left out (NULL) and read by the payloads
		// query once the claim has chosen its rows, so that a claim never holds more than about
		// limit times that plus maxBytes in memory, however large the payloads are.
		lockDue: r.Replace(`SELECT id, event_id, biz_no, event_type, IF(OCTET_LENGTH(payload) <= %d, payload, NULL),
	       retry_count, next_retry_time, create_time, reclaim_count, OCTET_LENGTH(payload), trace_parent, trace_state,
	       TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(3))
	FROM t_event_record
	WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)
	ORDER BY next_retry_time ASC LIMIT %d
	FOR UPDATE SKIP LOCKED`),
		// The claim at a steady rate (store_mysql_floor.go): the ids of up to n due rows by a
		// plain read of idx_status_next_retry from the scan floor (the %s: its condition, or
		// nothing), and then the rows themselves by primary key, locked, skipping those another
		// claim holds (they were counted, in n, all the same). STRAIGHT_JOIN: the ids first.
		// A locking read of the index itself would look up the clustered row of every entry
		// it passes to check for an implicit lock; the plain read mostly does not need to.
		lockDueSteady: r.Replace(`SELECT e.id, e.event_id, e.biz_no, e.event_type, IF(OCTET_LENGTH(e.payload) <= %d, e.payload, NULL),
	       e.retry_count, e.next_retry_time, e.create_time, e.reclaim_count, OCTET_LENGTH(e.payload), e.trace_parent, e.trace_state,
	       TIMESTAMPDIFF(MICROSECOND, e.create_time, UTC_TIMESTAMP(3)), c.n
	FROM (SELECT id, next_retry_time, COUNT(*) OVER () AS n FROM
	        (SELECT id, next_retry_time FROM t_event_record
	         WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)%s
	         ORDER BY next_retry_time ASC LIMIT %d) due) c
	STRAIGHT_JOIN t_event_record e ON e.id = c.id
	WHERE e.status = 'WAIT' AND e.next_retry_time <= UTC_TIMESTAMP(3)
	ORDER BY c.next_retry_time ASC
	FOR UPDATE SKIP LOCKED`),
		payloads: r.Replace(`SELECT id, payload FROM t_event_record WHERE id IN (%s)`),
		// The claim turn (see MySQLConfig.ConcurrentClaims): a named lock per database and
		// table. Lock names are server-wide and at most 64 characters, hence the hash.
		takeClaimTurn: "SELECT GET_LOCK(" + claimLockName(table) + ", %d)",
		endClaimTurn:  fmt.Sprintf("DO RELEASE_LOCK(%s)", claimLockName(table)),
		// The rows the claim locked, and the successes the claim records, in one statement:
		// a locked row (WAIT) becomes SENDING under the owner, a row of ours (SENDING, or
		// SUCCESS already) becomes SUCCESS. claimed_at is assigned before status, so that it
		// reads the old status whether the server assigns left to right (MySQL, MariaDB by
		// default) or all at once (MariaDB's SIMULTANEOUS_ASSIGNMENT). The WHERE is built by
		// claimAndAckWhere: a range on the primary key.
		claimAndAck: r.Replace(`UPDATE t_event_record
	SET claimed_at = IF(status = 'WAIT', UTC_TIMESTAMP(3), claimed_at),
	    status = IF(status = 'WAIT', 'SENDING', 'SUCCESS'),
	    claim_owner = ?, update_time = UTC_TIMESTAMP(3)
	WHERE %s`),

		// Success for a whole batch, only for the rows whose lease is still ours. A row
		// already SUCCESS under our own claim counts as marked: after a claim whose outcome
		// was unknown, the successes it carried are recorded again, and may be in already.
		markSuccessBatch: r.Replace(`UPDATE t_event_record
	SET status = 'SUCCESS', update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status IN ('SENDING', 'SUCCESS') AND claim_owner = ?`),

		// Success, only under our own lease: a late acknowledgement from an instance whose
		// lease was reclaimed (and re-sent by another) affects 0 rows and cannot overwrite
		// the true state.
		markSuccess: r.Replace(`UPDATE t_event_record
	SET status = 'SUCCESS', update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status IN ('SENDING', 'SUCCESS') AND claim_owner = ?`),

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
	       claim_owner, claimed_at, last_error, create_time, update_time, trace_parent, trace_state
	FROM t_event_record WHERE id = ?`),

		// A person's re-send of a dead letter: a fresh start, due now.
		// The claim columns are cleared as a release clears them: the row waits, nobody holds it.
		requeue: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', retry_count = 0, reclaim_count = 0, next_retry_time = UTC_TIMESTAMP(3),
	    claim_owner = '', claimed_at = '1970-01-01', update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'FAIL'`),
		requeueIDs: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', retry_count = 0, reclaim_count = 0, next_retry_time = UTC_TIMESTAMP(3),
	    claim_owner = '', claimed_at = '1970-01-01', update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'FAIL'`),

		// Retention, in two steps as the reclaim: a lock-free SELECT of old SUCCESS (then
		// SKIPPED: both final, both done for ordering) ids, then a
		// DELETE by primary key that checks the same condition again, so that the purge never
		// takes range locks on an index the claims and acknowledgements write to.
		//
		// Served by idx_status_claimed_at: a SUCCESS row keeps the claimed_at of the claim
		// that sent it, written before its update_time (the acknowledgement), so every row
		// whose update_time is older than the cutoff has an older claimed_at too. The range on
		// claimed_at finds the rows without a further index; update_time decides.
		purgeCandidates: r.Replace(`SELECT id FROM t_event_record
	WHERE status = ? AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)
	  AND update_time < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)
	ORDER BY claimed_at LIMIT ?`),
		countPurgeable: r.Replace(`SELECT COUNT(*) FROM t_event_record
	WHERE status IN ('SUCCESS', 'SKIPPED') AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)
	  AND update_time < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)`),
		purge: r.Replace(`DELETE FROM t_event_record
	WHERE id IN (%s) AND status IN ('SUCCESS', 'SKIPPED') AND update_time < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)`),
		takePurgeLock: "SELECT GET_LOCK(" + purgeLockName(table) + ", 0)",
		endPurgeLock:  "DO RELEASE_LOCK(" + purgeLockName(table) + ")",
	}
	// The insert with the values in its text (hex literals, see sqlText), which the driver
	// sends as one query: with placeholders it sends a PREPARE, an EXECUTE and a CLOSE
	// (unless the DSN sets interpolateParams), in the business transaction.
	q.insertInline = strings.ReplaceAll(q.insert, "?", "%s")
	return q
}

// claimAndAckWhere is the WHERE of the claimAndAck statement for the rows claimed and the
// successes recorded (either may be empty, not both), and the arguments it takes.
func claimAndAckWhere(claimed, succeeded []int64, owner string) (string, []any) {
	var parts []string
	args := []any{owner}
	if len(claimed) > 0 {
		parts = append(parts, "(id IN ("+idList(claimed)+") AND status = 'WAIT')")
	}
	if len(succeeded) > 0 {
		parts = append(parts, "(id IN ("+idList(succeeded)+") AND status IN ('SENDING', 'SUCCESS') AND claim_owner = ?)")
		args = append(args, owner)
	}
	return strings.Join(parts, " OR "), args
}
