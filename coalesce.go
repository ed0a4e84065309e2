package outbox

import (
	"math"
	"sync"
	"time"
)

// Coalescing. At a steady commit rate every commit wakes its instance's publisher, and a
// round per wake-up costs the database a claim transaction per event or two. A wake-up
// therefore waits a short window before its round, so that the round carries what was
// committed meanwhile, by this instance or by any other. The window is set by what the
// claims see, with no coordination between instances:
//
//   - The events a round sends tell how long they took from their commit (the store's clock
//     dates its read, this process's clock the rest). A round that waited adjusts the
//     window so that this mean age comes to Config.CoalesceDelay: it grows while the events are younger, shrinks when older,
//     and closes when they are older than that without waiting (at a high rate rounds are
//     long, and carry many events anyway); it opens again once they are half as old.
//     With several instances each sees the events of all, so each one's window settles at
//     about the number of instances times the spacing of the fleet's rounds; an instance
//     whose rounds follow another's closely sees young events and waits longer, which
//     spreads the instances' rounds apart.
//   - Waiting pays only when something comes meanwhile: a wake-up waits only when the rate
//     at which this publisher claims events would bring more than one in the window. A
//     lone event a minute goes at once.
//   - A round that found a backlog is followed at once, without waiting.
type gatherer struct {
	mu     sync.Mutex
	target time.Duration // Config.CoalesceDelay; off when not positive
	max    time.Duration // the longest window
	window time.Duration
	rate   float64   // events claimed per second, decaying (rateTau)
	at     time.Time // when rate was last brought up to date
	waited bool      // the round about to run waited a window
}

// rateTau is the time constant of the claim rate's decay: the rate is an average over about
// the last second.
const rateTau = time.Second

// maxWindowFactor bounds the window, as a multiple of the target.
const maxWindowFactor = 20

func newGatherer(target, poll time.Duration) *gatherer {
	return &gatherer{target: target, window: target, max: min(maxWindowFactor*target, poll)}
}

// decayed returns the claim rate as of now; the caller holds g.mu.
func (g *gatherer) decayed(now time.Time) float64 {
	if g.at.IsZero() {
		return 0
	}
	return g.rate * math.Exp(-now.Sub(g.at).Seconds()/rateTau.Seconds())
}

// delay is how long a wake-up at now waits before its round.
func (g *gatherer) delay(now time.Time) time.Duration {
	if g == nil || g.target <= 0 {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.window == 0 || g.decayed(now)*g.window.Seconds() < 1 {
		return 0
	}
	return g.window
}

// willWait records whether the next round waited a window.
func (g *gatherer) willWait(waited bool) {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.waited = waited
	g.mu.Unlock()
}

// claimed records a claim at now of n events whose mean age, for the ones never tried
// before, was age (fresh says how many of them there were), and backlog whether the claim
// took all it was allowed.
func (g *gatherer) claimed(now time.Time, n, fresh int, age time.Duration, backlog bool) {
	if g == nil || g.target <= 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rate = g.decayed(now) + float64(n)/rateTau.Seconds()
	g.at = now
	waited := g.waited
	g.waited = false
	switch {
	case backlog || fresh == 0:
		return // the ages say nothing about the window
	case g.window == 0:
		// Closed because the events were older than the target without waiting (the
		// rounds themselves take that long): open again once they are clearly younger, not
		// at the first round that happens to be quick.
		if age < g.target/2 {
			g.window = g.target / 2
		}
		return
	case !waited:
		return // not waiting was the rate's doing, not the window's
	}
	if age <= 0 {
		age = time.Microsecond
	}
	// Towards the target, by at most a factor of two down and a quarter up per round, so
	// that one odd round (a pause of the writers, a slow commit) moves it little. Below a
	// quarter of the target it closes: the events are old enough without waiting.
	f := min(max(float64(g.target)/float64(age), 0.5), 1.25)
	g.window = min(time.Duration(float64(g.window)*f), g.max)
	if g.window < g.target/4 {
		g.window = 0
	}
}

// meanFreshAge returns how many of evs were never tried before and their mean age at now
// (sent): their commit-to-send time, dated by the store's clock at its read and by this
// process's since. A retried or reclaimed event waited for its backoff or lease, and one
// written with a delay for its time, not for a round.
func meanFreshAge(evs []Event, now time.Time) (int, time.Duration) {
	var n int
	var sum time.Duration
	for _, ev := range evs {
		if ev.RetryCount == 0 && ev.ReclaimCount == 0 && ev.Read.Deferred == 0 && !ev.Read.At.IsZero() {
			n++
			sum += ev.Read.Age + now.Sub(ev.Read.At)
		}
	}
	if n == 0 {
		return 0, 0
	}
	return n, sum / time.Duration(n)
}
