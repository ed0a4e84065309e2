package relay

import (
	"container/heap"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// send takes the reader's items in commit order and delivers them, until the term ends;
// then it marks what it sent.
func (t *term) send() error {
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		err := t.flush(ctx)
		if err == nil {
			err = t.markHeld(ctx)
		}
		if n := len(t.unmarked) + len(t.held); n > 0 {
			// Sent, and WAIT in the table: whoever publishes the table next sends them again.
			t.countResent(int64(n))
			t.log().WarnContext(ctx, "relay: could not mark the last events sent; the next publisher sends them again",
				slog.Int("events", n), slog.Any("error", err))
		}
	}()
	for {
		var wait <-chan time.Time
		var timer *time.Timer
		next, ok := t.timers.next()
		for _, d := range []struct {
			at time.Time
			on bool
		}{{t.markBy, len(t.unmarked) > 0}, {t.heldBy, len(t.held) > 0}, {t.sendingBy, len(t.sending) > 0}} {
			if d.on && (!ok || d.at.Before(next)) {
				next, ok = d.at, true
			}
		}
		if ok {
			timer = time.NewTimer(time.Until(next))
			wait = timer.C
		}
		fired := false
		select {
		case <-t.ctx.Done():
		case <-wait:
			fired = true
		case <-t.q.wake:
		}
		if timer != nil {
			timer.Stop()
		}
		if t.ctx.Err() != nil {
			return nil
		}
		if fired {
			if len(t.unmarked) > 0 && !time.Now().Before(t.markBy) {
				if err := t.flush(t.ctx); err != nil {
					return err
				}
			}
			if len(t.held) > 0 && !time.Now().Before(t.heldBy) {
				if err := t.markHeld(t.ctx); err != nil {
					return err
				}
			}
			if len(t.sending) > 0 && !time.Now().Before(t.sendingBy) {
				if err := t.checkSending(); err != nil {
					return err
				}
			}
			if err := t.fire(); err != nil {
				return err
			}
			continue
		}
		for t.q.len() > 0 {
			if err := t.deliverItems(t.q.take(t.r.cfg.BatchSize)); err != nil {
				return err
			}
			if t.ctx.Err() != nil {
				return nil
			}
		}
	}
}

// deliverItems delivers consecutive items: their inserted events in one batch, then what
// else they carry, and advances the processed position past the last.
func (t *term) deliverItems(items []item) error {
	var (
		fresh, known []outbox.Event // after the catch-up position, and up to it
		// In key order, the biz nos of rows an earlier item inserted not due yet: their
		// events in later items stay WAIT, for the reread of the delayed row to hold back
		// with it (it reads the key's waiting events in id order).
		held map[string]bool
	)
	for _, it := range items {
		for _, owner := range it.claimed {
			t.log().ErrorContext(t.ctx, "relay: a polling publisher claims rows of a relayed table: set its MySQLConfig.RelayTable so it stands by while the relay leads; events may be sent twice meanwhile",
				slog.String("claim_owner", owner))
		}
		evs := it.events
		if len(held) > 0 {
			evs = slices.DeleteFunc(slices.Clone(evs), func(ev outbox.Event) bool { return held[ev.BizNo] })
		}
		if t.caughtUp(it.pos) {
			fresh = append(fresh, evs...)
		} else {
			known = append(known, evs...)
		}
		if t.keyOrder() && len(it.held) > 0 {
			if held == nil {
				held = map[string]bool{}
			}
			for _, k := range it.held {
				held[k] = true
			}
		}
	}
	if len(known) > 0 {
		if err := t.deliver(known, true); err != nil {
			return err
		}
	}
	if len(fresh) > 0 {
		if err := t.deliver(fresh, false); err != nil {
			return err
		}
	}
	for _, it := range items {
		for _, k := range it.unblock {
			if t.r.cfg.Ordering == outbox.KeyOrder && t.blocked[k] {
				delete(t.blocked, k)
				if err := t.resumeKey(k); err != nil {
					return err
				}
			}
		}
		if len(it.reread) > 0 {
			if err := t.reread(it.reread); err != nil {
				return err
			}
		}
		if it.hazard != "" {
			return fmt.Errorf("%w: a statement changed the outbox table in a way its rows do not show: %.200s", errPositionLost, it.hazard)
		}
	}
	last := items[len(items)-1].pos
	if len(t.unmarked) > 0 {
		t.pendingPos = last
		return nil
	}
	t.processed.Store(&last)
	return nil
}

