package outbox

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestScanFloor(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 14, 0, 0, 0, time.UTC)   // process clock
	read := time.Date(2026, 11, 30, 13, 0, 0, 0, time.UTC) // database clock
	var f scanFloor

	assert.True(t, f.begin(t0).full, "no floor yet")
	f.done(time.Time{}, true)
	assert.True(t, f.begin(t0).full, "a claim that read nothing sets none")

	f.done(read, true)
	sc := f.begin(t0.Add(time.Millisecond))
	assert.Equal(t, floorScan{at: read.Add(-floorSlack)}, sc)
	assert.Equal(t, " AND next_retry_time >= '2026-11-30 12:59:59.990'", sc.cond())

	f.done(read.Add(-time.Second), true)
	assert.Equal(t, read.Add(-floorSlack), f.begin(t0.Add(time.Millisecond)).at, "the floor never moves back")

	// A late transaction: the next claim reaches back to its insert, once; the earliest counts.
	f.late(t0.Add(-200 * time.Millisecond))
	f.late(t0.Add(-300 * time.Millisecond))
	f.late(t0.Add(-100 * time.Millisecond))
	sc = f.begin(t0.Add(time.Millisecond))
	assert.Equal(t, 301*time.Millisecond+floorSlack+floorLateMargin, sc.lookback)
	assert.Equal(t, " AND next_retry_time >= LEAST('2026-11-30 12:59:59.990', DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 361000 MICROSECOND))", sc.cond())
	assert.Zero(t, f.begin(t0.Add(time.Millisecond)).lookback)

	// A claim that left rows due, and a reset: the next claim from the start, once.
	f.done(read.Add(time.Second), false)
	assert.True(t, f.begin(t0.Add(2*time.Millisecond)).full)
	assert.False(t, f.begin(t0.Add(3*time.Millisecond)).full)
	f.reset()
	assert.True(t, f.begin(t0.Add(4*time.Millisecond)).full)
	sc = f.begin(t0.Add(5 * time.Millisecond))
	assert.False(t, sc.full)
	assert.Equal(t, read.Add(-floorSlack), sc.at, "an incomplete claim does not move the floor")

	// From the start at least every fullScanEvery (since the last from the start, at +4 ms).
	assert.False(t, f.begin(t0.Add(4*time.Millisecond+fullScanEvery-time.Microsecond)).full)
	assert.True(t, f.begin(t0.Add(4*time.Millisecond+fullScanEvery)).full)
	assert.Empty(t, floorScan{full: true}.cond())

	// A backlog claim reads from the start too: it answers a reset and restarts the timer.
	f.reset()
	f.late(t0)
	f.fromStart(t0.Add(time.Second))
	sc = f.begin(t0.Add(time.Second + time.Millisecond))
	assert.False(t, sc.full)
	assert.Zero(t, sc.lookback)
	assert.False(t, f.begin(t0.Add(time.Second+fullScanEvery-time.Microsecond)).full)
}
