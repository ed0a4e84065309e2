package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"
)

// RoundStats counts what one round of [Publisher.PublishPending] did.
type RoundStats struct {
	Candidates   int // rows the candidate SELECT returned
	Claimed      int // claims this instance won
	Lost         int // claims another instance won first
	Sent         int // events sent and marked SUCCESS
	Retried      int // failed sends released for a later retry
	DeadLettered int // events marked FAIL
	Released     int // claimed events put back unsent because the round was cancelled
	LeaseLost    int // outcomes not recorded because the lease had been reclaimed
	Errors       int // store errors and panics; each was logged
}

// outcome is what became of one candidate.
type outcome int

const (
	outcomeError       outcome = iota // claimed, but the outcome could not be recorded (or a panic)
	outcomeClaimFailed                // the claim itself failed
	outcomeLost
	outcomeSent
	outcomeRetried
	outcomeDeadLettered
	outcomeReleased
	outcomeLeaseLost
)

// claimed reports whether the candidate's claim was won.
func (o outcome) claimed() bool { return o != outcomeLost && o != outcomeClaimFailed }

// add counts o; Claimed is counted by the caller, who knows how the claim was made.
func (s *RoundStats) add(o outcome) {
	switch o {
	case outcomeError, outcomeClaimFailed:
		s.Errors++
	case outcomeLost:
		s.Lost++
	case outcomeSent:
		s.Sent++
	case outcomeRetried:
		s.Retried++
	case outcomeDeadLettered:
		s.DeadLettered++
	case outcomeReleased:
		s.Released++
	case outcomeLeaseLost:
		s.LeaseLost++
	}
}

// drained reports whether a round claimed all it could and recorded every claim as sent (or
// lost to another instance): there is likely more waiting, so the next round should not
// wait for the poll interval. A round with any failure waits, as back-pressure.
func (s RoundStats) drained(limit int) bool {
	return s.Candidates > 0 && s.Candidates >= limit &&
		s.Retried+s.DeadLettered+s.Released+s.LeaseLost+s.Errors == 0
}

// PublishPending runs one round and reports what it did. In per-row mode it reads up to
// [Config.BatchSize] due candidates and, for each one, claims it and, if the claim was won,
// sends it and records the outcome. In batch mode it claims a batch of due events at once,
// sends them, and records the successes with one statement. One event's error or panic is
// logged and never aborts the round; once ctx is cancelled the round stops claiming, and
// returns to WAIT what it claimed and did not send. The returned error is the claim's (or
// the candidate SELECT's).
func (p *Publisher) PublishPending(ctx context.Context) (RoundStats, error) {
	stats, _, err := p.round(ctx)
	return stats, err
}

// round is PublishPending that also returns its claim limit, with a panic in the store
// turned into a logged error.
func (p *Publisher) round(ctx context.Context) (stats RoundStats, limit int, err error) {
	defer func() {
		if r := recover(); r != nil {
			p.log.ErrorContext(ctx, "outbox: panic in a publishing round",
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			stats.Errors++
			err = fmt.Errorf("outbox: panic in a publishing round: %v", r)
		}
	}()
	if p.cfg.ClaimMode == ClaimPerRow {
		return p.publishPerRow(ctx)
	}
	return p.publishBatch(ctx)
}

func (p *Publisher) publishPerRow(ctx context.Context) (RoundStats, int, error) {
	var stats RoundStats
	limit := p.cfg.BatchSize
	candidates, err := p.fetch(ctx, "select candidates", func(ctx context.Context) ([]Event, error) {
		return p.store.Candidates(ctx, limit)
	})
	if err != nil {
		return stats, limit, err
	}
	stats.Candidates = len(candidates)
	for _, ev := range candidates {
		if ctx.Err() != nil {
			break
		}
		o := p.claimAndPublishSafe(ctx, ev)
		stats.add(o)
		if o.claimed() {
			stats.Claimed++
		}
	}
	return stats, limit, nil
}

func (p *Publisher) publishBatch(ctx context.Context) (RoundStats, int, error) {
	var stats RoundStats
	owner := p.cfg.InstanceID
	limit := int(p.limit.Load())
	evs, err := p.fetch(ctx, "claim due events", func(ctx context.Context) ([]Event, error) {
		return p.store.ClaimDue(ctx, owner, limit)
	})
	if err != nil {
		return stats, limit, err
	}
	stats.Candidates, stats.Claimed = len(evs), len(evs)
	if len(evs) == 0 {
		return stats, limit, nil
	}

	// From here this instance holds the leases; their outcomes are recorded even if ctx is
	// cancelled.
	held := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		for _, ev := range evs {
			stats.add(p.outcomeSafe(ctx, ev, func() outcome { return p.release(held, ev, "publisher stopped before sending") }))
		}
		return stats, limit, nil
	}
	start := time.Now()
	errs := p.sendBatch(held, evs)
	p.adaptLimit(len(evs), limit, time.Since(start))

	sent := make([]int64, 0, len(evs))
	for i, ev := range evs {
		switch err := errs[i]; {
		case err == nil:
			sent = append(sent, ev.ID)
		case errors.Is(err, errNotSent):
			stats.add(p.outcomeSafe(ctx, ev, func() outcome { return p.release(held, ev, err.Error()) }))
		default:
			stats.add(p.outcomeSafe(ctx, ev, func() outcome { return p.handleFailure(held, ev, err) }))
		}
	}
	if len(sent) == 0 {
		return stats, limit, nil
	}
	sctx, cancel := context.WithTimeout(held, p.cfg.StoreTimeout)
	n, err := p.store.MarkSuccessBatch(sctx, sent, owner)
	cancel()
	if err != nil {
		// Sent, but the rows stay SENDING: they will be sent again after the lease.
		p.log.ErrorContext(ctx, "outbox: events sent but not marked SUCCESS; they will be sent again after the lease",
			slog.Int("count", len(sent)), slog.Any("error", err))
		stats.Errors += len(sent)
		return stats, limit, nil
	}
	stats.Sent += int(n)
	if lost := len(sent) - int(n); lost > 0 {
		stats.LeaseLost += lost
		p.log.WarnContext(ctx, "outbox: events sent after their lease was reclaimed; their rows keep the new owner's state",
			slog.Int("count", lost))
	}
	p.log.InfoContext(ctx, "outbox: events sent", slog.Int64("count", n),
		slog.Int64("first_event_id", sent[0]), slog.Int64("last_event_id", sent[len(sent)-1]))
	return stats, limit, nil
}

