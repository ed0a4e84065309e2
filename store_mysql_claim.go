package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// Candidates implements [Store]. In key order the rows are read grouped by key (each key's
// events in id order, the keys oldest first), only those whose key lets them go: a key's
// later events are worth trying only once its earlier ones are claimed, sent and
// recorded, which [MySQLStore.Claim] checks again, atomically. With
// [MySQLConfig.RelayTable] it reads nothing while a relay leads; the fence against a relay
// taking over after the read is each Claim's own.
func (s *MySQLStore) Candidates(ctx context.Context, limit int) ([]Event, error) {
	if leads, err := s.relayLeads(ctx, s.db, ""); leads || err != nil {
		return nil, err
	}
	if s.ordering != Unordered {
		return s.orderedCandidates(ctx, limit)
	}
	evs, _, err := scanEvents(s.db.QueryContext(ctx, s.q.candidates, limit))
	if err != nil {
		return nil, s.wrap("select candidates", err)
	}
	s.resolveTopics(evs)
	return evs, nil
}

// scanEvents reads the rows of the candidates and lockDue queries: WAIT events, and the
// length of each one's payload (lockDue may leave a long payload out). Each event is dated
// for the commit-to-send latency: its age by the database clock, the time of the read, and
// how long after its commit it was due as written.
func scanEvents(rows *sql.Rows, err error) ([]Event, []int, error) {
	return scanEventsCounted(rows, err, nil)
}

// scanEventRow reads the columns every claim's SELECT starts with into ev (a WAIT event,
// dated as scanEvents dates it) and size, and the columns after them into more.
func scanEventRow(rows *sql.Rows, ev *Event, size *int, more ...any) error {
	*ev = Event{Status: StatusWait}
	var ageUS, deferredUS int64
	dest := append([]any{&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &ev.RetryCount,
		dbTime{&ev.NextRetryTime}, dbTime{&ev.CreateTime}, &ev.ReclaimCount, size, &ev.TraceParent, &ev.TraceState, &ev.Topic,
		&ageUS, &deferredUS}, more...)
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	ev.Read.Age, ev.Read.At = time.Duration(ageUS)*time.Microsecond, time.Now()
	ev.Read.Deferred = time.Duration(max(deferredUS, 0)) * time.Microsecond
	return nil
}

// scanEventsCounted is scanEvents for a query with one more column, a count each row
// carries (the same in every row), stored in *count.
func scanEventsCounted(rows *sql.Rows, err error, count *int) ([]Event, []int, error) {
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
		var ageUS, deferredUS int64
		dest := []any{&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &ev.RetryCount,
			dbTime{&ev.NextRetryTime}, dbTime{&ev.CreateTime}, &ev.ReclaimCount, &size, &ev.TraceParent, &ev.TraceState, &ev.Topic,
			&ageUS, &deferredUS}
		if count != nil {
			dest = append(dest, count)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, err
		}
		ev.Read.Age, ev.Read.At = time.Duration(ageUS)*time.Microsecond, time.Now()
		ev.Read.Deferred = time.Duration(max(deferredUS, 0)) * time.Microsecond
		events = append(events, ev)
		sizes = append(sizes, size)
	}
	return events, sizes, rows.Err()
}

// Claim implements [Store].
// In key order the same statement checks that no earlier event of ev's biz no is open (WAIT
// or SENDING, and FAIL under KeyOrder). With [MySQLConfig.RelayTable] it also joins the
// relay's checkpoint row at mode polling: it claims nothing once a relay took the table
// over, and a takeover waits for it (the join holds the row's shared lock until it commits).
func (s *MySQLStore) Claim(ctx context.Context, ev Event, owner string) (bool, error) {
	if s.ordering != Unordered {
		q := s.oq.claim[orderIndexOf(s.ordering)]
		if s.relay != nil {
			q = s.relay.orderedClaim[orderIndexOf(s.ordering)]
		}
		return s.execOne(ctx, "claim in key order", q, s.routed(owner, ev.ID, ev.RetryCount, ev.BizNo, ev.ID)...)
	}
	q := s.q.claim
	if s.relay != nil {
		q = s.relay.claim
	}
	return s.execOne(ctx, "claim", q, s.routed(owner, ev.ID, ev.RetryCount)...)
}

