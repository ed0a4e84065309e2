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
	Released     int // claimed events put back unsent (the round was cancelled, or its deadline passed)
	Unavailable  int // sends that failed because the broker was unavailable: back to WAIT, no retry counted
	LeaseLost    int // outcomes not recorded because the lease had been reclaimed
	Errors       int // store errors and panics; each was logged
}

// outcome is what became of one candidate.
type outcome int

const (
	outcomeError       outcome = iota // claimed, but the outcome could not be recorded yet (or a panic)
	outcomeClaimFailed                // the claim itself failed
	outcomeLost
	outcomeSent
	outcomeRetried
	outcomeDeadLettered
	outcomeReleased
	outcomeUnavailable
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
	case outcomeUnavailable:
		s.Unavailable++
	case outcomeLeaseLost:
		s.LeaseLost++
	}
}

// clean reports whether a round recorded every claim as sent (or lost to another
// instance). A round that left more waiting is followed at once by the next only if it was
// clean: a round with any failure waits for the poll interval, as back-pressure.
func (s RoundStats) clean() bool {
	return s.Retried+s.DeadLettered+s.Released+s.Unavailable+s.LeaseLost+s.Errors == 0
}

// PublishPending runs one round and reports what it did. In per-row mode it reads up to
// [Tuning.BatchSize] due candidates and, for each one, claims it and, if the claim was won,
// sends it and records the outcome. In batch mode it claims a batch of due events at once,
// sends them, and records the successes with one statement. One event's error or panic is
// logged and never aborts the round; once ctx is cancelled the round stops claiming, and
// returns to WAIT what it claimed and did not send. The returned error is the claim's (or
// the candidate SELECT's), or the store's if outcomes of earlier rounds are still
// unrecorded.
//
// While the broker is unavailable (see [Sender]), a round claims nothing until the next
// probe is due, and then claims one event to probe with.
//
// PublishPending works whether or not the publisher was started: before its first round it
// asks the store how it claims ([Store.Check]) as Start does, so that a store in key order
// is sent in key order, and returns Check's error wrapping [ErrInvalidConfig] (a table that
// cannot serve the store) without claiming. It returns once the [Config.OnDeadLetter] calls
// of its dead letters have returned (or ctx has ended). After [Publisher.Close] it returns
// [ErrClosed] and sends nothing; Close makes a PublishPending in progress stop claiming,
// and closes the sender only after it has returned.
func (p *Publisher) PublishPending(ctx context.Context) (RoundStats, error) {
	rctx, exit, err := p.enter(ctx)
	if err != nil {
		return RoundStats{}, err
	}
	defer exit()
	if !p.orderChecked.Load() {
		if err := p.check(rctx); err != nil {
			return RoundStats{}, err
		}
	}
	stats, _, err := p.round(rctx, false)
	_ = p.dead.wait(ctx, p.dead.mark()) // a ctx that ended ends the wait: the calls still run
	return stats, err
}