// fetch runs a round's first store call within StoreTimeout, logging its error unless ctx
// has ended (a cancelled context is a shutdown, not an error).
func (p *Publisher) fetch(ctx context.Context, what string, fn func(context.Context) ([]Event, error)) ([]Event, error) {
	sctx, cancel := context.WithTimeout(ctx, p.cfg.StoreTimeout)
	defer cancel()
	evs, err := fn(sctx)
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: "+what, slog.Any("error", err))
		}
		return nil, fmt.Errorf("outbox: %s: %w", what, err)
	}
	return evs, nil
}

// errNotSent marks an event of a batch whose turn never came before the batch's send
// deadline: it is released, not counted as a failed attempt.
var errNotSent = errors.New("not sent: the batch's send timeout passed before its turn")

// sendBatch sends a claimed batch within one SendTimeout, so that no event of the batch is
// sent late in its lease: through the sender's SendBatch if it has one, else one by one.
func (p *Publisher) sendBatch(ctx context.Context, evs []Event) (errs []error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.SendTimeout)
	defer cancel()
	if bs, ok := p.sender.(BatchSender); ok {
		defer func() {
			if r := recover(); r != nil {
				errs = repeatErr(fmt.Errorf("sender panicked: %v", r), len(evs))
			}
		}()
		errs = bs.SendBatch(ctx, evs)
		if len(errs) != len(evs) {
			return repeatErr(fmt.Errorf("sender returned %d results for %d events", len(errs), len(evs)), len(evs))
		}
		return errs
	}
	errs = make([]error, len(evs))
	for i, ev := range evs {
		if ctx.Err() != nil {
			errs[i] = errNotSent
			continue
		}
		errs[i] = p.send(ctx, ev)
	}
	return errs
}

func repeatErr(err error, n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// adaptLimit sizes the next batch claim so that a batch is sent well within SendTimeout:
// halved when a batch took more than half of it, doubled (up to BatchSize) when a full batch
// took less than a quarter.
func (p *Publisher) adaptLimit(claimed, limit int, took time.Duration) {
	switch {
	case took > p.cfg.SendTimeout/2 && limit > 1:
		p.limit.Store(int64(max(limit/2, 1)))
	case claimed == limit && took < p.cfg.SendTimeout/4 && limit < p.cfg.BatchSize:
		p.limit.Store(int64(min(limit*2, p.cfg.BatchSize)))
	}
}

// outcomeSafe runs one event's outcome with a panic turned into a logged error.
func (p *Publisher) outcomeSafe(ctx context.Context, ev Event, fn func() outcome) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			p.log.ErrorContext(ctx, "outbox: panic while publishing event",
				slog.Int64("event_id", ev.ID), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			o = outcomeError
		}
	}()
	return fn()
}

// claimAndPublishSafe is claimAndPublish with a panic turned into a logged error, so that
// one event never aborts the round.
func (p *Publisher) claimAndPublishSafe(ctx context.Context, ev Event) outcome {
	return p.outcomeSafe(ctx, ev, func() outcome { return p.claimAndPublish(ctx, ev) })
}