// caughtUp reports whether a transaction ending at pos committed after the term's sweep.
func (t *term) caughtUp(pos string) bool {
	if t.catchUp == nil {
		return true
	}
	set, err := gomysql.ParseGTIDSet(t.info.flavor, pos)
	if err != nil {
		return false
	}
	if t.catchUp.Contain(set) {
		return false
	}
	t.catchUp = nil // every later transaction is later still
	return true
}

// deliver sends evs in order (checking first that they still wait, when check), marks the
// sent ones SUCCESS and records the failures. It returns once every event is sent, written
// as a retry or a dead letter, or held back for its key; only the term's end or a database
// failure stops it sooner.
func (t *term) deliver(evs []outbox.Event, check bool) error {
	evs = t.unblocked(evs)
	if check && len(evs) > 0 {
		if err := t.flush(t.ctx); err != nil {
			return err
		}
		var err error
		if evs, err = t.stillWaiting(evs); err != nil {
			return err
		}
	}
	for start := 0; start < len(evs); start += t.r.cfg.BatchSize {
		if err := t.sendBatch(evs[start:min(start+t.r.cfg.BatchSize, len(evs))]); err != nil {
			return err
		}
	}
	return nil
}

// unblocked drops the events of held-back keys (in key order): they stay WAIT, and the
// key's release reads them from the table.
func (t *term) unblocked(evs []outbox.Event) []outbox.Event {
	if !t.keyOrder() || len(t.blocked) == 0 && len(t.sending) == 0 {
		return evs
	}
	return slices.DeleteFunc(slices.Clone(evs), func(ev outbox.Event) bool { return t.heldBack(ev.BizNo) })
}

