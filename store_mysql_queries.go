package outbox

import (
	_ "embed"
	"strings"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

//go:embed schema.sql
var schemaSQL string

// dueMarker is the insert's next_retry_time, due at once; an event written with a delay
// has it replaced by its due time's expression (dueExpr). The comment marks the place and
// is sent as it is otherwise.
const dueMarker = "/*due*/UTC_TIMESTAMP(3)"

// The statements, written against t_event_record and renamed to the configured table.
//
// Every time is UTC_TIMESTAMP(3): the database's clock, the same for every session whatever
// its time_zone. (NOW() returns session-local time, so two instances whose connections have
// different time zones would disagree about every lease by hours.)
//
// routeTopic is the expression of a row's topic with the store's routes applied
// (mysqldialect.RouteTopic): every claim assigns it, first in its SET, so that a row written
// by a plain INSERT that named no topic has its topic from its claim on. Its values are the
// claim's first arguments.
func newMySQLQueries(table, routeTopic string) mysqlQueries {
	r := strings.NewReplacer("t_event_record", mysqldialect.Quote(table))
	q := mysqlQueries{
		routeTopic: routeTopic,
		schema:     r.Replace(schemaSQL),

		insert: r.Replace(`INSERT INTO t_event_record
	(event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, create_time, update_time,
	 trace_parent, trace_state, topic)
	VALUES (?, ?, ?, ?, 'WAIT', 0, ` + dueMarker + `, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), ?, ?, ?)`),

		// Candidates only: no lock, no ownership. Several instances seeing the same row is
		// expected. Served by idx_status_next_retry.
		//
		// The last columns of this and the claims' SELECTs are the event's age by the
		// database clock, for the commit-to-send latency, and how long after its commit it
		// was due as written (Delay, NotBefore): update_time = create_time holds until a
		// claim, a release or a person first touches the row, and next_retry_time is the
		// insert's until then.
		candidates: r.Replace(`SELECT id, event_id, biz_no, event_type, payload, retry_count, next_retry_time, create_time,
	       reclaim_count, OCTET_LENGTH(payload), trace_parent, trace_state, topic,
	       TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(3)),
	       IF(update_time = create_time, TIMESTAMPDIFF(MICROSECOND, create_time, next_retry_time), 0)
	FROM t_event_record
	WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)
	ORDER BY next_retry_time ASC LIMIT ?`),

		// The claim. status = 'WAIT' is the gate: InnoDB serialises concurrent UPDATEs of the
		// row, and once the first commits the others match nothing and affect 0 rows.
		// retry_count = ? and next_retry_time <= now go beyond the article's claim: without
		// them, a candidate read before another instance failed it and pushed it back (WAIT
		// again, retry later) would be claimed early, with a stale retry count.
		claim: r.Replace(`UPDATE t_event_record
	SET topic = ` + routeTopic + `, status = 'SENDING', claim_owner = ?, claimed_at = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3)
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
	       retry_count, next_retry_time, create_time, reclaim_count, OCTET_LENGTH(payload), trace_parent, trace_state, topic,
	       TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(3)), IF(update_time = create_time, TIMESTAMPDIFF(MICROSECOND, create_time, next_retry_time), 0)
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
	       e.retry_count, e.next_retry_time, e.create_time, e.reclaim_count, OCTET_LENGTH(e.payload), e.trace_parent, e.trace_state, e.topic,
	       TIMESTAMPDIFF(MICROSECOND, e.create_time, UTC_TIMESTAMP(3)),
	       IF(e.update_time = e.create_time, TIMESTAMPDIFF(MICROSECOND, e.create_time, e.next_retry_time), 0), c.n
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
		// table.
		takeClaimTurn: "SELECT GET_LOCK(" + mysqldialect.LockName(mysqldialect.ClaimLock, table) + ", %d)",
		endClaimTurn:  "DO RELEASE_LOCK(" + mysqldialect.LockName(mysqldialect.ClaimLock, table) + ")",
		// The rows the claim locked, and the successes the claim records, in one statement:
		// a locked row (WAIT) becomes SENDING under the owner, a row of ours (SENDING, or
		// SUCCESS already) becomes SUCCESS. claimed_at is assigned before status, so that it
		// reads the old status whether the server assigns left to right (MySQL, MariaDB by
		// default) or all at once (MariaDB's SIMULTANEOUS_ASSIGNMENT). The WHERE is built by
		// claimAndAckWhere: a range on the primary key.
		claimAndAck: r.Replace(`UPDATE t_event_record
	SET topic = ` + routeTopic + `,
	    claimed_at = IF(status = 'WAIT', UTC_TIMESTAMP(3), claimed_at),
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
		// The failure goes to the history in the same assignment list, first, so that it
		// reads the owner before the lease is cleared (the class and the reason are the
		// placeholders); releaseQuiet is the same for an event that was never tried, which
		// the history does not list.
		release: r.Replace(`UPDATE t_event_record
	SET ` + failureEntry + `,
	    status = 'WAIT', claim_owner = '', claimed_at = '1970-01-01', retry_count = ?,
	    next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND),
	    last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'SENDING' AND claim_owner = ?`),
		releaseQuiet: r.Replace(`UPDATE t_event_record
	SET status = 'WAIT', claim_owner = '', claimed_at = '1970-01-01', retry_count = ?,
	    next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND),
	    last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'SENDING' AND claim_owner = ?`),

		// Past the retry limit: dead letter, under our own lease; automatic sending stops.
		// The last failure goes to the history as in release.
		markFail: r.Replace(`UPDATE t_event_record
	SET ` + failureEntry + `,
	    status = 'FAIL', retry_count = ?, last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'SENDING' AND claim_owner = ?`),
		// The history of a dead letter, for the callback (Config.OnDeadLetter): read once the
		// dead letter is recorded, by primary key; never on the happy path.
		failuresOf: r.Replace(`SELECT failures FROM t_event_record WHERE id = ?`),

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
		// Each reclaim goes to the history, under the owner that lost the lease (read before
		// the assignment that clears it).
		reclaim: r.Replace(`UPDATE t_event_record
	SET ` + reclaimEntry + `,
	    status = 'WAIT', claim_owner = '', claimed_at = '1970-01-01', reclaim_count = reclaim_count + 1,
	    update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)`),
		// A reclaim past MaxReclaims: a poison event, dead-lettered under the same condition.
		reclaimFail: r.Replace(`UPDATE t_event_record
	SET ` + reclaimFailEntry + `,
	    status = 'FAIL', reclaim_count = reclaim_count + 1, last_error = ?, update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)`),

		// A lease renewed while its send is in flight, only under our own lease: claimed_at
		// moves to now, so the reclaim (judged by claimed_at) leaves the row for another
		// lease. Served by the primary key.
		renewLease: r.Replace(`UPDATE t_event_record SET claimed_at = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'SENDING' AND claim_owner = ?`),

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
	       claim_owner, claimed_at, last_error, create_time, update_time, trace_parent, trace_state, topic, failures
	FROM t_event_record WHERE id = ?`),

		// A person's re-send of a dead letter: a fresh start, due now, to the topic given (its
		// first placeholder), or to its own for ''. The claim columns are cleared as a release
		// clears them: the row waits, nobody holds it.
		requeue: r.Replace(`UPDATE t_event_record
	SET topic = COALESCE(NULLIF(?, ''), topic), status = 'WAIT', retry_count = 0, reclaim_count = 0,
	    next_retry_time = UTC_TIMESTAMP(3), claim_owner = '', claimed_at = '1970-01-01', update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'FAIL'`),
		requeueIDs: r.Replace(`UPDATE t_event_record
	SET topic = COALESCE(NULLIF(?, ''), topic), status = 'WAIT', retry_count = 0, reclaim_count = 0,
	    next_retry_time = UTC_TIMESTAMP(3), claim_owner = '', claimed_at = '1970-01-01', update_time = UTC_TIMESTAMP(3)
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
		// The same, within one partition's ids (id >= ? AND id < ?): the batched DELETE of a
		// partitioned table's old partitions that cannot be dropped whole yet.
		purgeCandidatesIn: r.Replace(`SELECT id FROM t_event_record
	WHERE status = ? AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)
	  AND update_time < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND) AND id >= ? AND id < ?
	ORDER BY claimed_at LIMIT ?`),
		countPurgeableIn: r.Replace(`SELECT COUNT(*) FROM t_event_record
	WHERE status IN ('SUCCESS', 'SKIPPED') AND claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)
	  AND update_time < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND) AND id >= ? AND id < ?`),
		takePurgeLock: "SELECT GET_LOCK(" + mysqldialect.LockName(mysqldialect.PurgeLock, table) + ", 0)",
		endPurgeLock:  "DO RELEASE_LOCK(" + mysqldialect.LockName(mysqldialect.PurgeLock, table) + ")",
	}
	// The insert with the values in its text (hex literals, see sqlText), which the driver
	// sends as one query: with placeholders it sends a PREPARE, an EXECUTE and a CLOSE
	// (unless the DSN sets interpolateParams), in the business transaction.
	q.insertInline = strings.ReplaceAll(q.insert, "?", "%s")
	return q
}

// The history's assignments (see schema.sql, failures). A failed send's entry takes its class
// and message as placeholders, before the statement's others; a reclaim's names the owner
// that lost the lease and says how long the lease was (the last placeholder of the
// statement, its WHERE's, is the lease again); a poison event's dead letter takes its
// reason.
var (
	failureEntry     = mysqldialect.AppendFailure(mysqldialect.FailuresColumn, "claim_owner", "?", "?")
	reclaimEntry     = mysqldialect.AppendFailure(mysqldialect.FailuresColumn, "claim_owner", "'"+mysqldialect.ClassReclaimed+"'", "'"+reclaimMessage+"'")
	reclaimFailEntry = mysqldialect.AppendFailure(mysqldialect.FailuresColumn, "claim_owner", "'"+mysqldialect.ClassReclaimed+"'", "?")
)

// reclaimMessage is a reclaim's message in the history.
const reclaimMessage = "the lease expired with no outcome recorded: the instance died, stalled or lost the database before recording the send"

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
	// The batch claim (store_mysql_order.go, lockOrdered): heads locks the keys' heads (%d:
	// inline payload bytes, the window of candidates, the heads to lock); runs reads the
	// WAIT ids of their keys and where their runs stop (%s: the keys, %d: how many WAIT
	// ids); lockRuns locks WAIT ids (%d: inline payload bytes, %s: the ids).
	heads      [2]string
	runs       [2]string
	lockRuns   string
	candidates [2]string // the per-row mode's SELECT; ?: limit
	claim      [2]string // the per-row claim with its atomic re-check
	gap        string    // the gap rule's lock-free read; %s: the keys' ranges
	skip       string
	skipIDs    string // %s: the ids
	blocked    string // ?: after id, limit
}

// orderIndex is the index ordered claims need: the key's entries by status, then id.
const orderIndex = "idx_biz_no_status"

// firstOf is the subquery "the first id (or col) of t's biz no in status": one dive into
// idx_biz_no_status that reads one entry.
func firstOf(outer, alias, status, col string) string {
	return "(SELECT " + alias + "." + col + " FROM t_event_record " + alias + " FORCE INDEX (" + orderIndex + ")" +
		" WHERE " + alias + ".biz_no = " + outer + ".biz_no AND " + alias + ".status = '" + status + "' ORDER BY " + alias + ".id LIMIT 1)"
}

// headsSelect is the batch claim's first statement in key order: it locks up to a number of
// the keys' heads, a key's head being its first WAIT event when nothing earlier of the key
// is SENDING (or, in KeyOrder, FAIL), and due. The heads are found by a plain read (the
// derived table h): due WAIT rows in scan order (next_retry_time) that head their key, at
// most a window of them; then each is locked by primary key, skipping those another claim
// holds, and checked again (WAIT, due: the read may be a moment old), until the number
// asked for is locked. Only heads are ever locked: a claim that passes other claims' keys
// neither locks nor waits for their runs. (A locking scan would lock every row it passes
// and, on MariaDB, keep the locks of the rows it rejects until it commits.)
//
// Each locked head comes with the id of its key's next WAIT event, NULL if there is none
// (then the key has no run to read), a dive made for the locked heads alone; and with n,
// how many candidates the window held, and pos, the head's place among them, from which
// the next claim sizes its window. The window's subqueries are consistent reads: a stale
// one may show a key's earlier event open that has since become done (the key waits a
// claim), never the reverse, since SUCCESS and SKIPPED are final.
func headsSelect(o Ordering) string {
	return `SELECT t.id, t.event_id, t.biz_no, t.event_type, IF(OCTET_LENGTH(t.payload) <= %d, t.payload, NULL),
	       t.retry_count, t.next_retry_time, t.create_time, t.reclaim_count, OCTET_LENGTH(t.payload), t.trace_parent, t.trace_state, t.topic,
	       TIMESTAMPDIFF(MICROSECOND, t.create_time, UTC_TIMESTAMP(3)),
	       IF(t.update_time = t.create_time, TIMESTAMPDIFF(MICROSECOND, t.create_time, t.next_retry_time), 0),
	       (SELECT x.id FROM t_event_record x FORCE INDEX (` + orderIndex + `)
	        WHERE x.biz_no = t.biz_no AND x.status = 'WAIT' AND x.id > t.id ORDER BY x.id LIMIT 1),
	       c.n, c.pos
	FROM (SELECT d.id, COUNT(*) OVER () AS n, ROW_NUMBER() OVER (ORDER BY d.next_retry_time, d.id) AS pos
	      FROM (` + headsWindow(o) + `) d) c
	STRAIGHT_JOIN t_event_record t ON t.id = c.id
	WHERE t.status = 'WAIT' AND t.next_retry_time <= UTC_TIMESTAMP(3)
	LIMIT %d
	FOR UPDATE SKIP LOCKED`
}

// headsWindow is the plain read of the heads statement's window: due WAIT rows in scan
// order that head their key, at most %d of them.
func headsWindow(o Ordering) string {
	blocked := ""
	if o == KeyOrder {
		blocked = `
	          AND COALESCE(` + firstOf("h", "f", "FAIL", "id") + `, h.id) >= h.id`
	}
	return `SELECT h.id, h.next_retry_time FROM t_event_record h
	        WHERE h.status = 'WAIT' AND h.next_retry_time <= UTC_TIMESTAMP(3)
	          AND h.id = ` + firstOf("h", "w", "WAIT", "id") + `
	          AND COALESCE(` + firstOf("h", "s", "SENDING", "id") + `, h.id) >= h.id` + blocked + `
	        ORDER BY h.next_retry_time ASC LIMIT %d`
}

// orderedSelect is the per-row mode's ordered SELECT (research note 1.2): due WAIT rows, oldest
// first, whose key lets them go, and each one's key head (the key's first WAIT id), for the
// head rule. A row qualifies when
//   - its key's first WAIT comes no later than it in the scan order (next_retry_time), so
//     that its head is in front of it in this very scan, or it is the head;
//   - nothing earlier of its key is SENDING;
//   - in KeyOrder, nothing earlier of its key is FAIL.
//
// Earlier SUCCESS and SKIPPED rows are never looked at: they are done, and done is final.
func orderedSelect(o Ordering, payload, tail string) string {
	first := func(alias, status, col string) string { return firstOf("t", alias, status, col) }
	q := `SELECT t.id, t.event_id, t.biz_no, t.event_type, ` + payload + `,
	       t.retry_count, t.next_retry_time, t.create_time, t.reclaim_count, OCTET_LENGTH(t.payload), t.trace_parent, t.trace_state, t.topic,
	       TIMESTAMPDIFF(MICROSECOND, t.create_time, UTC_TIMESTAMP(3)),
	       IF(t.update_time = t.create_time, TIMESTAMPDIFF(MICROSECOND, t.create_time, t.next_retry_time), 0),
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

// stopStatuses are the statuses of a key's events that end the run a batch claim takes
// behind the key's head under o.
func stopStatuses(o Ordering) string {
	if o == KeyOrderSkipDeadLetters {
		return "'SENDING'"
	}
	return "'SENDING', 'FAIL'"
}

// openStatuses are the statuses that hold a key's later events back under o.
func openStatuses(o Ordering) string {
	if o == KeyOrderSkipDeadLetters {
		return "'WAIT', 'SENDING'"
	}
	return "'WAIT', 'SENDING', 'FAIL'"
}

func newOrderQueries(table, routeTopic string) orderQueries {
	r := strings.NewReplacer("t_event_record", mysqldialect.Quote(table))
	var q orderQueries
	for i, o := range []Ordering{KeyOrder, KeyOrderSkipDeadLetters} {
		q.heads[i] = r.Replace(headsSelect(o))
		// The batch claim's runs: the WAIT ids of the keys whose heads the claim holds, read
		// from idx_biz_no_status alone without a lock, in index order (from each key's head
		// on, one range per key, no sort), at most as many as the claim may still take and
		// the heads themselves; and, in the same read view, the ids of their SENDING (in
		// KeyOrder also FAIL) events, where their runs stop. Then the rows of the WAIT ids
		// to take, locked, skipping any another claim holds (lockRuns); a row not due, or not
		// locked, cuts its key's run there.
		q.runs[i] = r.Replace(`(SELECT biz_no, status, id FROM t_event_record FORCE INDEX (` + orderIndex + `)
	 WHERE status = 'WAIT' AND biz_no IN (%[1]s)
	 ORDER BY biz_no, status, id LIMIT %[2]d)
	UNION ALL
	(SELECT biz_no, status, id FROM t_event_record FORCE INDEX (` + orderIndex + `)
	 WHERE status IN (` + stopStatuses(o) + `) AND biz_no IN (%[1]s))`)
		q.candidates[i] = r.Replace(orderedSelect(o, "t.payload", "LIMIT ?"))
		// The per-row claim (note 1.4): the claim statement, and no earlier open event of
		// the key, in one statement. The inner read is a derived table with LIMIT, which the
		// server materialises: MySQL refuses the target table in a plain subquery of an
		// UPDATE (error 1093), not in a materialised derived table. Its biz no and id are
		// parameters, so it is a range on (biz_no, status, id) that reads at most one entry.
		q.claim[i] = r.Replace(`UPDATE t_event_record
	SET topic = ` + routeTopic + `, status = 'SENDING', claim_owner = ?, claimed_at = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'WAIT' AND retry_count = ? AND next_retry_time <= UTC_TIMESTAMP(3)
	  AND NOT EXISTS (SELECT 1 FROM (SELECT e.id FROM t_event_record e FORCE INDEX (` + orderIndex + `)
	                                  WHERE e.biz_no = ? AND e.status IN (` + openStatuses(o) + `) AND e.id < ?
	                                  LIMIT 1) AS earlier)`)
	}
	q.lockRuns = r.Replace(`SELECT id, event_id, biz_no, event_type, IF(OCTET_LENGTH(payload) <= %d, payload, NULL),
	       retry_count, next_retry_time, create_time, reclaim_count, OCTET_LENGTH(payload), trace_parent, trace_state, topic,
	       TIMESTAMPDIFF(MICROSECOND, create_time, UTC_TIMESTAMP(3)), IF(update_time = create_time, TIMESTAMPDIFF(MICROSECOND, create_time, next_retry_time), 0)
	FROM t_event_record
	WHERE id IN (%s) AND status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)
	FOR UPDATE SKIP LOCKED`)
	// The gap rule's read: the WAIT rows of each key between its head and the last row the
	// claim holds, a range on idx_biz_no_status read from the index alone.
	q.gap = r.Replace(`SELECT biz_no, id FROM t_event_record FORCE INDEX (` + orderIndex + `)
	WHERE status = 'WAIT' AND (%s)
	ORDER BY biz_no, id`)
	q.skip = r.Replace(`UPDATE t_event_record SET status = 'SKIPPED', update_time = UTC_TIMESTAMP(3)
	WHERE id = ? AND status = 'FAIL'`)
	q.skipIDs = r.Replace(`UPDATE t_event_record SET status = 'SKIPPED', update_time = UTC_TIMESTAMP(3)
	WHERE id IN (%s) AND status = 'FAIL'`)
	// Dead letters with WAIT events of their biz no behind them, each with how many: one
	// range count per FAIL row after the page's last id. Every such FAIL row is read (the
	// FAIL range of idx_status_next_retry, then the row for its biz no) and counted before
	// the page's lowest ids are kept: the cost grows with the dead letters, never with the
	// sent history (docs/console.md, "The plans"). No FORCE INDEX: the statement also serves a table without
	// idx_biz_no_status (an unordered one, where a FAIL blocks nothing but a person may
	// still ask), and with it the range (biz_no, status, id > ?) is the obvious plan.
	q.blocked = r.Replace(`SELECT * FROM (
	SELECT f.id, f.event_id, f.biz_no, f.event_type, OCTET_LENGTH(f.payload), f.status, f.retry_count, f.reclaim_count,
	       f.next_retry_time, f.claim_owner, f.claimed_at, f.last_error, f.create_time, f.update_time, f.topic, f.failures,
	       (SELECT COUNT(*) FROM t_event_record w WHERE w.biz_no = f.biz_no AND w.status = 'WAIT' AND w.id > f.id) AS behind
	FROM t_event_record f WHERE f.status = 'FAIL' AND f.id > ?) AS d
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
