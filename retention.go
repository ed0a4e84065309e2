package outbox

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Purger is implemented by stores that can delete old SUCCESS (and SKIPPED) events
// ([MySQLStore] does).
// A publisher with [Config.Retention] set needs one.
type Purger interface {
	// Purge deletes SUCCESS and SKIPPED events last updated more than olderThan ago, as
	// [MySQLStore.Purge] does, and reports how many it deleted.
	Purge(ctx context.Context, olderThan time.Duration, opts PurgeOptions) (int64, error)
}

// Retention defaults.
const (
	RetentionIntervalDefault = 10 * time.Minute
)

// retain runs one retention pass: it purges the SUCCESS events older than Config.Retention,
// in batches, unless another instance is purging the table right now (the purge lock, see
// [PurgeOptions.Exclusive]), in which case it leaves the work to that one. Every instance
// can run retention: at most one purges at a time, and an instance that dies mid-purge
// frees the lock with its session.
func (p *Publisher) retain(ctx context.Context) {
	purger := p.store.(Purger) // checked by NewPublisher
	start := time.Now()
	n, err := purger.Purge(ctx, p.cfg.Retention, PurgeOptions{
		BatchRows: p.cfg.RetentionBatch,
		Pause:     p.cfg.RetentionPause,
		Exclusive: true,
	})
	switch {
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
