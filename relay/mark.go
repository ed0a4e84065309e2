package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
)

// errMarksFailing ends a term whose marks kept failing: the leader hands the table to the
// polling publishers (see lead).
var errMarksFailing = errors.New("relay: marking sent events SUCCESS keeps failing")

// markPauseMax is the longest pause between two tries of a failing mark, or of a mark of
// rows another session holds.
const markPauseMax = 5 * time.Second

// markStatementTimeout bounds one mark's statements.
const markStatementTimeout = 10 * time.Second

// markPauseMin is the first pause.
const markPauseMin = 100 * time.Millisecond

// noWait is MariaDB's prefix for a statement that waits on no row lock: one another session
// holds fails it at once (1205), and the statement changes nothing. MySQL has no statement
// form of it; there the marks lock their rows first (markLocking).
const noWait = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR "

// isLockWait reports a lock wait timeout or a deadlock: the statement changed nothing.
func isLockWait(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1205 || me.Number == 1213)
}

// isDenied reports an error that says the account may not do what the relay needs.
func isDenied(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1044, 1142, 1143, 1227, 1370:
		return true
	}
	return false
}

// markResult is what one mark found.
type markResult struct {
	// held are the events whose rows another session holds locked: still WAIT, not marked;
	// they are tried again later.
	held []outbox.Event
	// done counts the events found already done by another publisher (SUCCESS): sent twice.
	done int64
}

// markSent marks the sent events SUCCESS, fenced by the epoch, without waiting on a row
// another session holds: on MariaDB one statement that waits on no lock, and when that
// meets a lock, a short transaction that locks the rows first, skipping the held ones
// (SELECT ... FOR UPDATE SKIP LOCKED), and marks the others; on MySQL always the
// transaction. While it waits on no event row it holds no lock on the checkpoint row, so
// the heartbeat and the publishers' reads of that row never queue behind a held event row;
// and a mark given up on (its context ended) is rolled back, never committed later.
func (t *term) markSent(ctx context.Context, evs []outbox.Event) (markResult, error) {
	r := t.r
	// A mark under way is not abandoned when the term ends: it would go on on the server,
	// and its rows would look held by another session to the term's last mark. It waits on
	// no event row, so it ends soon.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), markStatementTimeout)
	defer cancel()
	if t.info.flavor == gomysql.MariaDBFlavor {
		args := make([]any, 0, len(evs)+3+len(r.routeArgs))
		args = append(args, r.cfg.Table, t.epoch, r.cfg.InstanceID)
		args = append(args, r.routeArgs...)
		for _, ev := range evs {
			args = append(args, ev.ID)
		}
		res, err := r.db.ExecContext(ctx, noWait+fmt.Sprintf(r.q.markSuccess, placeholders(len(evs))), args...)
		if err == nil {
			n, err := res.RowsAffected()
			if err != nil {
				return markResult{}, fmt.Errorf("relay: mark sent: %w", err)
			}
			if n < int64(len(evs)) {
				if err := t.checkEpoch(ctx); err != nil {
					return markResult{}, err
				}
				// The others were not WAIT: another publisher recorded them first.
			}
			return markResult{done: int64(len(evs)) - n}, nil
		} else if !isLockWait(err) {
			return markResult{}, fmt.Errorf("relay: mark sent: %w", err)
		}
	}
	return t.markLocking(ctx, evs)
}

// markLocking is markSent's transaction: lock the rows no other session holds, mark those
// still WAIT, commit.
func (t *term) markLocking(ctx context.Context, evs []outbox.Event) (res markResult, err error) {
	r := t.r
	tx, err := r.db.BeginTx(ctx, nil)
	if err != nil {
		return res, fmt.Errorf("relay: mark sent: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	ids := make([]any, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	rows, err := tx.QueryContext(ctx, fmt.Sprintf("SELECT id, status FROM "+r.cfg.Table+
		" FORCE INDEX (PRIMARY) WHERE id IN (%s) FOR UPDATE SKIP LOCKED", placeholders(len(evs))), ids...)
	if err != nil {
		return res, fmt.Errorf("relay: mark sent: lock the rows: %w", err)
	}
	status := make(map[int64]string, len(evs))
	for rows.Next() {
		var id int64
		var s string
		if err := rows.Scan(&id, &s); err != nil {
			rows.Close()
			return res, fmt.Errorf("relay: mark sent: lock the rows: %w", err)
		}
		status[id] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return res, fmt.Errorf("relay: mark sent: lock the rows: %w", err)
	}
	args := append([]any{r.cfg.Table, t.epoch, r.cfg.InstanceID}, r.routeArgs...)
	fixed := len(args)
	for _, ev := range evs {
		s, locked := status[ev.ID]
		switch {
		case !locked:
			res.held = append(res.held, ev)
		case s == string(outbox.StatusWait):
			args = append(args, ev.ID)
		case s == string(outbox.StatusSuccess):
			res.done++
		}
	}
	if waiting := len(args) - fixed; waiting > 0 {
		out, err := tx.ExecContext(ctx, fmt.Sprintf(r.q.markSuccess, placeholders(waiting)), args...)
		if err != nil {
			return res, fmt.Errorf("relay: mark sent: %w", err)
		}
		n, err := out.RowsAffected()
		if err != nil {
			return res, fmt.Errorf("relay: mark sent: %w", err)
		}
		if n < int64(waiting) {
			// The rows are this transaction's, WAIT: only the fence stops the update.
			err := t.checkEpoch(ctx)
			if err == nil {
				err = fmt.Errorf("relay: mark sent: %d of %d locked rows changed", n, waiting)
			}
			return res, err
		}
	}
	if err := tx.Commit(); err != nil {
		return res, fmt.Errorf("relay: mark sent: commit: %w", err)
	}
	return res, nil
}

