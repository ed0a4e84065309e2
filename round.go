package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// This file is the publish path, top to bottom: the state the rounds share and its
// invariants, the scan loop, a round (settle what earlier rounds owe, then claim, send and
// record, in batch or per row), the broker's outage, and what the stop settles. The sends
// are in claim.go, the writes that record outcomes in record.go.

// roundState is what the publisher's rounds share: those of the scan loop, of
// PublishPending, the acknowledgements' flush and the stop. Everything in it is guarded by
// mu, and these hold whenever mu is free:
//
//  1. Rounds never overlap: a round holds mu from its settle to its last record, and so do
//     flushAcks and stop. No callback runs under mu (OnDeadLetter is queued, see
//     deadletters.go), and no store or send call outlives the round that made it.
//  2. pending holds the writes (outcomes of events this instance holds) the store failed
//     to record, oldest first, at most maxPending (past it the oldest is dropped, and its
//     rows are left to the reclaim). A round records them all (settle) before it claims:
//     while any is left, the round claims nothing.
//  3. unacked holds events Run's batch rounds sent whose SUCCESS is not yet recorded; they
//     are SENDING under this instance. They are recorded by the next claim (its
//     Succeeded), by flushAcks after ackDelay, or at the stop, and never released: a claim
//     that fails moves them to pending, and the stop moves them to pending before it
//     releases what is owned.
//  4. releaseOwed says a claim's outcome is unknown (its commit failed): rows may be
//     SENDING under this instance that it does not know it holds. With pending empty and
//     unacked empty (3), settle releases every row SENDING under the instance before the
//     next claim, and clears it.
//  5. outage is the broker's state as the sends found it: while down, a round claims at
//     most one event, and only when the next probe is due (outage.next).
//  6. gather is the coalescing window, fed by every round's claim (see coalesce.go).
//  7. ahead holds a batch a round of Run claimed while it sent the batch before (in key
//     order, through a backlog: the claim and the send, of different biz nos, overlap
//     instead of following each other): SENDING under this instance, not yet sent. The
//     next round sends it before it claims again. A round that stops, or finds the broker
//     unavailable, puts such a batch back unsent instead of keeping it; a release of owned
//     rows (4, and the stop) releases it.
type roundState struct {
	mu          sync.Mutex
	outage      outage
	pending     []write     // (2) outcomes the store failed to record, tried again before the next claim
	unacked     []Event     // (3) sent in Run's rounds, SUCCESS not yet recorded: the next claim records it
	gather      *gatherer   // (6)
	releaseOwed bool        // (4) a claim's outcome was unknown: release our rows before the next claim
	ahead       *aheadBatch // (7) claimed beside the last send, to send next
	aheadRest   int         // (7) rounds left that claim nothing beside their send
}

// aheadBatch is a batch claimed beside a send, with what its claim said and the limit it
// was claimed with.
type aheadBatch struct {
	evs   []Event
	more  bool
	limit int
}

// scan is Run's publishing loop: a round, then a pause (PollInterval, or what the round
// asked for), ended early by a wake-up after its coalescing window, or at once by a
// reclaim that put events back. Successes are recorded
// by the next round's claim, or after ackDelay if no round comes by then.
func (p *Publisher) scan(ctx context.Context, wake, reclaimed <-chan struct{}) {
	round := time.NewTimer(0)
	defer round.Stop()
	due := time.Now() // when round fires
	acks := time.NewTimer(time.Hour)
	acks.Stop()
	defer acks.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			now := time.Now()
			w := p.rounds.gather.delay(now)
			if at := now.Add(w); at.Before(due) {
				round.Reset(w)
				due = at
				p.rounds.gather.willWait(w > 0)
			}
			continue
		case <-acks.C:
			p.flushAcks(ctx)
			continue
		case <-reclaimed:
			round.Stop()
		case <-round.C:
		}
		_, next, _ := p.round(ctx, true)
		due = time.Now().Add(next)
		round.Reset(next)
		if p.owesAcks() && next > ackDelay {
			acks.Reset(ackDelay)
		} else {
			acks.Stop()
		}
	}
}

