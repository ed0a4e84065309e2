package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// The claim session is a connection a store keeps for its batch claims, set once to READ
// COMMITTED with autocommit off. A claim on it is its own statements and a COMMIT: no SET
// TRANSACTION and no BEGIN each time, which at a steady commit rate are a third of what a
// claim costs the server. The connection never goes back to the pool, where its settings
// would reach the service's own statements: it is closed after sessionIdle without a claim,
// after any error, and when a publisher of the store stops.
type claimSession struct {
	mu    sync.Mutex // held by the claim on the session
	conn  *sql.Conn  // nil: none open
	used  time.Time  // the end of the last claim on it
	timer *time.Timer
}

// sessionIdle is how long the claim session stays open without a claim.
const sessionIdle = 2 * time.Second

// minSessionPool is the smallest MaxOpenConns a store keeps a claim session in: a smaller
// pool would lose too large a part of itself to the publisher.
const minSessionPool = 4

// claimTx is one claim's transaction: on the claim session, or on a pooled connection of its
// own. Every path ends in end; fail closes the connection rather than reusing it (the
// server rolls back what it holds).
type claimTx struct {
	q      querier
	commit func() error
	fail   func(err error) error // rolls back, closes the connection, and returns err
	end    func()
}

// querier is what a claim needs of a connection or a transaction.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// beginClaim starts a claim transaction: on the claim session if the store keeps one and no
// other claim of the store is using it, else on a pooled connection.
func (s *MySQLStore) beginClaim(ctx context.Context) (*claimTx, error) {
	if !s.pooledClaims && s.session.mu.TryLock() {
		c, err := s.sessionClaim(ctx)
		if c == nil {
			s.session.mu.Unlock()
		}
		if c != nil || err != nil {
			return c, err
		}
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return &claimTx{
		q:      tx,
		commit: tx.Commit,
		fail: func(err error) error {
			err = errors.Join(err, ignoreDone(tx.Rollback()))
			discardConn(conn)
			return err
		},
		end: func() { _ = conn.Close() },
	}, nil
}

// sessionClaim starts a claim on the claim session, opening it if needed; the caller holds
// session.mu. It returns nil and no error when the pool is too small to keep a session.
func (s *MySQLStore) sessionClaim(ctx context.Context) (*claimTx, error) {
	ss := &s.session
	if ss.conn == nil {
		if n := s.db.Stats().MaxOpenConnections; n > 0 && n < minSessionPool {
			return nil, nil
		}
		conn, err := s.db.Conn(ctx)
		if err == nil {
			_, err = conn.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
		}
		if err == nil {
			_, err = conn.ExecContext(ctx, "SET autocommit = 0")
		}
		if err != nil {
			if conn != nil {
				discardConn(conn)
			}
			return nil, err
		}
		ss.conn = conn
		if ss.timer == nil {
			ss.timer = time.AfterFunc(sessionIdle, s.closeIdleSession)
		}
	}
	conn := ss.conn
	return &claimTx{
		q: conn,
		commit: func() error {
			_, err := conn.ExecContext(ctx, "COMMIT")
			return err
		},
		fail: func(err error) error {
			// Closing the connection rolls back on the server; a ROLLBACK first would be a
			// statement more on a connection that may be broken.
			discardConn(conn)
			ss.conn = nil
			return err
		},
		end: func() {
			ss.used = time.Now()
			ss.timer.Reset(sessionIdle)
			ss.mu.Unlock()
		},
	}, nil
}

// closeIdleSession closes the claim session once it has gone sessionIdle without a claim.
func (s *MySQLStore) closeIdleSession() {
	ss := &s.session
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.conn == nil {
		return
	}
	if idle := time.Since(ss.used); idle < sessionIdle {
		ss.timer.Reset(sessionIdle - idle)
		return
	}
	discardConn(ss.conn)
	ss.conn = nil
}

// closeClaimSession closes the claim session, if one is open: the store's last subscribed
// publisher stopped.
func (s *MySQLStore) closeClaimSession() {
	ss := &s.session
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.conn != nil {
		discardConn(ss.conn)
		ss.conn = nil
	}
}

// discardConn closes conn instead of returning it to the pool.
func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

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
	case mysqldialect.ErrServerShutdown, mysqldialect.ErrConnectionKilled, mysqldialect.ErrClientInteractionTimeout:
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