func (t *term) sendBatch(pending []outbox.Event) error {
	r := t.r
	for i := range pending {
		pending[i].Topic = r.cfg.Routes.TopicOf(pending[i]) // a plain INSERT's row names none
	}
	info := r.sender.Info()
	timeout := r.cfg.SendTimeout
	if info.SendTimeout > 0 {
		timeout = info.SendTimeout
	}
	for len(pending) > 0 {
		if err := t.ctx.Err(); err != nil {
			return nil
		}
		// A send once begun is not cut by the stop: it ends within its timeout, answered,
		// and what it sent is marked (a send cut half way may have reached the broker, and
		// reads as one that timed out).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(t.ctx), timeout)
		errs := outbox.Dispatch(ctx, r.sender, pending, r.info)
		cancel()
		var sent []outbox.Event
		var next []outbox.Event
		unavailable := false
		anySent := slices.ContainsFunc(errs, stored)
		for i, ev := range pending {
			err := errs[i]
			switch {
			case stored(err):
				sent = append(sent, ev)
			case errors.Is(err, outbox.ErrNotSent):
				next = append(next, ev)
			case outage(err) && r.cfg.Ordering != outbox.Unordered && anySent:
				// In key order a biz no's events go to its queue only: a queue away (its
				// broker down) while others took their events says nothing about the
				// message, and holds its key alone.
				if err := t.queueAway(ev, err); err != nil {
					return err
				}
			case outage(err) && len(sent) == 0:
				unavailable = true
				next = append(next, ev)
			default:
				if err := t.failed(ev, err); err != nil {
					return err
				}
			}
		}
		if err := t.sent(sent); err != nil {
			return err
		}
		// A key whose event failed goes no further in this round.
		pending = t.unblocked(next)
		if unavailable || len(sent) == 0 && len(pending) > 0 {
			if t.ctx.Err() != nil {
				return nil // stopped: what is left stays WAIT for whoever publishes next
			}
			t.pause = min(max(2*t.pause, 100*time.Millisecond), 5*time.Second)
			t.log().WarnContext(t.ctx, "relay: the broker is unavailable; retrying without counting attempts",
				slog.Int("events", len(pending)), slog.Duration("pause", t.pause), slog.Any("error", firstErr(errs)))
			select {
			case <-t.ctx.Done():
				return nil
			case <-time.After(t.pause):
			}
		} else {
			t.pause = 0
		}
	}
	return nil
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// markDelay is the longest a sent event waits to be marked SUCCESS: at a steady rate the
// events of many sends are marked by one statement. A failover resends at most this much
// more (and the checkpoint never passes an event not yet marked).
const markDelay = 50 * time.Millisecond

// sent records events the broker accepted; they are marked SUCCESS within markDelay.
func (t *term) sent(evs []outbox.Event) error {
	if len(evs) == 0 {
		return nil
	}
	t.r.counters.sent.Add(int64(len(evs)))
	t.r.m.sentEvents(t.ctx, evs)
	if len(t.unmarked) == 0 {
		t.markBy = time.Now().Add(markDelay)
	}
	t.unmarked = append(t.unmarked, evs...)
	if len(t.unmarked) >= 4*t.r.cfg.BatchSize {
		return t.flush(t.ctx)
	}
	return nil
}

// flush marks the sent events SUCCESS and lets the processed position move on. Events whose
// rows another session holds are kept to be marked later (markHeld): the position moves on
// past them all the same, as the next term's sweep sends them again if they are still WAIT.
func (t *term) flush(ctx context.Context) error {
	for len(t.unmarked) > 0 {
		n := min(len(t.unmarked), 1000)
		held, err := t.mark(ctx, t.unmarked[:n])
		if err != nil {
			return err
		}
		t.hold(held)
		t.unmarked = t.unmarked[n:]
	}
	t.unmarked = nil
	if t.pendingPos != "" {
		pos := t.pendingPos
		t.processed.Store(&pos)
		t.pendingPos = ""
	}
	return nil
}

// failed records a failed send: a retry after the backoff, or a dead letter once the
// attempts are spent or the error is permanent. In key order the key is held back.
func (t *term) failed(ev outbox.Event, cause error) error {
	r := t.r
	attempt := ev.RetryCount + 1
	// Valid UTF-8, as the columns (and JSON_OBJECT, for the history) take only that.
	reason := strings.ToValidUTF8(cause.Error(), "?")
	class := mysqldialect.ClassRetryable
	if outbox.IsPermanent(cause) {
		class = mysqldialect.ClassPermanent
	}
	delay, dead := outbox.RetryPolicy{MaxAttempts: r.cfg.MaxAttempts, Backoff: r.cfg.Backoff, MaxBackoff: r.cfg.MaxBackoff}.Next(attempt, cause)
	if dead {
		if ok, err := t.writeFailure(ev, "dead letter", r.q.fail, append([]any{r.cfg.Table, t.epoch, r.cfg.InstanceID, class, reason,
			attempt, reason, r.cfg.InstanceID}, r.routeArgs...)...); !ok {
			return err
		}
		r.counters.deadLettered.Add(1)
		r.m.deadLetter(t.ctx, ev, cause)
		t.log().ErrorContext(t.ctx, "relay: event dead-lettered", slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID),
			slog.String("biz_no", ev.BizNo), slog.Int("retry_count", attempt), slog.Bool("permanent", outbox.IsPermanent(cause)),
			slog.Any("error", cause))
		if r.cfg.Ordering == outbox.KeyOrder {
			t.blocked[ev.BizNo] = true
		}
		if r.cfg.OnDeadLetter != nil {
			ev.Status, ev.RetryCount, ev.LastError = outbox.StatusFail, attempt, reason
			ev.Failures = t.failures(ev.ID)
			r.dead.call(t.ctx, ev, cause)
		}
		return nil
	}
	if ok, err := t.writeFailure(ev, "retry", r.q.retry, r.cfg.Table, t.epoch, r.cfg.InstanceID, class, reason,
		attempt, reason, delay.Microseconds()); !ok {
		return err
	}
	r.counters.retried.Add(1)
	r.m.retry(t.ctx, ev)
	t.log().WarnContext(t.ctx, "relay: send failed, will retry", slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID),
		slog.String("biz_no", ev.BizNo), slog.Int("retry_count", attempt), slog.Duration("backoff", delay), slog.Any("error", cause))
	t.later(ev, delay)
	return nil
}

// stored reports whether a send's error says the broker stored the event: none, or
// [outbox.ErrUnconfirmed].
func stored(err error) bool { return err == nil || errors.Is(err, outbox.ErrUnconfirmed) }

// queueAwayDelay is how long, in key order, an event whose queue was unavailable while
// other queues took their events waits before it is sent again.
const queueAwayDelay = time.Second