// PublishPending runs one round and reports what it did. In per-row mode it reads up to
// [Tuning.BatchSize] due candidates and, for each one, claims it and, if the claim was won,
// sends it and records the outcome. In batch mode it claims a batch of due events at once,
// sends them, and records the successes with one statement. One event's error or panic is
// logged and never aborts the round; once ctx is cancelled the round stops claiming (a
// claim already begun finishes, within [Tuning.StoreTimeout]), and returns to WAIT what it
// claimed and did not send. The returned error is the claim's (or
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
	p.rounds.mu.Lock()
	defer p.rounds.mu.Unlock()
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
	probe := p.rounds.outage.down
	if probe {
		if wait := time.Until(p.rounds.outage.next); wait > 0 {
			return stats, wait, nil
		}
		// Whatever this probe finds (nothing due, a claim lost), the next waits as long.
		p.rounds.outage.next = time.Now().Add(p.rounds.outage.delay)
	}
	var more bool // the round took all it could: more may be due
	if p.cfg.Tuning.ClaimPerRow {
		more, err = p.publishPerRow(ctx, &stats, probe)
	} else {
		more, err = p.publishBatch(ctx, &stats, probe, deferAcks)
	}
	switch {
	case p.rounds.outage.down:
		return stats, time.Until(p.rounds.outage.next), err
	case probe:
		return stats, 0, err // the broker answers again: whatever waited goes at once
	case err == nil && more && stats.clean():
		return stats, 0, nil // a backlog: go on at once
	}
	return stats, p.cfg.PollInterval, err
}

// settle records what earlier rounds could not, and then, if a claim's outcome was
// unknown, returns to WAIT every row still SENDING under this instance: with nothing in
// flight and nothing left to record, such a row is one this instance does not know it
// holds. An error means the store is still failing; the round claims nothing.
func (p *Publisher) settle(ctx context.Context, stats *RoundStats) error {
	for len(p.rounds.pending) > 0 {
		w := p.rounds.pending[0]
		n, err := p.execWrite(context.WithoutCancel(ctx), w)
		if err != nil {
			return fmt.Errorf("outbox: record earlier outcomes: %w", err)
		}
		p.rounds.pending = p.rounds.pending[1:]
		p.recorded(ctx, stats, w, n)
		p.log.InfoContext(ctx, "outbox: recorded an outcome that had failed to record", slog.String("what", w.what),
			slog.Int("count", len(w.ids)))
	}
	if !p.rounds.releaseOwed {
		return nil
	}
	n, err := p.releaseOwned(ctx, "released by its owner: the claim's outcome was unknown")
	if err != nil {
		return err
	}
	p.rounds.releaseOwed = false
	p.rounds.ahead = nil // released with the rest
	if n > 0 {
		p.log.WarnContext(ctx, "outbox: released events claimed by a claim whose outcome was unknown", slog.Int64("count", n))
	}
	return nil
}

