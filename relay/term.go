package relay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"

	"github.com/go-outbox/outbox"
)

// errPositionLost ends a term whose binlog cannot be followed: the position was purged
// (error 1236), or a statement changed the outbox table in a way rows do not show (DDL,
// TRUNCATE, a statement-format insert). The next term sweeps the table.
var errPositionLost = errors.New("relay: binlog position lost")

// A term is one stretch of leadership reading one binlog stream: it sweeps the table, then
// reads the binlog from the resume position (or the position before the sweep), sends in
// commit order, marks, and checkpoints.
type term struct {
	r      *Relay
	info   serverInfo
	epoch  int64
	lock   *sql.Conn
	ctx    context.Context
	cancel context.CancelCauseFunc

	q queue
	// processed is the position (a GTID set) up to which every event is sent and marked,
	// or left WAIT in the table for a table read to pick up (a blocked key, a retry).
	processed atomic.Pointer[string]
	// pushed is the position of the last item the reader queued (the reader's own).
	pushed string
	// catchUp is the position the server had when the term's sweep ended, or later, after
	// a key's waiting events were read from the table (resumeKey): events committed up to it
	// may have been sent already (by the sweep, by that read, or by the last leader after
	// its checkpoint), so their status is read before they are sent.
	catchUp gomysql.GTIDSet

	// Only the sender goroutine uses the fields below.
	unmarked   []outbox.Event  // sent, not yet marked SUCCESS
	pendingPos string          // the position processed reaches once they are marked
	markBy     time.Time       // when they must be marked
	blocked    map[string]bool // keys held back: a dead letter (KeyOrder) or a retry not yet due
	// sending are the keys (in key order) whose rows a polling publisher held SENDING when
	// the term began: their later events wait until those rows are done (checkSending).
	sending   map[string]bool
	sendingBy time.Time // when sending is checked next
	// held are sent events whose rows another session holds locked: they are marked once
	// it lets go (markHeld at heldBy, then with a growing pause), and never sent again
	// by the term meanwhile.
	held      []outbox.Event
	heldIDs   map[int64]bool
	heldBy    time.Time
	heldPause time.Duration
	timers    timerHeap
	pause     time.Duration // the current pause after an unavailable broker
}

func newTerm(r *Relay, info serverInfo, epoch int64, lock *sql.Conn) *term {
	t := &term{r: r, info: info, epoch: epoch, lock: lock, blocked: map[string]bool{}}
	t.q.init(16 * r.cfg.BatchSize)
	return t
}

func (t *term) keyOrder() bool { return t.r.cfg.Ordering != outbox.Unordered }

// run runs the term until it fails or ctx ends.
func (t *term) run(parent context.Context, resume string) error {
	r := t.r
	t.ctx, t.cancel = context.WithCancelCause(parent)
	defer t.cancel(nil)
	from := resume
	if from == "" {
		pos, err := currentPosition(t.ctx, r.db, t.info.flavor)
		if err != nil {
			return err
		}
		from = pos
	}
	start, err := gomysql.ParseGTIDSet(t.info.flavor, from)
	if err != nil {
		return fmt.Errorf("relay: the checkpoint's position %q: %w", from, err)
	}
	t.processed.Store(&from)
	t.pushed = from
	if resume == "" {
		// The server counts a transaction in its binlog position as soon as the binlog has
		// it, a moment before the engine's commit makes its rows visible (the commits then
		// follow in binlog order): a sweep right away could miss a row whose transaction the
		// binlog read below starts after. A write of the term's own, committed after the
		// position was read, is committed after every transaction the position holds, so
		// once it returns the sweep sees them all. (Recording the position before the
		// sweep is safe: every term sweeps before it reads.)
		if err := t.checkpoint(t.ctx); err != nil {
			return err
		}
	}
	if t.r.cfg.Ordering == outbox.KeyOrder {
		if err := t.loadDeadLetterKeys(); err != nil {
			return err
		}
	}
	if t.keyOrder() {
		if err := t.loadSendingKeys(); err != nil {
			return err
		}
	}
	// The guard runs from here on: a sweep of a large table may take longer than the
	// fallback, and the heartbeat must go on meanwhile.
	var wg sync.WaitGroup
	wg.Go(t.guard)
	defer wg.Wait()
	defer t.cancel(nil)

	if err := t.sweep(); err != nil {
		return t.cause(err)
	}
	end, err := currentPosition(t.ctx, r.db, t.info.flavor)
	if err != nil {
		return t.cause(err)
	}
	if t.catchUp, err = gomysql.ParseGTIDSet(t.info.flavor, end); err != nil {
		return t.cause(err)
	}
	wg.Go(func() {
		if err := t.read(start); err != nil {
			t.cancel(err)
		}
	})
	err = t.send()
	if c := context.Cause(t.ctx); err == nil && (c == nil || errors.Is(c, context.Canceled)) {
		// A term that ends without a fault records how far it got.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = t.checkpoint(ctx)
		cancel()
	}
	return t.cause(err)
}

// cause is the reason the term ended: the first of the cancellation's cause and err.
func (t *term) cause(err error) error {
	if c := context.Cause(t.ctx); c != nil && !errors.Is(c, context.Canceled) {
		return c
	}
	if err == nil {
		return t.ctx.Err() // nil while the term runs
	}
	return err
}