// routed returns a claim's arguments: the values of its topic expression, then args.
func (s *MySQLStore) routed(args ...any) []any {
	return append(slices.Clone(s.routeArgs), args...)
}

// resolveTopics sets the topic of each event read from a row that names none (a plain
// INSERT's): the topic the store's routes give it, which its claim writes on the row.
func (s *MySQLStore) resolveTopics(evs []Event) {
	for i := range evs {
		evs[i].Topic = s.routes.resolve(evs[i].Topic, evs[i].EventType)
	}
}

// ClaimDue implements [Store]: SELECT ... FOR UPDATE SKIP LOCKED and an UPDATE of the rows
// it locked, in one READ COMMITTED transaction (no gap locks, so the business transactions'
// inserts never wait on a claim), which also records the request's successes. The
// transaction runs on the store's claim session, a connection kept for claims (see
// [MySQLConfig.PooledClaims]), so that it costs its statements and a COMMIT. After a claim
// that took all it was allowed (a backlog), and unless [MySQLConfig.ConcurrentClaims] is set,
// the SELECT runs in this table's claim turn, which may mean waiting up to a second for
// other instances' SELECTs. While the claims keep up, the SELECT reads the due rows' ids
// first and from a floor, and locks the rows afterwards (see store_mysql_floor.go and
// [MySQLConfig.ScanFromStart]). A deadlock or lock wait timeout runs it again.
//
// Reclaimed rows keep their old next_retry_time, so after an instance died they come first:
// each is claimed alone, and while they come the claim locks only a few rows at a time
// (suspectLimit) instead of a whole batch to take one.
func (s *MySQLStore) ClaimDue(ctx context.Context, req ClaimRequest) (ClaimResult, error) {
	if req.Limit <= 0 || req.MaxBytes <= 0 {
		return ClaimResult{}, fmt.Errorf("outbox: claim due events: Limit (%d) and MaxBytes (%d) must be positive", req.Limit, req.MaxBytes)
	}
	if len(req.Succeeded) == 0 && s.relayLeadsCached() {
		return ClaimResult{}, nil // a relay publishes the table: no transaction at all
	}
	return retryOnLockConflict(ctx, s, func() (ClaimResult, error) { return s.claimDue(ctx, req) })
}

// suspectLimit is how many rows a claim locks while reclaimed rows are at the head.
const suspectLimit = 16

// minInlinePayload is the least payload size the claim's SELECT reads inline.
const minInlinePayload = 4 << 10

