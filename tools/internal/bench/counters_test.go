package bench

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCountersArithmetic: a difference of two snapshots leaves out the snapshot statement,
// and the calibrated writers' part is taken out per event.
func TestCountersArithmetic(t *testing.T) {
	c0 := Counters{Questions: 100, Com: map[string]int64{"insert": 10, "commit": 10, "show_status": 5}, LSN: 1000, BinlogBytes: 50_000}
	c1 := Counters{Questions: 161, Com: map[string]int64{"insert": 30, "commit": 40, "update": 20, "show_status": 6}, LSN: 9000, BinlogBytes: 70_000}
	d := c1.sub(c0)
	require.Equal(t, int64(60), d.Questions)
	require.Equal(t, map[string]int64{"insert": 20, "commit": 30, "update": 20}, d.Com)
	require.Equal(t, int64(8000), d.LSN)
	require.Equal(t, int64(20_000), d.BinlogBytes)

	writer := Counters{Questions: 60, Com: map[string]int64{"insert": 20, "commit": 20}, LSN: 4000, BinlogBytes: 12_000}.per(20)
	require.Equal(t, 3.0, writer.Questions)
	require.Equal(t, 200.0, writer.RedoBytes)
	require.Equal(t, 600.0, writer.BinlogBytes)

	q, com, redo, binlog := d.minus(writer, 20)
	require.Equal(t, 0.0, q)
	require.Equal(t, map[string]float64{"commit": 10, "update": 20}, com, "the writers' inserts and commits are gone")
	require.Equal(t, 4000.0, redo)
	require.Equal(t, 8000.0, binlog, "the writers' binary log is gone")

	require.Equal(t, "update 2.00, commit 1.00; of these, prepared 2.00 (each also a PREPARE and a CLOSE)",
		Breakdown(map[string]float64{"commit": 1, "update": 2, "stmt_execute": 2, "stmt_prepare": 2}))
}

// TestBinlogCounters: with the binary log off the counter stays 0, and the difference and
// what is left after the writers are 0, not unknown; a server without the counter (MySQL)
// leaves every step unknown (-1), printed as "-".
func TestBinlogCounters(t *testing.T) {
	off := Counters{Com: map[string]int64{"show_status": 1}, LSN: 10, BinlogBytes: 0}
	offEnd := Counters{Questions: 1, Com: map[string]int64{"show_status": 2}, LSN: 20, BinlogBytes: 0}
	d := offEnd.sub(off)
	require.Equal(t, int64(0), d.BinlogBytes)
	cal := d.per(10)
	require.Equal(t, 0.0, cal.BinlogBytes)
	_, _, _, binlog := d.minus(cal, 10)
	require.Equal(t, 0.0, binlog)
	require.Equal(t, "0.00", KB(binlog))

	unknown := Counters{Com: map[string]int64{}, LSN: 10, BinlogBytes: -1}
	d = offEnd.sub(unknown)
	require.Equal(t, int64(-1), d.BinlogBytes, "unknown at either end is unknown")
	require.Equal(t, int64(-1), unknown.sub(offEnd).BinlogBytes)
	cal = d.per(10)
	require.Equal(t, -1.0, cal.BinlogBytes)
	_, _, redo, binlog := offEnd.sub(off).minus(cal, 10)
	require.True(t, math.IsNaN(binlog), "a calibration that does not know leaves the rest unknown")
	require.Equal(t, "-", KB(binlog))
	require.Equal(t, 0.0, redo, "the redo is known on both sides")

	// Less redo than the calibration says the writers wrote: noise, not unknown.
	_, _, redo, _ = offEnd.sub(off).minus(PerEvent{RedoBytes: 2}, 10)
	require.Equal(t, -10.0, redo)
	require.Equal(t, "-0.01", KB(redo))
	require.Equal(t, -1.0, Counters{Com: map[string]int64{}, BinlogBytes: 5}.per(0).BinlogBytes, "no events: unknown")

	require.Equal(t, "1.50", KB(1536))
}