// round is PublishPending that also returns the pause before the next round, with a panic
// in the store turned into a logged error. Rounds of one publisher never overlap. With
// deferAcks (Run's rounds) a batch round leaves its successes to the next round's claim.
func (p *Publisher) round(ctx context.Context, deferAcks bool) (stats RoundStats, next time.Duration, err error) {
	p.roundMu.Lock()
	defer p.roundMu.Unlock()
	defer func() {
		if r := recover(); r != nil {
			p.log.ErrorContext(ctx, "outbox: panic in a publishing round",
				slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			stats.Errors++
			next = p.cfg.PollInterval
			err = fmt.Errorf("outbox: panic in a publishing round: %v", r)
		}
	}()
	if err := p.settle(ctx, &stats); err != nil {
		p.health.storeReached(err, ctx.Err() != nil)
		return stats, p.cfg.PollInterval, err
	}
	probe := p.outage.down
	if probe {
		if wait := time.Until(p.outage.next); wait > 0 {
			return stats, wait, nil
		}
		// Whatever this probe finds (nothing due, a claim lost), the next waits as long.
		p.outage.next = time.Now().Add(p.outage.delay)
	}
	var more bool // the round took all it could: more may be due
	if p.cfg.Tuning.ClaimPerRow {
		more, err = p.publishPerRow(ctx, &stats, probe)
	} else {
		more, err = p.publishBatch(ctx, &stats, probe, deferAcks)
	}
	switch {
	case p.outage.down:
		return stats, time.Until(p.outage.next), err
	case probe:
		return stats, 0, err // the broker answers again: whatever waited goes at once
	case err == nil && more && stats.clean():
		return stats, 0, nil // a backlog: go on at once
	}
	return stats, p.cfg.PollInterval, err
}

func (p *Publisher) publishPerRow(ctx context.Context, stats *RoundStats, probe bool) (more bool, err error) {
	limit := p.cfg.Tuning.BatchSize
	if probe {
		limit = 1
	}
	candidates, err := p.fetch(ctx, "select candidates", func(ctx context.Context) ([]Event, error) {
		return p.store.Candidates(ctx, limit)
	})
	if err != nil {
		return false, err
	}
	stats.Candidates = len(candidates)
	var stopped map[string]bool // in key order: biz nos whose event failed in this round
	for _, ev := range candidates {
		if ctx.Err() != nil {
			break
		}
		if stopped[ev.BizNo] {
			continue // an earlier event of the key is still open: its claim would lose
		}
		o := p.claimAndPublishSafe(ctx, stats, ev, stats.Sent > 0)
		if o.claimed() {
			stats.Claimed++
		}
		if p.keyOrder.Load() && o != outcomeSent {
			// Lost to another instance, failed or released: the key's later events wait.
			if stopped == nil {
				stopped = map[string]bool{}
			}
			stopped[ev.BizNo] = true
		}
		if p.outage.down {
			break // the broker is down: leave the other candidates to the probes
		}
	}
	now := time.Now()
	fresh, age := meanFreshAge(candidates, now)
	p.gather.claimed(now, len(candidates), fresh, age, len(candidates) == limit)
	return len(candidates) == limit, nil
}

func (p *Publisher) publishBatch(ctx context.Context, stats *RoundStats, probe, deferAcks bool) (more bool, err error) {
	limit := int(p.limit.Load())
	if probe {
		limit = 1
	}
	req := ClaimRequest{Owner: p.cfg.InstanceID, Limit: limit, MaxBytes: p.cfg.Tuning.MaxClaimBytes}
	acked := p.unacked
	p.unacked = nil
	for _, ev := range acked {
		req.Succeeded = append(req.Succeeded, ev.ID)
	}
	var res ClaimResult
	evs, err := p.fetch(ctx, "claim due events", func(ctx context.Context) ([]Event, error) {
		res, err = p.store.ClaimDue(ctx, req)
		return res.Events, err
	})
	if err != nil {
		// The claim may have committed all the same: release whatever is ours before the
		// next claim, once the successes it carried are recorded.
		if len(acked) > 0 {
			p.pending = append(p.pending, p.successWrite(acked))
		}
		p.releaseOwed = true
		return false, err
	}
	if len(acked) > 0 {
		p.recorded(ctx, stats, p.successWrite(acked), res.Succeeded)
	}
	more = res.More
	stats.Candidates, stats.Claimed = len(evs), len(evs)
	p.held.Add(int64(len(evs)))
	if len(evs) == 0 {
		p.gather.claimed(time.Now(), 0, 0, 0, more)
		return more, nil
	}

	// From here this instance holds the leases; their outcomes are recorded even if ctx is
	// cancelled.
	held := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		for _, ev := range evs {
			p.outcomeSafe(ctx, stats, ev, func() outcome {
				return p.record(held, stats, p.releaseWrite(ev, "publisher stopped before sending", outcomeReleased))
			})
		}
		return more, nil
	}
	start := time.Now()
	errs := p.sendBatch(held, evs)
	now := time.Now()
	p.adaptLimit(len(evs), limit, now.Sub(start))
	fresh, age := meanFreshAge(evs, now)
	p.gather.claimed(now, len(evs), fresh, age, more)

	// Successes are recorded first: a failure to record a retry costs a later resend, a
	// failure to record a success a duplicate.
	sent := make([]Event, 0, len(evs))
	for i, ev := range evs {
		if errs[i] == nil {
			sent = append(sent, ev)
		}
	}
	switch {
	case len(sent) == 0:
	case deferAcks && ctx.Err() == nil:
		p.unacked = sent // the next claim records them
	default:
		p.record(held, stats, p.successWrite(sent))
	}
	var unavailable error // the first failure that says the broker is down
	for i, ev := range evs {
		if err := errs[i]; err != nil {
			p.outcomeSafe(ctx, stats, ev, func() outcome {
				o, down := p.failed(held, stats, ev, err, len(sent) > 0)
				if down && unavailable == nil {
					unavailable = err
				}
				return o
			})
		}
	}
	p.brokerAnswered(ctx, unavailable)
	return more, nil
}

