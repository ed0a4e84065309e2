package outbox

import (
	"context"
	"log/slog"
	"time"
)

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