// queueAway puts back an event whose queue was unavailable while other queues took the
// round's other events (key order, one of the brokers away): no attempt counted, its key
// held back, tried again after queueAwayDelay, as the publisher does.
func (t *term) queueAway(ev outbox.Event, cause error) error {
	r := t.r
	reason := strings.ToValidUTF8("its queue unavailable: "+cause.Error(), "?")
	if ok, err := t.writeFailure(ev, "release", r.q.retry, r.cfg.Table, t.epoch, r.cfg.InstanceID, mysqldialect.ClassUnavailable, reason,
		ev.RetryCount, reason, queueAwayDelay.Microseconds()); !ok {
		return err
	}
	t.log().DebugContext(t.ctx, "relay: event's queue unavailable; its key waits", slog.Int64("id", ev.ID),
		slog.String("event_id", ev.EventID), slog.String("biz_no", ev.BizNo), slog.Any("error", cause))
	t.later(ev, queueAwayDelay)
	return nil
}

// writeFailure runs q, a write of a failed send's outcome, on ev's row, and reports whether
// it wrote; when it did not, the error is what the caller returns: nil once another session
// holding the row is dealt with, or the term's end if it lost the table.
func (t *term) writeFailure(ev outbox.Event, what, q string, args ...any) (bool, error) {
	n, err := t.exec(what, q, ev.ID, args...)
	switch {
	case isLockWait(err):
		return false, t.rowHeld(ev, err)
	case err != nil:
		return false, err
	case n == 0:
		return false, t.checkEpoch(t.ctx)
	}
	return true, nil
}

// failures reads a dead letter's failure history, this failure last, for OnDeadLetter: a
// read of the failure path only. A read that fails leaves the history out (and says so in
// the log): the dead letter is recorded, and the callback is called all the same.
func (t *term) failures(id int64) []outbox.Failure {
	var v sql.NullString
	if err := t.r.db.QueryRowContext(t.ctx, t.r.q.failuresOf, id).Scan(&v); err != nil {
		t.log().WarnContext(t.ctx, "relay: could not read a dead letter's failure history; the callback gets none",
			slog.Int64("id", id), slog.Any("error", err))
		return nil
	}
	fs := mysqldialect.ParseFailures(v.String)
	if len(fs) == 0 {
		return nil
	}
	out := make([]outbox.Failure, len(fs))
	for i, f := range fs {
		out[i] = outbox.Failure(f)
	}
	return out
}

// rowHeld handles a failed send whose row another session holds: nothing is written, and
// the row is looked at again (and, still WAIT and due, sent again) after markPauseMax.
func (t *term) rowHeld(ev outbox.Event, err error) error {
	t.log().WarnContext(t.ctx, "relay: another session holds the row of a failed send; looking at it again later",
		slog.Int64("id", ev.ID), slog.Duration("after", markPauseMax), slog.Any("error", err))
	t.later(ev, markPauseMax)
	return nil
}

// later schedules a look at ev after d (by the database clock's delay): in key order its
// whole key is held back until then.
func (t *term) later(ev outbox.Event, d time.Duration) {
	at := time.Now().Add(d)
	if t.keyOrder() {
		t.blocked[ev.BizNo] = true
		heap.Push(&t.timers, timer{at: at, key: ev.BizNo, keyed: true})
		return
	}
	heap.Push(&t.timers, timer{at: at, id: ev.ID})
}

// fire handles the timers that are due.
func (t *term) fire() error {
	var ids []int64
	for {
		next, ok := t.timers.next()
		if !ok || next.After(time.Now()) {
			break
		}
		tm := heap.Pop(&t.timers).(timer)
		if tm.keyed {
			delete(t.blocked, tm.key)
			if err := t.resumeKey(tm.key); err != nil {
				return err
			}
			continue
		}
		ids = append(ids, tm.id)
	}
	if len(ids) > 0 {
		return t.reread(ids)
	}
	return nil
}

// reread reads rows that became WAIT and delivers those due; the others are looked at again
// when they are due.
func (t *term) reread(ids []int64) error {
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for start := 0; start < len(ids); start += t.r.cfg.BatchSize {
		evs, err := t.readWaiting(ids[start:min(start+t.r.cfg.BatchSize, len(ids))])
		if err != nil {
			return err
		}
		if t.keyOrder() {
			// A key's event that became WAIT may have later events parked: the key's
			// waiting events are read and sent in order.
			keys := map[string]bool{}
			for _, ev := range evs {
				if !t.heldBack(ev.ev.BizNo) && !keys[ev.ev.BizNo] {
					keys[ev.ev.BizNo] = true
					if err := t.resumeKey(ev.ev.BizNo); err != nil {
						return err
					}
				}
			}
			continue
		}
		if err := t.deliver(t.due(evs), false); err != nil {
			return err
		}
	}
	return nil
}

