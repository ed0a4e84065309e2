package outbox

import (
	"context"
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
	defer p.keepLeases(ctx, evs)()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.SendTimeout)
	defer cancel()
	ctx, span := p.tracing.start(ctx, evs...)
	defer func() { endSendSpan(span, errs...) }()
	info := p.storeState()
	return p.m.batchSent(ctx, evs, func() []error { return Dispatch(ctx, p.sender, evs, info) })
}

// storeState is the store's StoreInfo as its Check reported it.
func (p *Publisher) storeState() StoreInfo {
	if info := p.storeInfo.Load(); info != nil {
		return *info
	}
	return StoreInfo{}
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

// send calls the sender within SendTimeout; a panic in the sender is an error like any other.
func (p *Publisher) send(ctx context.Context, ev Event) (err error) {
	defer p.m.sendDone(ctx, ev, p.m.now(), &err)
	defer p.keepLeases(ctx, []Event{ev})()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.SendTimeout)
	defer cancel()
	ctx, span := p.tracing.start(ctx, ev)
	defer func() { endSendSpan(span, err) }()
	return Dispatch(ctx, p.sender, []Event{ev}, p.storeState())[0]
}

// keepLeases renews the leases of evs, which this instance holds, every third of
// Tuning.Lease until the function it returns is called (which returns once the renewals
// have stopped): a send that takes longer than that keeps its rows, and is never reclaimed
// and sent twice while it is alive. A send that takes less, as nearly all do, renews
// nothing. A renewal that fails is logged; the next one tries again.
func (p *Publisher) keepLeases(ctx context.Context, evs []Event) (stop func()) {
	every := p.cfg.Tuning.Lease / 3
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(every)
		defer tick.Stop()
		var ids []int64
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			if ids == nil {
				ids = make([]int64, len(evs))
				for i := range evs {
					ids[i] = evs[i].ID
				}
			}
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(p.cfg.Tuning.StoreTimeout, every))
			n, err := p.store.RenewLease(rctx, ids, p.cfg.InstanceID)
			cancel()
			if err != nil {
				p.log.WarnContext(ctx, "outbox: could not renew the leases of a send in flight; its events may be reclaimed and sent again",
					slog.Int("count", len(ids)), slog.Any("error", err))
				continue
			}
			p.log.DebugContext(ctx, "outbox: renewed the leases of a send in flight", slog.Int64("renewed", n), slog.Int("count", len(ids)))
		}
	}()
	return func() {
		close(done)
		<-stopped
	}
}
