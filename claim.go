package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"
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
	outcomeError outcome = iota
	outcomeLost
	outcomeSent
	outcomeRetried
	outcomeDeadLettered
	outcomeReleased
	outcomeLeaseLost
)

func (s *RoundStats) add(o outcome) {
	switch o {
	case outcomeLost:
		s.Lost++
		return
	case outcomeError:
		s.Errors++
		return
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
	s.Claimed++
}

// PublishPending runs one round: it reads up to [Config.BatchSize] due candidates, and for
// each one claims it and, if the claim was won, sends it and records the outcome. One
// event's error or panic is logged and never aborts the round. The returned error is the
// candidate SELECT's; once ctx is cancelled the round stops claiming and returns.
func (p *Publisher) PublishPending(ctx context.Context) (RoundStats, error) {
	var stats RoundStats
	sctx, cancel := context.WithTimeout(ctx, p.cfg.StoreTimeout)
	candidates, err := p.store.Candidates(sctx, p.cfg.BatchSize)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: select candidates", slog.Any("error", err))
		}
		return stats, fmt.Errorf("outbox: select candidates: %w", err)
	}
	stats.Candidates = len(candidates)
	for _, ev := range candidates {
		if ctx.Err() != nil {
			break
		}
		stats.add(p.claimAndPublishSafe(ctx, ev))
	}
	return stats, nil
}

// claimAndPublishSafe is claimAndPublish with a panic turned into a logged error, so that
// one event never aborts the round.
func (p *Publisher) claimAndPublishSafe(ctx context.Context, ev Event) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			p.log.ErrorContext(ctx, "outbox: panic while publishing event",
				slog.Int64("event_id", ev.ID), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			o = outcomeError
		}
	}()
	return p.claimAndPublish(ctx, ev)
}

func (p *Publisher) claimAndPublish(ctx context.Context, ev Event) outcome {
	owner := p.cfg.InstanceID
	won, err := p.storeCall(ctx, func(ctx context.Context) (bool, error) { return p.store.Claim(ctx, ev, owner) })
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: claim", slog.Int64("event_id", ev.ID), slog.Any("error", err))
		}
		return outcomeError
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