func (p *Publisher) publishBatch(ctx context.Context, stats *RoundStats, probe, deferAcks bool) (more bool, err error) {
	limit := int(p.limit.Load())
	if probe {
		limit = 1
	}
	if err := ctx.Err(); err != nil {
		return false, err // stopped: no claim begins (what is unacked, the stop records)
	}
	var evs []Event
	if ahead := p.rounds.ahead; ahead != nil {
		// Claimed while the round before sent its batch: sent now, before any other claim.
		p.rounds.ahead = nil
		evs, more, limit = ahead.evs, ahead.more, ahead.limit
	} else {
		acked := p.takeUnacked()
		var res ClaimResult
		res, err = p.claimBatch(ctx, limit, acked, false)
		if err != nil {
			p.claimFailed(acked)
			return false, err
		}
		if len(acked) > 0 {
			p.recorded(ctx, stats, p.successWrite(acked), res.Succeeded)
		}
		evs, more = res.Events, res.More
		p.held.Add(int64(len(evs)))
		if len(evs) == 0 {
			p.rounds.gather.claimed(time.Now(), 0, 0, 0, more)
			return more, nil
		}
	}
	stats.Candidates, stats.Claimed = len(evs), len(evs)

	// From here this instance holds the leases; their outcomes are recorded even if ctx is
	// cancelled.
	held := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		p.releaseUnsent(ctx, stats, evs, "publisher stopped before sending")
		return more, nil
	}
	// In key order, through a backlog, the next batch is claimed while this one is sent (see
	// roundState.ahead): the claim takes none of this batch's biz nos, all in flight.
	// A claim ahead that found nothing (the backlog is of biz nos in flight, a hot key's)
	// is not tried again for the next aheadRest rounds.
	var next chan aheadClaim
	nextLimit := int(p.limit.Load()) // as the batches before this one left it
	if deferAcks && !probe && more && p.keyOrder.Load() {
		if p.rounds.aheadRest > 0 {
			p.rounds.aheadRest--
		} else {
			next = make(chan aheadClaim, 1)
			acked := p.takeUnacked()
			go func() {
				res, err := p.claimBatch(ctx, nextLimit, acked, true)
				next <- aheadClaim{res: res, err: err, acked: acked}
			}()
		}
	}
	start := time.Now()
	errs := p.sendBatch(held, evs)
	now := time.Now()
	p.adaptLimit(len(evs), limit, now.Sub(start))
	fresh, age := meanFreshAge(evs, now)
	p.rounds.gather.claimed(now, len(evs), fresh, age, more)

	// Successes are recorded first: a failure to record a retry costs a later resend, a
	// failure to record a success a duplicate.
	sent := make([]Event, 0, len(evs))
	sentTo := map[string]bool{} // the topics an event was sent to
	for i, ev := range evs {
		if stored(errs[i]) {
			sent = append(sent, ev)
			sentTo[p.topics.of(&ev)] = true
			p.unconfirmed(ctx, ev, errs[i])
		}
	}
	switch {
	case len(sent) == 0:
	case deferAcks && ctx.Err() == nil:
		p.rounds.unacked = append(p.rounds.unacked, sent...) // the next claim records them
	default:
		p.record(held, stats, p.successWrite(sent))
	}
	var unavailable error // the first failure that says the broker is down
	for i, ev := range evs {
		if err := errs[i]; !stored(err) {
			p.outcomeSafe(ctx, stats, ev, func() outcome {
				// Only a send to the same topic makes the failure the message's own: a topic
				// that does not exist is unavailable for its events alone.
				o, down := p.failed(held, stats, ev, err, sentTo[p.topics.of(&ev)])
				if down && unavailable == nil {
					unavailable = err
				}
				return o
			})
		}
	}
	p.brokerAnswered(ctx, unavailable)
	if next != nil {
		return p.keepAhead(ctx, stats, <-next, nextLimit)
	}
	return more, nil
}

// takeUnacked returns the sent events whose success the next claim records, and forgets
// them: the caller records them, or moves them to pending.
func (p *Publisher) takeUnacked() []Event {
	acked := p.rounds.unacked
	p.rounds.unacked = nil
	return acked
}

// claimBatch is a batch claim of up to limit events that also records the successes of
// acked; ahead says it is made beside a send ([ClaimRequest.Ahead]). It touches no state
// the rounds share (see roundState): a round may run it beside its send.
func (p *Publisher) claimBatch(ctx context.Context, limit int, acked []Event, ahead bool) (ClaimResult, error) {
	req := ClaimRequest{Owner: p.cfg.InstanceID, Limit: limit, MaxBytes: p.cfg.Tuning.MaxClaimBytes, Ahead: ahead}
	for _, ev := range acked {
		req.Succeeded = append(req.Succeeded, ev.ID)
	}
	var res ClaimResult
	_, err := p.fetch(ctx, "claim due events", func(context.Context) ([]Event, error) {
		cctx, cancel := p.claimContext(ctx)
		defer cancel()
		var err error
		res, err = p.store.ClaimDue(cctx, req)
		return res.Events, err
	})
	return res, err
}

// claimFailed is what a failed claim leaves: it may have committed all the same, so
// whatever is ours is released before the next claim, once the successes it carried (and
// any others not yet recorded) are.
func (p *Publisher) claimFailed(acked []Event) {
	if len(acked) > 0 {
		p.rounds.pending = append(p.rounds.pending, p.successWrite(acked))
	}
	if unacked := p.takeUnacked(); len(unacked) > 0 {
		p.rounds.pending = append(p.rounds.pending, p.successWrite(unacked))
	}
	p.rounds.releaseOwed = true
}

// aheadRest is how many rounds claim nothing beside their send after such a claim found
// nothing.
const aheadRest = 8

