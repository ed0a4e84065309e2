package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

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
