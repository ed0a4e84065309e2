package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// A write records the outcome of claimed events under this instance's lease. It is tried a
// few times at once ([Publisher.record]); if the store still fails, it is kept and tried
// again before the next claim ([Publisher.settle]), so that a short database outage leaves
// no row SENDING for a whole lease while its owner is alive.
type write struct {
	what string  // for the logs: "mark success", "retry", "dead letter", "release"
	ids  []int64 // the events it records
	// exec runs the conditional write and returns how many rows it changed: a row not
	// changed was reclaimed, and keeps the new owner's state.
	exec func(ctx context.Context) (int64, error)
	// done logs the recorded outcome and counts it in stats.
	done func(ctx context.Context, changed int64, stats *RoundStats)
	// single is the outcome of a one-event write once recorded.
	single outcome
}

// Recording retries: recordAttempts tries in all, the first pause recordPause, doubling.
const (
	recordAttempts = 4
	recordPause    = 100 * time.Millisecond
	// maxPending bounds the writes kept for later; past it the oldest is dropped, and its
	// rows are reclaimed after the lease instead.
	maxPending = 1000
)

// record runs w, retrying store errors with backoff, and counts its outcome in stats. If
// the store keeps failing, w is kept for the next round, and the outcome is an error for
// now. It returns the outcome of a one-event write.
func (p *Publisher) record(ctx context.Context, stats *RoundStats, w write) outcome {
	var err error
	pause := recordPause
	for attempt := 1; ; attempt++ {
		var n int64
		if n, err = p.execWrite(ctx, w); err == nil {
			return p.recorded(ctx, stats, w, n)
		}
		if attempt == recordAttempts || ctx.Err() != nil {
			break
		}
		if sleep(ctx, pause) != nil {
			break
		}
		pause *= 2
	}
	p.keep(ctx, w, err)
	stats.Errors += len(w.ids)
	return outcomeError
}

func (p *Publisher) execWrite(ctx context.Context, w write) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	return w.exec(ctx)
}

// recorded finishes a write that the store took.
func (p *Publisher) recorded(ctx context.Context, stats *RoundStats, w write, changed int64) outcome {
	p.held.Add(-int64(len(w.ids))) // recorded, or lost to a reclaim: no longer held
	if lost := int64(len(w.ids)) - changed; lost > 0 {
		stats.LeaseLost += int(lost)
		p.m.leaseLost(ctx, lost)
		p.log.WarnContext(ctx, "outbox: lease lost before recording "+w.what+"; the rows keep their new owner's state",
			slog.Int64("count", lost), slog.Int64("first_id", w.ids[0]))
	}
	w.done(ctx, changed, stats)
	if changed == 0 {
		return outcomeLeaseLost
	}
	return w.single
}

// keep keeps w, which the store failed to record, for the next round.
func (p *Publisher) keep(ctx context.Context, w write, err error) {
	p.health.storeReached(err, false)
	p.log.ErrorContext(ctx, "outbox: could not record "+w.what+"; will try again before the next claim",
		slog.Int("count", len(w.ids)), slog.Int64("first_id", w.ids[0]), slog.Any("error", err))
	if len(p.rounds.pending) >= maxPending {
		old := p.rounds.pending[0]
		p.rounds.pending = p.rounds.pending[1:]
		p.held.Add(-int64(len(old.ids))) // left to the reclaim
		p.log.ErrorContext(ctx, "outbox: too many unrecorded outcomes; dropping the oldest, its events will be reclaimed after the lease",
			slog.String("what", old.what), slog.Int("count", len(old.ids)))
	}
	p.rounds.pending = append(p.rounds.pending, w)
}

func (p *Publisher) releaseOwned(ctx context.Context, reason string) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Tuning.StoreTimeout)
	defer cancel()
	n, err := p.store.ReleaseOwned(ctx, p.cfg.InstanceID, reason)
	if err != nil {
		return n, fmt.Errorf("outbox: release owned events: %w", err)
	}
	p.held.Store(0) // nothing is recorded pending (see settle and stop): nothing is held
	return n, nil
}