// aheadClaim is the outcome of a claim made beside a send: the claim's result or error, and
// the successes it carried.
type aheadClaim struct {
	res   ClaimResult
	err   error
	acked []Event
}

// keepAhead settles a claim made beside the round's send: its successes are counted, and
// its events kept for the next round (roundState.ahead), unless the round stopped or found
// the broker down, which puts them back unsent. It returns whether more may be due, and the
// claim's error.
func (p *Publisher) keepAhead(ctx context.Context, stats *RoundStats, a aheadClaim, limit int) (bool, error) {
	if a.err != nil {
		p.claimFailed(a.acked)
		return false, a.err
	}
	if len(a.acked) > 0 {
		p.recorded(ctx, stats, p.successWrite(a.acked), a.res.Succeeded)
	}
	evs := a.res.Events
	p.held.Add(int64(len(evs)))
	if len(evs) == 0 {
		p.rounds.aheadRest = aheadRest
		return a.res.More, nil
	}
	reason := ""
	switch {
	case ctx.Err() != nil:
		reason = "publisher stopped before sending"
	case p.rounds.outage.down:
		reason = "not sent: claimed while the broker was found unavailable"
	}
	if reason == "" {
		p.rounds.ahead = &aheadBatch{evs: evs, more: a.res.More, limit: limit}
		return true, nil
	}
	p.releaseUnsent(ctx, stats, evs, reason)
	return a.res.More, nil
}

// releaseUnsent returns claimed events that were never tried to WAIT, due now, each
// recorded even if ctx is cancelled.
func (p *Publisher) releaseUnsent(ctx context.Context, stats *RoundStats, evs []Event, reason string) {
	held := context.WithoutCancel(ctx)
	for _, ev := range evs {
		p.outcomeSafe(ctx, stats, ev, func() outcome {
			return p.record(held, stats, p.releaseWrite(ev, reason, 0, outcomeReleased))
		})
	}
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
	sentTo := map[string]bool{} // the topics an event was sent to in this round
	for _, ev := range candidates {
		if ctx.Err() != nil {
			break
		}
		if stopped[ev.BizNo] {
			continue // an earlier event of the key is still open: its claim would lose
		}
		topic := p.topics.of(&ev)
		o := p.claimAndPublishSafe(ctx, stats, ev, sentTo[topic])
		if o == outcomeSent {
			sentTo[topic] = true
		}
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
		if p.rounds.outage.down {
			break // the broker is down: leave the other candidates to the probes
		}
	}
	now := time.Now()
	fresh, age := meanFreshAge(candidates, now)
	p.rounds.gather.claimed(now, len(candidates), fresh, age, len(candidates) == limit)
	return len(candidates) == limit, nil
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
	cctx, cancel := p.claimContext(ctx)
	won, err := p.store.Claim(cctx, ev, owner)
	cancel()
	if err != nil {
		// The claim may have changed the row all the same: release whatever is ours before
		// the next claim.
		p.rounds.releaseOwed = true
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
		return p.record(held, stats, p.releaseWrite(ev, "publisher stopped before sending", 0, outcomeReleased))
	}
	err = p.send(held, ev)
	if !stored(err) {
		o, down := p.failed(held, stats, ev, err, othersSent)
		if !down {
			err = nil // the broker answered, if only to refuse this message
		}
		p.brokerAnswered(ctx, err)
		return o
	}
	p.brokerAnswered(ctx, nil)
	p.unconfirmed(ctx, ev, err)
	return p.record(held, stats, p.successWrite([]Event{ev}))
}

// unconfirmed counts and logs an event the broker stored without confirming it durable in
// time ([ErrUnconfirmed]): sent, and not sent again. err is its sender's answer.
func (p *Publisher) unconfirmed(ctx context.Context, ev Event, err error) {
	if err == nil {
		return
	}
	p.m.unconfirmed(ctx, ev)
	p.log.WarnContext(ctx, "outbox: the broker stored an event but did not confirm it flushed or replicated in time; it counts as sent",
		slog.Int64("id", ev.ID), slog.String("event_id", ev.EventID), slog.String("topic", ev.Topic), slog.Any("error", err))
}