func (p *Publisher) claimAndPublish(ctx context.Context, ev Event) outcome {
	owner := p.cfg.InstanceID
	won, err := p.storeCall(ctx, func(ctx context.Context) (bool, error) { return p.store.Claim(ctx, ev, owner) })
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: claim", slog.Int64("event_id", ev.ID), slog.Any("error", err))
		}
		return outcomeClaimFailed
	}
	if !won {
		// Normal with several instances: the SELECT only found a candidate.
		p.log.DebugContext(ctx, "outbox: event taken by another instance, skip", slog.Int64("event_id", ev.ID))
		return outcomeLost
	}

	// From here this instance holds the lease. Its outcome is recorded even if ctx is
	// cancelled, so a clean shutdown never leaves a row SENDING for a whole lease.
	held := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		return p.release(held, ev, "publisher stopped before sending")
	}
	sendErr := p.send(held, ev)
	if sendErr != nil {
		return p.handleFailure(held, ev, sendErr)
	}
	ok, err := p.storeCall(held, func(ctx context.Context) (bool, error) { return p.store.MarkSuccess(ctx, ev.ID, owner) })
	switch {
	case err != nil:
		// Sent, but the row stays SENDING: the reclaim loop will send it again after the
		// lease. At least once, never lost.
		p.log.ErrorContext(ctx, "outbox: event sent but not marked SUCCESS; it will be sent again after the lease",
			slog.Int64("event_id", ev.ID), slog.Any("error", err))
		return outcomeError
	case !ok:
		p.log.WarnContext(ctx, "outbox: event sent after its lease was reclaimed; the row keeps its new owner's state",
			slog.Int64("event_id", ev.ID), slog.String("biz_no", ev.BizNo))
		return outcomeLeaseLost
	}
	p.log.InfoContext(ctx, "outbox: event sent",
		slog.Int64("event_id", ev.ID), slog.String("biz_no", ev.BizNo), slog.String("event_type", ev.EventType))
	return outcomeSent
}

// send calls the sender within SendTimeout; a panic in the sender is an error like any other.
func (p *Publisher) send(ctx context.Context, ev Event) (err error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.SendTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sender panicked: %v", r)
		}
	}()
	return p.sender.Send(ctx, ev)
}

// handleFailure records a failed send: a retry after the backoff, or past MaxRetry (or for
// a permanent error) a dead letter.
func (p *Publisher) handleFailure(ctx context.Context, ev Event, cause error) outcome {
	owner := p.cfg.InstanceID
	attempt := ev.RetryCount + 1
	reason := cause.Error()
	if attempt > p.cfg.MaxRetry || IsPermanent(cause) {
		ok, err := p.storeCall(ctx, func(ctx context.Context) (bool, error) {
			return p.store.MarkFail(ctx, ev.ID, owner, attempt, reason)
		})
		if err != nil || !ok {
			return p.unrecorded(ctx, ev, "dead letter", err)
		}
		ev.Status, ev.RetryCount, ev.LastError = StatusFail, attempt, reason
		p.log.ErrorContext(ctx, "outbox: event dead-lettered; it needs a person",
			slog.Int64("event_id", ev.ID), slog.String("biz_no", ev.BizNo), slog.String("event_type", ev.EventType),
			slog.Int("retry_count", attempt), slog.Bool("permanent", IsPermanent(cause)), slog.Any("error", cause))
		if p.cfg.OnDeadLetter != nil {
			p.cfg.OnDeadLetter(ctx, ev, cause)
		}
		return outcomeDeadLettered
	}
	delay := max(p.cfg.Backoff(attempt), 0)
	ok, err := p.storeCall(ctx, func(ctx context.Context) (bool, error) {
		return p.store.ReleaseForRetry(ctx, ev.ID, owner, attempt, delay, reason)
	})
	if err != nil || !ok {
		return p.unrecorded(ctx, ev, "retry", err)
	}
	p.log.WarnContext(ctx, "outbox: send failed, will retry",
		slog.Int64("event_id", ev.ID), slog.String("biz_no", ev.BizNo),
		slog.Int("retry_count", attempt), slog.Duration("backoff", delay), slog.Any("error", cause))
	return outcomeRetried
}

// release returns a claimed, unsent event to WAIT as it was: no retry is counted.
func (p *Publisher) release(ctx context.Context, ev Event, reason string) outcome {
	ok, err := p.storeCall(ctx, func(ctx context.Context) (bool, error) {
		return p.store.ReleaseForRetry(ctx, ev.ID, p.cfg.InstanceID, ev.RetryCount, 0, reason)
	})
	if err != nil || !ok {
		return p.unrecorded(ctx, ev, "release", err)
	}
	p.log.DebugContext(ctx, "outbox: claimed event released unsent", slog.Int64("event_id", ev.ID), slog.String("reason", reason))
	return outcomeReleased
}

// unrecorded logs an outcome that could not be written: a store error (the row stays
// SENDING until the lease expires) or a lost lease (another instance owns the row now).
func (p *Publisher) unrecorded(ctx context.Context, ev Event, what string, err error) outcome {
	if err != nil {
		p.log.ErrorContext(ctx, "outbox: could not record "+what+"; the event will be reclaimed after the lease",
			slog.Int64("event_id", ev.ID), slog.Any("error", err))
		return outcomeError
	}
	p.log.WarnContext(ctx, "outbox: lease lost before recording "+what+"; the row keeps its new owner's state",
		slog.Int64("event_id", ev.ID))
	return outcomeLeaseLost
}

// storeCall runs one conditional store write within StoreTimeout.
func (p *Publisher) storeCall(ctx context.Context, fn func(context.Context) (bool, error)) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StoreTimeout)
	defer cancel()
	return fn(ctx)
}