// successWrite marks the sent events SUCCESS.
func (p *Publisher) successWrite(evs []Event) write {
	owner := p.cfg.InstanceID
	ids := make([]int64, len(evs))
	for i, ev := range evs {
		ids[i] = ev.ID
	}
	return write{
		what: "success", ids: ids, single: outcomeSent,
		exec: func(ctx context.Context) (int64, error) {
			return p.store.MarkSuccess(ctx, ids, owner)
		},
		done: func(ctx context.Context, n int64, stats *RoundStats) {
			stats.Sent += int(n)
			switch {
			case n == 0:
			case p.cfg.Tuning.ClaimPerRow:
				p.log.InfoContext(ctx, "outbox: event sent", slog.Int64("id", evs[0].ID),
					slog.String("event_id", evs[0].EventID), slog.String("biz_no", evs[0].BizNo),
					slog.String("event_type", evs[0].EventType))
			default:
				p.log.InfoContext(ctx, "outbox: events sent", slog.Int64("count", n),
					slog.Int64("first_id", ids[0]), slog.Int64("last_id", ids[len(ids)-1]))
			}
		},
	}
}

// failureWrite records a failed send: a retry after the backoff, or past MaxAttempts (or for a
// permanent error) a dead letter.
func (p *Publisher) failureWrite(ev Event, cause error) write {
	owner := p.cfg.InstanceID
	attempt := ev.RetryCount + 1
	reason := cause.Error()
	class := mysqldialect.ClassRetryable
	if IsPermanent(cause) {
		class = mysqldialect.ClassPermanent
	}
	delay, dead := p.cfg.retryPolicy().Next(attempt, cause)
	if dead {
		var history []Failure
		return write{
			what: "dead letter", ids: []int64{ev.ID}, single: outcomeDeadLettered,
			exec: func(ctx context.Context) (int64, error) {
				h, ok, err := p.store.MarkFail(ctx, ev.ID, owner, attempt, class, reason)
				history = h
				return boolCount(ok), err
			},
			done: func(ctx context.Context, n int64, stats *RoundStats) {
				if n == 0 {
					return
				}
				stats.DeadLettered++
				p.m.deadLetter(ctx, ev, cause)
				ev.Status, ev.RetryCount, ev.LastError, ev.Failures = StatusFail, attempt, reason, history
				p.deadLettered(ctx, ev, cause)
			},
		}
	}
	return write{
		what: "retry", ids: []int64{ev.ID}, single: outcomeRetried,
		exec: func(ctx context.Context) (int64, error) {
			ok, err := p.store.ReleaseForRetry(ctx, ev.ID, owner, attempt, delay, class, reason)
			return boolCount(ok), err
		},
		done: func(ctx context.Context, n int64, stats *RoundStats) {
			if n == 0 {
				return
			}
			stats.Retried++
			p.m.retry(ctx, ev)
			p.log.WarnContext(ctx, "outbox: send failed, will retry",
				slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID), slog.String("biz_no", ev.BizNo),
				slog.Int("retry_count", attempt), slog.Duration("backoff", delay), slog.Any("error", cause))
		},
	}
}

// releaseWrite returns a claimed, unsent event to WAIT as it was, due after delay (0: now)
// by the database's clock: no retry is counted. o says why: outcomeReleased (never tried: no failure in the history) or
// outcomeUnavailable (the broker was down: an "unavailable" failure in the history).
func (p *Publisher) releaseWrite(ev Event, reason string, delay time.Duration, o outcome) write {
	owner := p.cfg.InstanceID
	class := ""
	if o == outcomeUnavailable {
		class = mysqldialect.ClassUnavailable
	}
	return write{
		what: "release", ids: []int64{ev.ID}, single: o,
		exec: func(ctx context.Context) (int64, error) {
			ok, err := p.store.ReleaseForRetry(ctx, ev.ID, owner, ev.RetryCount, delay, class, reason)
			return boolCount(ok), err
		},
		done: func(ctx context.Context, n int64, stats *RoundStats) {
			if n == 0 {
				return
			}
			stats.add(o)
			p.log.DebugContext(ctx, "outbox: claimed event released unsent", slog.Int64("id", ev.ID),
				slog.String("event_id", ev.EventID), slog.String("reason", reason))
		},
	}
}

// deadLettered tells the logs about an event now FAIL, and queues its OnDeadLetter call
// (see deadletters.go: the call runs on the dispatcher, never under the round's lock).
func (p *Publisher) deadLettered(ctx context.Context, ev Event, cause error) {
	p.log.ErrorContext(ctx, "outbox: event dead-lettered; it needs a person",
		slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID), slog.String("biz_no", ev.BizNo),
		slog.String("event_type", ev.EventType), slog.Int("retry_count", ev.RetryCount), slog.Int("reclaim_count", ev.ReclaimCount),
		slog.Bool("permanent", IsPermanent(cause)), slog.Any("error", cause))
	p.dead.add(ctx, ev, cause)
}

func boolCount(ok bool) int64 {
	if ok {
		return 1
	}
	return 0
}
