package outbox

import (
	"sync"
	"time"
)

// Health is what a readiness or liveness probe needs to know about a [Publisher], read by
// [Publisher.Health] from memory: asking costs no database or broker call.
//
// A broker outage is not the service's failure: the events wait safely in the table and go
// out once the broker is back, so a probe that takes the service out of rotation for it
// gains nothing. Alert on it instead. A store that keeps failing is a different matter:
// the service's own transactions use the same database. With several databases, each
// publisher has its own Health: a database that is down shows in its publisher's alone
// (see docs/many-databases.md).
type Health struct {
	// InstanceID is the owner the publisher writes to claim_owner ([Config.InstanceID]).
	InstanceID string
	// StoreName is the publisher's [Config.StoreName]: of a service that publishes several
	// databases, the one this Health is about ("" when unnamed).
	StoreName string
	// Running reports whether the publisher runs: from a [Publisher.Start] (or Run) that
	// succeeded until its stop has finished. A Start that was refused returned the reason.
	Running bool
	// LastRoundOK is when a round last reached the store without an error: its claim (or
	// its candidate query) went through, and everything earlier rounds owed was recorded.
	// Rounds run every [Config.PollInterval] even when nothing is due (while the broker is
	// unavailable, only at each probe, at most [Tuning.MaxProbeDelay] apart), so with
	// Running, an old LastRoundOK says the store is failing or a round is stuck. Zero if
	// never.
	LastRoundOK time.Time
	// LastError is the text of the store error of the last round that met one, if that
	// round came after LastRoundOK ("" otherwise); LastErrorAt is when. A string, so that
	// Health encodes as it reads (as JSON, for a health endpoint), as the relay's does.
	LastError   string
	LastErrorAt time.Time
	// BrokerUnavailable reports that the publisher finds the broker unavailable: it has
	// paused its claims and probes it. BrokerUnavailableSince is when that began.
	BrokerUnavailable      bool
	BrokerUnavailableSince time.Time
}

// healthState is what Health reads, kept under its own mutex so that a probe never waits for
// a round.
type healthState struct {
	mu                sync.Mutex
	lastOK, lastErrAt time.Time
	lastErr           error
	down              bool
	downSince         time.Time
}

// Health reports the publisher's state for a readiness probe. It reads memory only.
func (p *Publisher) Health() Health {
	h := &p.health
	h.mu.Lock()
	defer h.mu.Unlock()
	out := Health{
		InstanceID:             p.cfg.InstanceID,
		StoreName:              p.cfg.StoreName,
		Running:                p.running.Load(),
		LastRoundOK:            h.lastOK,
		BrokerUnavailable:      h.down,
		BrokerUnavailableSince: h.downSince,
	}
	if h.lastErr != nil && !h.lastErrAt.Before(h.lastOK) {
		out.LastError, out.LastErrorAt = h.lastErr.Error(), h.lastErrAt
	}
	return out
}

// storeReached records the outcome of a round's store call: err nil means the round
// reached the store; a cancelled round (ctx done) says nothing about the store.
func (h *healthState) storeReached(err error, cancelled bool) {
	if cancelled {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.lastOK = now
		return
	}
	h.lastErr, h.lastErrAt = err, now
}

// brokerDown records the start (down) or the end of an outage.
func (h *healthState) brokerDown(down bool, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.down, h.downSince = down, since
	if !down {
		h.downSince = time.Time{}
	}
}