// brokerAnswered starts (or prolongs) an outage after a round whose sends failed as
// unavailable, and ends one after a round whose sends got an answer.
func (p *Publisher) brokerAnswered(ctx context.Context, unavailable error) {
	if unavailable != nil {
		p.enterOutage(ctx, unavailable)
	} else {
		p.endOutage(ctx)
	}
}

// failed records a send that failed, and reports whether the failure says the broker is
// unavailable. Such an event (unless another event of the round got through, which makes
// the failure the message's own) goes back as it was, with no retry counted; so does an
// event whose turn never came before the send deadline; any other failure is retried or
// dead-lettered.
func (p *Publisher) failed(ctx context.Context, stats *RoundStats, ev Event, cause error, othersSent bool) (outcome, bool) {
	switch {
	case errors.Is(cause, ErrNotSent):
		return p.record(ctx, stats, p.releaseWrite(ev, cause.Error(), outcomeReleased)), false
	case IsUnavailable(cause) && !othersSent:
		return p.record(ctx, stats, p.releaseWrite(ev, "broker unavailable: "+cause.Error(), outcomeUnavailable)), true
	}
	return p.record(ctx, stats, p.failureWrite(ev, cause)), false
}

// fetch runs a round's first store call within StoreTimeout, logging its error unless ctx
// has ended (a cancelled context is a shutdown, not an error).
func (p *Publisher) fetch(ctx context.Context, what string, fn func(context.Context) ([]Event, error)) ([]Event, error) {
	sctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	evs, err := fn(sctx)
	p.health.storeReached(err, ctx.Err() != nil)
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: could not "+what+"; trying again next round", slog.Any("error", err))
		}
		return nil, err
	}
	return evs, nil
}

// sendBatch sends a claimed batch within one send timeout, so that no event of the batch
// is sent late in its lease.
func (p *Publisher) sendBatch(ctx context.Context, evs []Event) (errs []error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.SendTimeout)
	defer cancel()
	ctx, span := p.tracing.start(ctx, evs...)
	defer func() { endSendSpan(span, errs...) }()
	defer func() {
		if r := recover(); r != nil {
			errs = repeatErr(fmt.Errorf("sender panicked: %v", r), len(evs))
		}
	}()
	keyOrder := p.keyOrder.Load()
	errs = p.m.batchSent(ctx, evs, func() []error { return p.sender.Send(ctx, evs, keyOrder) })
	if len(errs) != len(evs) {
		return repeatErr(fmt.Errorf("sender returned %d results for %d events", len(errs), len(evs)), len(evs))
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
	case took > p.cfg.Tuning.SendTimeout/2 && limit > 1:
		p.limit.Store(int64(max(limit/2, 1)))
	case claimed == limit && took < p.cfg.Tuning.SendTimeout/4 && limit < p.cfg.Tuning.BatchSize:
		p.limit.Store(int64(min(limit*2, p.cfg.Tuning.BatchSize)))
	}
}

// outcomeSafe runs one event's outcome with a panic turned into a logged error, counted in
// stats.
func (p *Publisher) outcomeSafe(ctx context.Context, stats *RoundStats, ev Event, fn func() outcome) (o outcome) {
	defer func() {
		if r := recover(); r != nil {
			p.log.ErrorContext(ctx, "outbox: panic while publishing event",
				slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID), slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			stats.add(outcomeError)
			o = outcomeError
		}
	}()
	return fn()
}

// claimAndPublishSafe is claimAndPublish with a panic turned into a logged error, so that
// one event never aborts the round.
func (p *Publisher) claimAndPublishSafe(ctx context.Context, stats *RoundStats, ev Event, othersSent bool) outcome {
	return p.outcomeSafe(ctx, stats, ev, func() outcome { return p.claimAndPublish(ctx, stats, ev, othersSent) })
}