func (s *MySQLStore) claimDue(ctx context.Context, req ClaimRequest) (res ClaimResult, err error) {
	c, err := s.beginClaim(ctx)
	if err != nil {
		return res, s.wrap("claim due events", err)
	}
	defer c.end()
	// Every way out but a commit closes the connection, a panic's too: a claim session must
	// never keep a transaction open.
	committed := false
	defer func() {
		if !committed {
			_ = c.fail(nil)
			// Its rows stay WAIT, wherever they are in the range.
			s.floor.reset()
		}
	}()
	// While a binlog relay publishes the table, the claim only records the successes.
	leads, err := s.relayLeads(ctx, c.q, req.Owner)
	if err != nil {
		return res, c.fail(err)
	}
	if leads {
		if len(req.Succeeded) > 0 {
			if res.Succeeded, err = s.claimAndAck(ctx, c.q, nil, nil, req.Owner, req.Succeeded); err != nil {
				return ClaimResult{}, c.fail(err)
			}
		}
		if err := c.commit(); err != nil {
			return ClaimResult{}, c.fail(s.wrap("claim due events: commit", err))
		}
		committed = true
		s.backlog.Store(false)
		return res, nil
	}
	// In key order the successes are recorded first, so that the SELECT sees them done and
	// takes their keys' next events in this same claim.
	ordered := s.ordering != Unordered
	if ordered && len(req.Succeeded) > 0 {
		if res.Succeeded, err = s.recordSucceeded(ctx, c.q, req); err != nil {
			return ClaimResult{}, c.fail(err)
		}
	}
	// Taking the turn only after a claim that found a backlog: at a steady commit rate the
	// claims take a few rows each and rarely meet, and the turn would be two statements more.
	turn := turnSkipped
	if !s.concurrentClaims && s.backlog.Load() {
		if turn, err = s.takeClaimTurn(ctx, c.q); err != nil {
			return res, c.fail(err)
		}
	}
	scan := req.Limit
	if s.suspectsAhead.Load() {
		scan = min(req.Limit, suspectLimit)
	}
	inline := max(req.MaxBytes/req.Limit, minInlinePayload)
	var (
		evs           []Event
		sizes         []int
		more, suspect bool
		readAt        time.Time // the unordered SELECT's, by the database clock; zero if it read no row
	)
	if ordered {
		evs, sizes, more, suspect, err = s.lockOrdered(ctx, c.q, s.ordering, inline, scan, req.Limit, req.MaxBytes, req.Ahead)
	} else {
		evs, sizes, more, err = s.lockUnordered(ctx, c.q, inline, scan)
		if len(evs) > 0 {
			readAt = evs[0].CreateTime.Add(evs[0].Read.Age)
		}
	}
	if turn == turnTaken {
		if endErr := s.endClaimTurn(ctx, c.q); endErr != nil {
			err = errors.Join(err, endErr)
		}
	}
	if err != nil {
		return res, c.fail(err)
	}
	if turn == turnFailed {
		// A session whose GET_LOCK failed may hold the lock all the same, and would keep it
		// where no other instance's claim could get it: the connection is closed once the
		// claim is done.
		defer func() { _ = c.fail(nil) }()
	}
	if !ordered {
		var n int
		n, suspect = claimable(evs, sizes, req.MaxBytes)
		more = more || n < len(evs)
		evs = evs[:n] // the other rows stay WAIT; their locks end with the transaction
	}
	s.suspectsAhead.Store(suspect)
	res.More = more
	s.backlog.Store(res.More)
	ack := req.Succeeded
	if ordered {
		ack = nil // recorded before the SELECT
	}
	if len(evs) > 0 || len(ack) > 0 {
		acked, err := s.claimAndAck(ctx, c.q, evs, sizes, req.Owner, ack)
		if err != nil {
			return ClaimResult{}, c.fail(err)
		}
		if !ordered {
			res.Succeeded = acked
		}
	}
	if err := c.commit(); err != nil {
		// The outcome is unknown: the rows may be SENDING under owner. The publisher
		// releases its own rows before it claims again (Store.ReleaseOwned).
		return ClaimResult{}, c.fail(s.wrap("claim due events: commit", err))
	}
	committed = true
	if !ordered {
		s.floor.done(readAt, !more && !suspect)
	}
	for i := range evs {
		evs[i].Status, evs[i].ClaimOwner = StatusSending, req.Owner
		if evs[i].Payload == nil {
			evs[i].Payload = []byte{}
		}
	}
	s.resolveTopics(evs)
	res.Events = evs
	return res, nil
}

// lockUnordered locks up to scan due rows in the claim's transaction, and says whether more
// may be due (it found as many as it was allowed). While the claims keep up it reads the ids
// first, from the floor (see store_mysql_floor.go); in a backlog it locks as it scans.
func (s *MySQLStore) lockUnordered(ctx context.Context, q querier, inline, scan int) (evs []Event, sizes []int, more bool, err error) {
	if s.scanFromStart || s.backlog.Load() {
		s.floor.fromStart(time.Now())
		evs, sizes, err = scanEvents(q.QueryContext(ctx, fmt.Sprintf(s.q.lockDue, inline, scan)))
		more = len(evs) == scan
	} else {
		// found is how many due rows the read found, locked by another claim or not.
		var found int
		rows, qerr := q.QueryContext(ctx, fmt.Sprintf(s.q.lockDueSteady, inline, s.floor.begin(time.Now()).cond(), scan))
		evs, sizes, err = scanEventsCounted(rows, qerr, &found)
		more = found == scan
	}
	if err != nil {
		return nil, nil, false, s.wrap("lock due events", err)
	}
	return evs, sizes, more, nil
}