// guard checks the lock and records the checkpoint (and with it the heartbeat) every
// CheckpointInterval.
func (t *term) guard() {
	tick := time.NewTicker(t.r.cfg.CheckpointInterval)
	defer tick.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return // the term's last checkpoint is run's, once the sender has marked what it sent
		case <-tick.C:
		}
		if err := t.r.stillLeader(t.ctx, t.lock); err != nil {
			t.cancel(err)
			return
		}
		if err := t.checkpoint(t.ctx); err != nil {
			t.cancel(err)
			return
		}
	}
}

// checkpoint records the processed position and the heartbeat, fenced by the epoch.
func (t *term) checkpoint(ctx context.Context) error {
	pos := *t.processed.Load()
	res, err := t.r.db.ExecContext(ctx, t.r.q.checkpoint, pos, t.r.cfg.Table, t.epoch)
	if err != nil {
		return fmt.Errorf("relay: checkpoint: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		// MySQL reports 0 for an UPDATE that changes nothing, but heartbeat_at always
		// changes (UTC_TIMESTAMP(3) moves on); 0 means the epoch moved.
		return fmt.Errorf("%w: the checkpoint row has a newer epoch", errNotLeader)
	}
	t.r.setPosition(pos)
	return nil
}

// loadDeadLetterKeys blocks the biz nos that have a dead letter (KeyOrder).
func (t *term) loadDeadLetterKeys() error {
	rows, err := t.r.db.QueryContext(t.ctx, t.r.q.failedKeys)
	if err != nil {
		return fmt.Errorf("relay: read dead-lettered keys: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return err
		}
		t.blocked[k] = true
	}
	return rows.Err()
}

// loadSendingKeys holds back, in key order, the biz nos with rows a polling publisher
// claimed before the takeover (SENDING): the takeover waited for the claims, not for their
// sends. No claim starts after it, so the set only shrinks.
func (t *term) loadSendingKeys() error {
	rows, err := t.r.db.QueryContext(t.ctx, "SELECT DISTINCT biz_no FROM "+t.r.cfg.Table+" WHERE status = 'SENDING'")
	if err != nil {
		return fmt.Errorf("relay: read the keys being sent: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return fmt.Errorf("relay: read the keys being sent: %w", err)
		}
		if t.sending == nil {
			t.sending = map[string]bool{}
			t.sendingBy = time.Now().Add(t.r.cfg.CheckpointInterval)
		}
		t.sending[k] = true
	}
	return rows.Err()
}

// checkSending releases the keys of t.sending whose rows are no longer SENDING, and sends
// their waiting events in id order.
func (t *term) checkSending() error {
	if len(t.sending) == 0 {
		return nil
	}
	keys := make([]any, 0, len(t.sending))
	for k := range t.sending {
		keys = append(keys, k)
	}
	// Under KeyOrder a row the publisher dead-lettered (FAIL) goes on blocking its key.
	open := "'SENDING'"
	if t.r.cfg.Ordering == outbox.KeyOrder {
		open = "'SENDING', 'FAIL'"
	}
	rows, err := t.r.db.QueryContext(t.ctx, fmt.Sprintf("SELECT biz_no, MAX(status = 'SENDING') FROM "+t.r.cfg.Table+
		" WHERE status IN ("+open+") AND biz_no IN (%s) GROUP BY biz_no", placeholders(len(keys))), keys...)
	if err != nil {
		return fmt.Errorf("relay: read the keys being sent: %w", err)
	}
	still := map[string]bool{}
	for rows.Next() {
		var k string
		var sending bool
		if err := rows.Scan(&k, &sending); err != nil {
			rows.Close()
			return fmt.Errorf("relay: read the keys being sent: %w", err)
		}
		if sending {
			still[k] = true
		} else {
			t.blocked[k] = true // a dead letter
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("relay: read the keys being sent: %w", err)
	}
	t.sendingBy = time.Now().Add(t.r.cfg.CheckpointInterval)
	for _, k := range keys {
		k := k.(string)
		if still[k] {
			continue
		}
		delete(t.sending, k)
		if !t.blocked[k] {
			if err := t.resumeKey(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// heldBack reports whether key's events wait (in key order): a dead letter, a retry not yet
// due, or a publisher's row still SENDING.
func (t *term) heldBack(key string) bool { return t.blocked[key] || t.sending[key] }

// currentPosition reads the server's binlog position as a GTID set.
func currentPosition(ctx context.Context, db *sql.DB, flavor string) (string, error) {
	q := "SELECT @@GLOBAL.gtid_binlog_pos"
	if flavor == gomysql.MySQLFlavor {
		q = "SELECT @@GLOBAL.gtid_executed"
	}
	var pos string
	if err := db.QueryRowContext(ctx, q).Scan(&pos); err != nil {
		return "", fmt.Errorf("relay: read the binlog position: %w", err)
	}
	return pos, nil
}

// logger is the relay's logger with the term's attributes.
func (t *term) log() *slog.Logger {
	return t.r.cfg.Logger.With(slog.String("table", t.r.cfg.Table), slog.Int64("epoch", t.epoch))
}