// resumeKey reads a key's waiting events in id order and delivers the due ones, up to the
// first that is not due (which holds the key back until it is).
//
// The read finds every committed event of the key, also those whose transactions the
// binlog reader has not handed over yet; sent now, they would be sent again when their
// items come. So the items up to the server's position after the read are checked against
// the table before they are sent, as the items up to the end of the sweep are.
func (t *term) resumeKey(key string) error {
	evs, err := t.readEvents(t.r.q.keyWaiting, key)
	if err != nil {
		return err
	}
	due := t.due(evs)
	if len(due) > 0 {
		pos, err := currentPosition(t.ctx, t.r.db, t.info.flavor)
		if err != nil {
			return err
		}
		set, err := gomysql.ParseGTIDSet(t.info.flavor, pos)
		if err != nil {
			return fmt.Errorf("relay: the server's position %q: %w", pos, err)
		}
		t.catchUp = set
	}
	t.swept(len(due))
	return t.deliver(due, false)
}

// due returns the due events of evs, in order, and schedules the others; in key order a
// key's events after its first event not due are held back with it.
func (t *term) due(evs []timedEvent) []outbox.Event {
	out := make([]outbox.Event, 0, len(evs))
	for _, te := range evs {
		if t.keyOrder() && t.heldBack(te.ev.BizNo) {
			continue
		}
		if t.heldRow(te.ev.ID) {
			continue // sent; its mark waits for another session's lock
		}
		if te.in > 0 {
			t.later(te.ev, te.in)
			continue
		}
		out = append(out, te.ev)
	}
	return out
}

// timedEvent is an event read from the table, with how long until it is due by the
// database clock.
type timedEvent struct {
	ev outbox.Event
	in time.Duration
}

// readWaiting reads the rows of ids that still wait, in id order.
func (t *term) readWaiting(ids []int64) ([]timedEvent, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	return t.readEvents(fmt.Sprintf(t.r.q.eventsByID, placeholders(len(ids))), args...)
}

func (t *term) readEvents(q string, args ...any) ([]timedEvent, error) {
	// What was sent must be marked first, or the read would find it waiting.
	if err := t.flush(t.ctx); err != nil {
		return nil, err
	}
	rows, err := t.r.db.QueryContext(t.ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("relay: read events: %w", err)
	}
	defer rows.Close()
	var out []timedEvent
	for rows.Next() {
		var te timedEvent
		ev := &te.ev
		var in sql.NullInt64
		if err := rows.Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &ev.RetryCount,
			&ev.NextRetryTime, &ev.CreateTime, &ev.TraceParent, &ev.TraceState, &ev.Topic, &in); err != nil {
			return nil, fmt.Errorf("relay: read events: %w", err)
		}
		ev.Status = outbox.StatusWait
		// A due time more than a time.Duration ahead (a NotBefore centuries away) waits
		// the longest Duration: the product would overflow, and might read as due.
		te.in = time.Duration(min(in.Int64, math.MaxInt64/int64(time.Microsecond))) * time.Microsecond
		out = append(out, te)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay: read events: %w", err)
	}
	return out, nil
}

