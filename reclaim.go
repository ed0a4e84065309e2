package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Reclaim returns to WAIT every SENDING event whose lease ([Tuning.Lease]) has expired,
// judged by claimed_at alone, and reports how many it returned. An event reclaimed for the
// [Tuning.MaxReclaims]th time is dead-lettered instead, as a poison event. A reclaim means an instance
// died (or stalled) between its claim and its outcome: it is logged at warn, since a sudden
// rise in reclaims says instances are dying, which is worse news than a duplicate.
//
// The reclaim goes page by page; when the store fails part way, Reclaim returns the count
// of what it did return to WAIT (counted in the metrics, and the dead letters told) along
// with the error. It returns once the [Config.OnDeadLetter] calls of its dead letters have
// returned (or ctx has ended).
//
// A started publisher calls it every [Tuning.ReclaimInterval]; it may also be called by
// hand, but not after [Publisher.Close] ([ErrClosed]).
func (p *Publisher) Reclaim(ctx context.Context) (int64, error) {
	rctx, exit, err := p.enter(ctx)
	if err != nil {
		return 0, err
	}
	defer exit()
	n, err := p.reclaim(rctx)
	_ = p.dead.wait(ctx, p.dead.mark()) // a ctx that ended ends the wait: the calls still run
	return n, err
}

// reclaim is Reclaim, for the reclaim loop of a started publisher (which does not wait for
// the callbacks).
func (p *Publisher) reclaim(ctx context.Context) (int64, error) {
	sctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	n, dead, err := p.store.ReclaimExpired(sctx, p.cfg.Tuning.Lease, p.cfg.Tuning.MaxReclaims)
	// What the store did before it failed is done: counted and told like the rest.
	p.m.reclaimedEvents(ctx, n, dead)
	for _, ev := range dead {
		p.deadLettered(ctx, ev, errors.New(ev.LastError))
	}
	if n > 0 {
		p.log.WarnContext(ctx, "outbox: reclaimed events whose lease expired; they will be sent again",
			slog.Int64("count", n), slog.Duration("lease", p.cfg.Tuning.Lease))
	}
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: reclaim expired leases", slog.Any("error", err),
				slog.Int64("reclaimed_before_the_error", n))
		}
		return n, err
	}
	return n, nil
}

// retain runs one retention pass: it purges the SUCCESS events older than Config.Retention,
// in batches, unless another instance is purging the table right now (the purge lock, see
// [PurgeOptions.Exclusive]), in which case it leaves the work to that one. Every instance
// can run retention: at most one purges at a time, and an instance that dies mid-purge
// frees the lock with its session.
func (p *Publisher) retain(ctx context.Context) {
	start := time.Now()
	n, err := p.store.Purge(ctx, p.cfg.Retention, PurgeOptions{
		BatchRows: p.cfg.Tuning.RetentionBatch,
		Pause:     p.cfg.Tuning.RetentionPause,
		Exclusive: true,
	})
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		p.log.WarnContext(ctx, "outbox: Retention is set but the store cannot purge", slog.Any("error", err))
	case errors.Is(err, ErrPurgeBusy):
		p.log.DebugContext(ctx, "outbox: retention skipped, another instance is purging")
	case err != nil && ctx.Err() == nil:
		p.log.ErrorContext(ctx, "outbox: retention purge", slog.Any("error", err), slog.Int64("deleted", n))
	case n > 0:
		p.log.InfoContext(ctx, "outbox: retention purged sent events",
			slog.Int64("deleted", n), slog.Duration("older_than", p.cfg.Retention),
			slog.Duration("took", time.Since(start)))
	}
}
