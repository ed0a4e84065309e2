package outbox

import (
	"context"
	"errors"
	"log/slog"
)

// Reclaim returns to WAIT every SENDING event whose lease ([Config.Lease]) has expired,
// judged by claimed_at alone, and reports how many it returned. An event reclaimed for the
// [Config.MaxReclaims]th time is dead-lettered instead, as a poison event. A reclaim means an instance
// died (or stalled) between its claim and its outcome: it is logged at warn, since a sudden
// rise in reclaims says instances are dying, which is worse news than a duplicate.
//
// Run calls it every [Config.ReclaimInterval]; it may also be called by hand.
func (p *Publisher) Reclaim(ctx context.Context) (int64, error) {
	sctx, cancel := context.WithTimeout(ctx, p.cfg.Tuning.StoreTimeout)
	defer cancel()
	n, dead, err := p.store.ReclaimExpired(sctx, p.cfg.Tuning.Lease, p.cfg.Tuning.MaxReclaims)
	if err != nil {
		if ctx.Err() == nil {
			p.log.ErrorContext(ctx, "outbox: reclaim expired leases", slog.Any("error", err))
		}
		return 0, err
	}
	p.m.reclaimedEvents(ctx, n, dead)
	for _, ev := range dead {
		p.deadLettered(ctx, ev, errors.New(ev.LastError))
	}
	if n > 0 {
		p.log.WarnContext(ctx, "outbox: reclaimed events whose lease expired; they will be sent again",
			slog.Int64("count", n), slog.Duration("lease", p.cfg.Tuning.Lease))
	}
	return n, nil
}