// mark marks evs SUCCESS, trying again with a growing pause while the mark fails (the
// sender waits meanwhile; the heartbeat goes on). A mark that still fails after
// FallbackAfter, or at once when the account may not update the outbox table, ends the
// term with errMarksFailing: the leader hands the table to the publishers. The events are
// never sent again by this term. It returns the events whose rows another session holds.
func (t *term) mark(ctx context.Context, evs []outbox.Event) ([]outbox.Event, error) {
	var since time.Time
	pause := markPauseMin
	for {
		res, err := t.markSent(ctx, evs)
		if err == nil {
			t.countResent(res.done)
			return res.held, nil
		}
		if errors.Is(err, errNotLeader) || ctx.Err() != nil {
			return nil, err
		}
		if since.IsZero() {
			since = time.Now()
		}
		if isDenied(err) {
			return nil, fmt.Errorf("%w: %w: grant it UPDATE on the outbox table: GRANT UPDATE ON %s.%s TO the relay's account: %w",
				outbox.ErrInvalidConfig, errMarksFailing, t.r.conn.DBName, t.r.cfg.Table, err)
		}
		if time.Since(since) >= t.r.cfg.FallbackAfter {
			return nil, fmt.Errorf("%w for %v (FallbackAfter): %w", errMarksFailing, t.r.cfg.FallbackAfter, err)
		}
		t.log().WarnContext(ctx, "relay: could not mark sent events SUCCESS; trying again, not sending them again",
			slog.Int("events", len(evs)), slog.Duration("pause", pause), slog.Any("error", err))
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, markPauseMax)
	}
}

// hold keeps events whose rows another session holds, to mark them later. A row held at
// the first try is logged at debug: the binlog carries a transaction before its commit is
// done, so the inserting session may hold the row for a moment yet. Held again at the
// retry, it is another session's lock, and a warning.
func (t *term) hold(evs []outbox.Event) {
	if len(evs) == 0 {
		return
	}
	if t.heldIDs == nil {
		t.heldIDs = map[int64]bool{}
	}
	for _, ev := range evs {
		if !t.heldIDs[ev.ID] {
			t.heldIDs[ev.ID] = true
			t.held = append(t.held, ev)
		}
	}
	level := slog.LevelWarn
	if t.heldPause == 0 {
		t.heldPause, level = markPauseMin, slog.LevelDebug
	}
	t.heldBy = time.Now().Add(t.heldPause)
	t.log().Log(t.ctx, level, "relay: another session holds rows of sent events; marking them later",
		slog.Int("events", len(t.held)), slog.Int64("first_id", t.held[0].ID), slog.Duration("pause", t.heldPause))
}

// markHeld tries again to mark the events whose rows another session held.
func (t *term) markHeld(ctx context.Context) error {
	if len(t.held) == 0 {
		return nil
	}
	evs := t.held
	t.held, t.heldIDs = nil, nil
	still, err := t.mark(ctx, evs)
	if err != nil {
		t.held = evs
		t.heldIDs = map[int64]bool{}
		for _, ev := range evs {
			t.heldIDs[ev.ID] = true
		}
		return err
	}
	if len(still) == 0 {
		t.heldPause = 0
		return nil
	}
	t.heldPause = min(2*t.heldPause, markPauseMax)
	t.hold(still)
	return nil
}

// countResent counts events sent again.
func (t *term) countResent(n int64) {
	if n > 0 {
		t.r.counters.resent.Add(n)
		t.r.m.add(t.ctx, func(m *metrics) metric.Int64Counter { return m.resent }, n)
	}
}

// heldRow reports whether ev is a sent event whose mark waits for another session's lock:
// a read of the table finds it WAIT, but it is not to be sent again.
func (t *term) heldRow(id int64) bool { return t.heldIDs[id] }