// stillWaiting returns the events of evs whose rows still wait, in order.
func (t *term) stillWaiting(evs []outbox.Event) ([]outbox.Event, error) {
	waiting := map[int64]bool{}
	for start := 0; start < len(evs); start += 1000 {
		chunk := evs[start:min(start+1000, len(evs))]
		args := make([]any, len(chunk))
		for i, ev := range chunk {
			args[i] = ev.ID
		}
		rows, err := t.r.db.QueryContext(t.ctx, fmt.Sprintf(t.r.q.statusByID, placeholders(len(chunk))), args...)
		if err != nil {
			return nil, fmt.Errorf("relay: read statuses: %w", err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, err
			}
			waiting[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return slices.DeleteFunc(evs, func(ev outbox.Event) bool { return !waiting[ev.ID] || t.heldRow(ev.ID) }), nil
}

// sweep delivers every event waiting in the table, in id order: what committed before the
// term's binlog position, and what an earlier leader left.
func (t *term) sweep() error {
	rows, err := t.r.db.QueryContext(t.ctx, t.r.q.waitingIDs)
	if err != nil {
		return fmt.Errorf("relay: sweep: %w", err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("relay: sweep: %w", err)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for start := 0; start < len(ids); start += t.r.cfg.BatchSize {
		evs, err := t.readWaiting(ids[start:min(start+t.r.cfg.BatchSize, len(ids))])
		if err != nil {
			return err
		}
		due := t.due(evs)
		if err := t.deliver(due, false); err != nil {
			return err
		}
		t.swept(len(due))
		if t.ctx.Err() != nil {
			return nil
		}
	}
	return nil
}

// swept counts events taken from the table rather than the binlog.
func (t *term) swept(n int) {
	t.r.counters.swept.Add(int64(n))
	t.r.m.add(t.ctx, func(m *metrics) metric.Int64Counter { return m.swept }, int64(n))
}

// exec runs a fenced write of the row id (its last argument); the database's failures end
// the term. It waits on no row lock: on MariaDB the statement runs with noWait, on MySQL in
// a transaction that locks the row first, skipping it if another session holds it. A held
// row fails it with a lock wait error (1205), which the caller handles.
func (t *term) exec(what, q string, id int64, args ...any) (int64, error) {
	args = append(args, id)
	if t.info.flavor == gomysql.MariaDBFlavor {
		res, err := t.r.db.ExecContext(t.ctx, noWait+q, args...)
		if err != nil {
			return 0, fmt.Errorf("relay: %s: %w", what, err)
		}
		return res.RowsAffected()
	}
	tx, err := t.r.db.BeginTx(t.ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("relay: %s: %w", what, err)
	}
	defer tx.Rollback()
	var got int64
	err = tx.QueryRowContext(t.ctx, "SELECT id FROM "+t.r.cfg.Table+" FORCE INDEX (PRIMARY) WHERE id = ? FOR UPDATE SKIP LOCKED", id).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		var n int
		if err := tx.QueryRowContext(t.ctx, "SELECT COUNT(*) FROM "+t.r.cfg.Table+" WHERE id = ?", id).Scan(&n); err != nil {
			return 0, fmt.Errorf("relay: %s: %w", what, err)
		}
		if n == 0 {
			return 0, nil // gone: nothing to write
		}
		return 0, fmt.Errorf("relay: %s: %w", what, &mysql.MySQLError{Number: 1205, Message: "the row is held by another session"})
	}
	if err != nil {
		return 0, fmt.Errorf("relay: %s: %w", what, err)
	}
	res, err := tx.ExecContext(t.ctx, q, args...)
	if err != nil {
		return 0, fmt.Errorf("relay: %s: %w", what, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("relay: %s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("relay: %s: commit: %w", what, err)
	}
	return n, nil
}

// checkEpoch returns errNotLeader if the checkpoint row's epoch moved on.
func (t *term) checkEpoch(ctx context.Context) error {
	var epoch int64
	var mode string
	err := t.r.db.QueryRowContext(ctx, "SELECT epoch, mode FROM "+mysqldialect.Quote(t.r.cfg.CheckpointTable)+" WHERE outbox_table = ?", t.r.cfg.Table).Scan(&epoch, &mode)
	if err != nil {
		return fmt.Errorf("relay: read the checkpoint row: %w", err)
	}
	if epoch != t.epoch || mode != "relay" {
		return fmt.Errorf("%w: epoch %d (mode %s) replaced %d", errNotLeader, epoch, mode, t.epoch)
	}
	return nil
}

// timer is a look at an event (or, in key order, a key) once it is due.
type timer struct {
	at    time.Time
	id    int64
	key   string
	keyed bool
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (h timerHeap) next() (time.Time, bool) {
	if len(h) == 0 {
		return time.Time{}, false
	}
	return h[0].at, true
}

// outage reports whether a send's err leaves the events untried, as in a broker outage: the
// broker or the way to it is down ([outbox.IsUnavailable]), or the sender was closed under
// the relay ([outbox.ErrClosed]). Neither counts an attempt.
func outage(err error) bool {
	return outbox.IsUnavailable(err) || errors.Is(err, outbox.ErrClosed)
}