// claimAndAck claims for owner the rows the claim's SELECT locked and marks SUCCESS the
// events of succeeded that are still owner's, with one statement, and reads the payloads the
// SELECT left out. It returns how many successes it marked.
func (s *MySQLStore) claimAndAck(ctx context.Context, q querier, evs []Event, sizes []int, owner string, succeeded []int64) (int64, error) {
	ids := make([]int64, len(evs))
	var long []int64 // rows whose payload the SELECT left out
	for i, ev := range evs {
		ids[i] = ev.ID
		if ev.Payload == nil && sizes[i] > 0 {
			long = append(long, ev.ID)
		}
	}
	where, args := claimAndAckWhere(ids, succeeded, owner)
	res, err := q.ExecContext(ctx, fmt.Sprintf(s.q.claimAndAck, where), s.routed(args...)...)
	if err != nil {
		return 0, s.wrap("claim due events", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, s.wrap("claim due events", err)
	}
	// The claimed rows were locked by this transaction, WAIT: each one changed.
	acked := n - int64(len(evs))
	if acked < 0 || acked > int64(len(succeeded)) {
		return 0, fmt.Errorf("outbox: claim due events: %d rows changed for %d locked rows and %d successes", n, len(evs), len(succeeded))
	}
	if len(long) > 0 {
		if err := s.readPayloads(ctx, q, evs, long); err != nil {
			return 0, err
		}
	}
	return acked, nil
}

// claimable says how many of the locked rows, in order, one claim takes: a reclaimed row at
// the head alone; otherwise the rows before the first reclaimed one, as long as their
// payloads add up to at most maxBytes (the first row always). suspect reports that the claim
// stopped at (or took) a reclaimed row, so more may follow.
func claimable(evs []Event, sizes []int, maxBytes int) (n int, suspect bool) {
	if len(evs) == 0 {
		return 0, false
	}
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
func (s *MySQLStore) readPayloads(ctx context.Context, q querier, evs []Event, ids []int64) error {
	rows, err := q.QueryContext(ctx, fmt.Sprintf(s.q.payloads, idList(ids)))
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

// MarkSuccess implements [Store].
func (s *MySQLStore) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	switch len(ids) {
	case 0:
		return 0, nil
	case 1:
		return s.exec(ctx, "mark success", s.q.markSuccess, ids[0], owner)
	}
	return s.exec(ctx, "mark success", fmt.Sprintf(s.q.markSuccessBatch, idList(ids)), owner)
}

// ReleaseForRetry implements [Store].
func (s *MySQLStore) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, class, reason string) (bool, error) {
	reason = truncateReason(reason)
	if class == "" {
		return s.execOne(ctx, "release for retry", s.q.releaseQuiet, retryCount, delay.Microseconds(), reason, id, owner)
	}
	return s.execOne(ctx, "release for retry", s.q.release,
		class, reason, retryCount, delay.Microseconds(), reason, id, owner)
}

// MarkFail implements [Store]. The history is read after the dead letter, by primary key: a
// statement of the failure path only.
func (s *MySQLStore) MarkFail(ctx context.Context, id int64, owner string, retryCount int, class, reason string) ([]Failure, bool, error) {
	reason = truncateReason(reason)
	ok, err := s.execOne(ctx, "mark fail", s.q.markFail, class, reason, retryCount, reason, id, owner)
	if err != nil || !ok {
		return nil, ok, err
	}
	var v sql.NullString
	if err := s.db.QueryRowContext(ctx, s.q.failuresOf, id).Scan(&v); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, true, s.wrap("mark fail: read the failure history", err)
	}
	return parseFailures(v.String), true, nil
}

// parseFailures reads the failures column (see mysqldialect.ParseFailures).
func parseFailures(v string) []Failure {
	fs := mysqldialect.ParseFailures(v)
	if len(fs) == 0 {
		return nil
	}
	out := make([]Failure, len(fs))
	for i, f := range fs {
		out[i] = Failure(f)
	}
	return out
}
