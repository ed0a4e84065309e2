package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"
)

// Candidates implements [Store].
func (s *MySQLStore) Candidates(ctx context.Context, limit int) ([]Event, error) {
	evs, _, err := scanEvents(s.db.QueryContext(ctx, s.q.candidates, limit))
	if err != nil {
		return nil, s.wrap("select candidates", err)
	}
	return evs, nil
}

// scanEvents reads the rows of the candidates and lockDue queries: WAIT events, and the
// length of each one's payload (lockDue may leave a long payload out). Each event is dated
// for the commit-to-send latency: its age by the database clock, and the time of the read.
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
		var ageUS int64
		if err := rows.Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &ev.RetryCount,
			dbTime{&ev.NextRetryTime}, dbTime{&ev.CreateTime}, &ev.ReclaimCount, &size, &ev.TraceParent, &ev.TraceState, &ageUS); err != nil {
			return nil, nil, err
		}
		ev.storeAge, ev.readAt = time.Duration(ageUS)*time.Microsecond, time.Now()
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