// claimContext is the context of a claim: bounded by StoreTimeout and not cut by the
// stop. A claim the stop cancelled half way (its COMMIT sent, its answer not read) would
// leave its outcome unknown, and its rows to a blind release; one let finish has a known
// outcome, and what it claimed is released as claimed and not sent.
func (p *Publisher) claimContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), p.cfg.Tuning.StoreTimeout)
}

// failed records a send that failed, and reports whether the failure says the broker is
// unavailable. Such an event goes back as it was, with no retry counted, unless another
// event of the round got through to its topic, which makes the failure the message's own:
// the sender could have sent it elsewhere. Not so in key order, where a biz no's events go
// to its queue and nowhere else: there a queue whose broker is away fails its keys alone,
// which go back with no retry counted and wait [partialOutageDelay] (on the database's
// clock), while the other queues' keys carry on. An event whose turn never came before the
// send deadline goes back too; any other failure is retried or dead-lettered.
func (p *Publisher) failed(ctx context.Context, stats *RoundStats, ev Event, cause error, othersSent bool) (outcome, bool) {
	switch {
	case errors.Is(cause, ErrNotSent):
		return p.record(ctx, stats, p.releaseWrite(ev, cause.Error(), 0, outcomeReleased)), false
	case isOutage(cause) && !othersSent:
		return p.record(ctx, stats, p.releaseWrite(ev, "broker unavailable: "+cause.Error(), 0, outcomeUnavailable)), true
	case isOutage(cause) && p.keyOrder.Load():
		return p.record(ctx, stats, p.releaseWrite(ev, "its queue unavailable: "+cause.Error(), partialOutageDelay, outcomeUnavailable)), false
	}
	return p.record(ctx, stats, p.failureWrite(ev, cause)), false
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
	o := &p.rounds.outage
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
	if !p.rounds.outage.down {
		return
	}
	// At warn, as the outage itself: whoever saw it start also sees it end.
	p.log.WarnContext(ctx, "outbox: broker reachable again; claims resumed",
		slog.Duration("down_for", time.Since(p.rounds.outage.since).Round(time.Millisecond)))
	p.rounds.outage = outage{}
	p.health.brokerDown(false, time.Time{})
}

// owesAcks reports whether sent events wait for their success to be recorded.
func (p *Publisher) owesAcks() bool {
	p.rounds.mu.Lock()
	defer p.rounds.mu.Unlock()
	return len(p.rounds.unacked) > 0
}

// flushAcks records the successes no claim has carried.
func (p *Publisher) flushAcks(ctx context.Context) {
	p.rounds.mu.Lock()
	defer p.rounds.mu.Unlock()
	if len(p.rounds.unacked) == 0 {
		return
	}
	var stats RoundStats
	sent := p.rounds.unacked
	p.rounds.unacked = nil
	p.record(context.WithoutCancel(ctx), &stats, p.successWrite(sent))
}

// stop runs when Run's loops have ended: it records what is still unrecorded and returns
// to WAIT every row still SENDING under this instance, so that none waits for the lease.
func (p *Publisher) stop(ctx context.Context) {
	p.rounds.mu.Lock()
	defer p.rounds.mu.Unlock()
	if len(p.rounds.unacked) > 0 {
		// Recorded before the release below, which would otherwise send them again.
		p.rounds.pending = append(p.rounds.pending, p.successWrite(p.rounds.unacked))
		p.rounds.unacked = nil
	}
	var stats RoundStats
	if err := p.settle(ctx, &stats); err != nil {
		p.log.ErrorContext(ctx, "outbox: stopping with outcomes unrecorded; their events will be reclaimed after the lease",
			slog.Int("writes", len(p.rounds.pending)), slog.Any("error", err))
		return
	}
	p.rounds.ahead = nil // SENDING under this instance: released with the rest
	n, err := p.releaseOwned(ctx, "released by its owner, which stopped")
	if err != nil {
		p.log.ErrorContext(ctx, "outbox: stopping with events claimed; they will be reclaimed after the lease", slog.Any("error", err))
		return
	}
	if n > 0 {
		p.log.InfoContext(ctx, "outbox: released claimed events on stop", slog.Int64("count", n))
	}
}

// ackDelay bounds how long a success stays unrecorded waiting for the next claim to carry
// it; past it, it is recorded by a statement of its own.
const ackDelay = 50 * time.Millisecond