// claimAndPublish claims, sends and records one candidate, counting what became of it in
// stats, and returns that.
func (p *Publisher) claimAndPublish(ctx context.Context, stats *RoundStats, ev Event, othersSent bool) outcome {
	owner := p.cfg.InstanceID
	won, err := p.storeCall(ctx, func(ctx context.Context) (bool, error) {
		return p.store.Claim(ctx, ev, owner)
	})
	if err != nil {
		// The claim may have changed the row all the same: release whatever is ours before
		// the next claim.
		p.releaseOwed = true
		p.health.storeReached(err, ctx.Err() != nil)
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: could not claim an event; trying again next round",
				slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID), slog.Any("error", err))
		}
		stats.add(outcomeClaimFailed)
		return outcomeClaimFailed
	}
	if !won {
		// Normal with several instances: the SELECT only found a candidate.
		p.log.DebugContext(ctx, "outbox: event taken by another instance, skip", slog.Int64("id", ev.ID),
			slog.String("event_id", ev.EventID))
		stats.add(outcomeLost)
		p.m.claimLost(ctx)
		return outcomeLost
	}

	// From here this instance holds the lease. Its outcome is recorded even if ctx is
	// cancelled, so a clean shutdown never leaves a row SENDING for a whole lease.
	p.held.Add(1)
	held := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		return p.record(held, stats, p.releaseWrite(ev, "publisher stopped before sending", outcomeReleased))
	}
	if err := p.send(held, ev); err != nil {
		o, down := p.failed(held, stats, ev, err, othersSent)
		if !down {
			err = nil // the broker answered, if only to refuse this message
		}
		p.brokerAnswered(ctx, err)
		return o
	}
	p.brokerAnswered(ctx, nil)
	return p.record(held, stats, p.successWrite([]Event{ev}))
}

// send calls the sender within SendTimeout; a panic in the sender is an error like any other.
func (p *Publisher) send(ctx context.Context, ev Event) (err error) {
	defer p.m.sendDone(ctx, ev, p.m.now(), &err)
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.SendTimeout)
	defer cancel()
	ctx, span := p.tracing.start(ctx, ev)
	defer func() { endSendSpan(span, err) }()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sender panicked: %v", r)
		}
	}()
	errs := p.sender.Send(ctx, []Event{ev}, p.keyOrder.Load())
	if len(errs) != 1 {
		return fmt.Errorf("sender returned %d results for 1 event", len(errs))
	}
	return errs[0]
}

// storeCall runs one conditional store write within StoreTimeout.
func (p *Publisher) storeCall(ctx context.Context, fn func(context.Context) (bool, error)) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	return fn(ctx)
}

// outage is the publisher's view of an unavailable broker: while down, it claims nothing
// but one event per probe, the probes further apart each time up to MaxProbeDelay. These
// are pauses of this process, timed on its monotonic clock; no lease or retry time depends
// on them.
type outage struct {
	down   bool
	since  time.Time
	delay  time.Duration
	next   time.Time
	probes int
}

// enterOutage starts an outage, or prolongs it after a probe failed.
func (p *Publisher) enterOutage(ctx context.Context, cause error) {
	o := &p.outage
	now := time.Now()
	if !o.down {
		*o = outage{down: true, since: now, delay: min(firstProbeDelay, p.cfg.Tuning.MaxProbeDelay)}
		p.m.outage(ctx)
		p.health.brokerDown(true, now)
		p.log.ErrorContext(ctx, "outbox: broker unavailable; claims paused, probing until a send succeeds (no retries are spent)",
			slog.Any("error", cause))
	} else {
		o.probes++
		o.delay = min(o.delay*2, p.cfg.Tuning.MaxProbeDelay)
		p.log.WarnContext(ctx, "outbox: broker still unavailable",
			slog.Duration("down_for", now.Sub(o.since).Round(time.Millisecond)), slog.Int("probes", o.probes),
			slog.Duration("next_probe_in", o.delay), slog.Any("error", cause))
	}
	o.next = now.Add(o.delay)
}

// endOutage resumes full-speed claims after a send got an answer from the broker.
func (p *Publisher) endOutage(ctx context.Context) {
	if !p.outage.down {
		return
	}
	// At warn, as the outage itself: whoever saw it start also sees it end.
	p.log.WarnContext(ctx, "outbox: broker reachable again; claims resumed",
		slog.Duration("down_for", time.Since(p.outage.since).Round(time.Millisecond)))
	p.outage = outage{}
	p.health.brokerDown(false, time.Time{})
}
