package outbox

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The pending wake-ups stay in order, keep the earliest when full, and each fires once due.
func TestDueWakes(t *testing.T) {
	var w dueWakes
	var woken atomic.Int64
	wake := func() { woken.Add(1) }
	now := time.Now()
	w.add(now.Add(-time.Second), wake) // past: nothing to wait for
	assert.Empty(t, w.times)
	for i := maxDueWakes; i > 0; i-- {
		w.add(now.Add(time.Hour+time.Duration(i)*time.Second), wake)
	}
	assert.Len(t, w.times, maxDueWakes)
	w.add(now.Add(2*time.Hour), wake) // later than all, and full: left to the poll
	assert.Len(t, w.times, maxDueWakes)
	assert.Equal(t, now.Add(time.Hour+maxDueWakes*time.Second), w.times[maxDueWakes-1])
	soon := time.Now().Add(20 * time.Millisecond) // not now's: the adds above take time
	w.add(soon, wake)                             // earlier: the latest goes instead
	w.mu.Lock()                                   // its timer may fire from here on
	if len(w.times) == maxDueWakes {              // it has not yet
		assert.Equal(t, soon, w.times[0])
	}
	assert.Equal(t, now.Add(time.Hour+(maxDueWakes-1)*time.Second), w.times[len(w.times)-1], "the latest went")
	w.mu.Unlock()
	assert.Eventually(t, func() bool { return woken.Load() == 1 }, 10*time.Second, time.Millisecond)
	w.mu.Lock()
	assert.Len(t, w.times, maxDueWakes-1, "the one that fired is gone")
	assert.Equal(t, now.Add(time.Hour+time.Second), w.armed, "the timer set for the next")
	w.mu.Unlock()
	w.timer.Stop()
}

// A delayed event's wake-up comes no earlier than its due time: the delay after the commit
// (the insert was before it), or the NotBefore instant, each with a margin for the rounding
// up to the millisecond.
func TestDueHint(t *testing.T) {
	commit := time.Now()
	assert.Equal(t, commit.Add(time.Second+dueWakeMargin), dueHint{delay: time.Second}.at(commit))
	at := commit.Add(time.Hour)
	assert.Equal(t, at.Add(dueWakeMargin), dueHint{notBefore: at}.at(commit))
}
