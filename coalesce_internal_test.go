package outbox

import (
	"testing"
	"time"
)

// at returns the instant ms milliseconds after base.
func at(base time.Time, ms float64) time.Time {
	return base.Add(time.Duration(ms * float64(time.Millisecond)))
}

// feed runs rounds every period (ms) from base for a second, each claiming n fresh events
// of mean age age(window), waiting the gatherer's delay first, and returns the time after.
func feed(g *gatherer, base time.Time, period float64, n int, age func(window time.Duration) time.Duration) time.Time {
	now := base
	for i := 0; i < int(1000/period); i++ {
		w := g.delay(now)
		g.willWait(w > 0)
		now = now.Add(w)
		g.claimed(now, n, n, age(w), false)
		now = at(now, period)
	}
	return now
}

// At a low rate waiting gathers nothing: a wake-up goes at once.
func TestGatherWaitsOnlyWhenEventsCome(t *testing.T) {
	g := newGatherer(5*time.Millisecond, 5*time.Second)
	base := time.Now()
	if d := g.delay(base); d != 0 {
		t.Fatalf("first wake-up waits %s; nothing is known of the rate yet", d)
	}
	// 50 events a second, one a round: in a 5 ms window a tenth of an event would come.
	now := feed(g, base, 20, 1, func(time.Duration) time.Duration { return time.Millisecond })
	if d := g.delay(now); d != 0 {
		t.Errorf("at 50 events/s a wake-up waits %s", d)
	}
	// 2,000 a second: it waits.
	now = feed(g, now, 1, 2, func(time.Duration) time.Duration { return time.Millisecond })
	if d := g.delay(now); d == 0 {
		t.Error("at 2,000 events/s a wake-up does not wait")
	}
	// Idle for ten seconds: the rate has decayed, a lone event goes at once.
	if d := g.delay(now.Add(10 * time.Second)); d != 0 {
		t.Errorf("after ten idle seconds a wake-up waits %s", d)
	}
}

// The window settles where the claimed events' mean age is the target: it grows while
// they are younger and shrinks when older, within its bounds.
func TestGatherWindowSettlesAtTheTargetAge(t *testing.T) {
	target := 5 * time.Millisecond
	g := newGatherer(target, 5*time.Second)
	base := time.Now()
	// A busy fleet: events are about a third of the window old (each of three instances
	// sees the events committed since the last round of any of them), plus 1 ms.
	age := func(w time.Duration) time.Duration { return w/3 + time.Millisecond }
	now := feed(g, base, 0.5, 20, age)
	if got := age(g.window); got < target*8/10 || got > target*12/10 {
		t.Errorf("mean age settled at %s (window %s), want about %s", got, g.window, target)
	}
	// Events older than the target however short the wait (rounds that take longer than
	// the target): the window closes, and a wake-up goes at once.
	now = feed(g, now, 0.5, 20, func(w time.Duration) time.Duration { return w + 20*time.Millisecond })
	if g.window != 0 || g.delay(now) != 0 {
		t.Errorf("window %s, delay %s after old events; want closed", g.window, g.delay(now))
	}
	// Younger again: it opens, and grows to its bound while they stay young, no further.
	feed(g, now, 0.5, 20, func(time.Duration) time.Duration { return 0 })
	if g.window != maxWindowFactor*target {
		t.Errorf("window %s, want the bound %s", g.window, maxWindowFactor*target)
	}
}

// A claim that found a backlog, or a round that did not wait, or one with only retried
// events, says nothing about the window.
func TestGatherWindowIgnoresRoundsThatDidNotWait(t *testing.T) {
	g := newGatherer(5*time.Millisecond, 5*time.Second)
	now := time.Now()
	w := g.window
	g.claimed(now, 1000, 1000, time.Second, true)
	g.willWait(true)
	g.claimed(now, 1000, 1000, time.Second, true)
	g.claimed(now, 10, 10, time.Second, false)
	g.willWait(true)
	g.claimed(now, 10, 0, 0, false)
	if g.window != w {
		t.Errorf("window moved from %s to %s", w, g.window)
	}
}

// The window never exceeds the poll interval, and NoCoalescing never waits.
func TestGatherBounds(t *testing.T) {
	g := newGatherer(5*time.Millisecond, 20*time.Millisecond)
	if g.max != 20*time.Millisecond {
		t.Errorf("max window %s with a 20 ms poll", g.max)
	}
	off := newGatherer(0, time.Second)
	now := time.Now()
	off.claimed(now, 1000, 1000, time.Millisecond, false)
	if d := off.delay(now); d != 0 {
		t.Errorf("NoCoalescing waits %s", d)
	}
}

func TestMeanFreshAge(t *testing.T) {
	read := time.Now()
	evs := []Event{
		{Read: EventRead{Age: 2 * time.Millisecond, At: read}},
		{Read: EventRead{Age: 4 * time.Millisecond, At: read}},
		{Read: EventRead{Age: time.Hour, At: read}, RetryCount: 1},
		{Read: EventRead{Age: time.Hour, At: read}, ReclaimCount: 1},
		{Read: EventRead{Age: time.Hour}}, // never read by a store that dates its reads
		// written with a delay: it waited for its time, not for a round
		{Read: EventRead{Age: time.Hour, At: read, Deferred: time.Hour - time.Millisecond}},
	}
	n, age := meanFreshAge(evs, read.Add(time.Millisecond))
	if n != 2 || age != 4*time.Millisecond {
		t.Errorf("meanFreshAge = %d, %s; want 2, 4ms (3 ms old when read, sent 1 ms later)", n, age)
	}
}
