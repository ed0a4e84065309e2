package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
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
func (s *MySQLStore) takeClaimTurn(ctx context.Context, q querier) (claimTurn, error) {
	if time.Since(s.born) < time.Duration(s.turnsPausedUntil.Load()) {
		return turnSkipped, nil
	}
	var got sql.NullInt64 // 1: ours; 0: timed out; NULL: an error such as a killed wait
	query := fmt.Sprintf(s.q.takeClaimTurn, int(s.claimTurnWait/time.Second))
	err := q.QueryRowContext(ctx, query).Scan(&got)
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
func (s *MySQLStore) endClaimTurn(ctx context.Context, q querier) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_, err := q.ExecContext(ctx, s.q.endClaimTurn)
	return s.wrap("claim due events: release the claim lock", err)
}

// claimLockName is the SQL expression naming the claim lock of table in the session's
// database.
func claimLockName(table string) string {
	return fmt.Sprintf("CONCAT('outbox-claim:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', '%s')))", table)
}
