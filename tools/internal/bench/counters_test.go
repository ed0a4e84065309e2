package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCountersArithmetic: a difference of two snapshots leaves out the snapshot statement,
// and the calibrated writers' part is taken out per event.
func TestCountersArithmetic(t *testing.T) {
	c0 := Counters{Questions: 100, Com: map[string]int64{"insert": 10, "commit": 10, "show_status": 5}, LSN: 1000}
	c1 := Counters{Questions: 161, Com: map[string]int64{"insert": 30, "commit": 40, "update": 20, "show_status": 6}, LSN: 9000}
	d := c1.sub(c0)
	require.Equal(t, int64(60), d.Questions)
	require.Equal(t, map[string]int64{"insert": 20, "commit": 30, "update": 20}, d.Com)
	require.Equal(t, int64(8000), d.LSN)

	writer := Counters{Questions: 60, Com: map[string]int64{"insert": 20, "commit": 20}, LSN: 4000}.per(20)
	require.Equal(t, 3.0, writer.Questions)
	require.Equal(t, 200.0, writer.RedoBytes)

	q, com, redo := d.minus(writer, 20)
	require.Equal(t, 0.0, q)
	require.Equal(t, map[string]float64{"commit": 10, "update": 20}, com, "the writers' inserts and commits are gone")
	require.Equal(t, 4000.0, redo)

	require.Equal(t, "update 2.00, commit 1.00; of these, prepared 2.00 (each also a PREPARE and a CLOSE)",
		Breakdown(map[string]float64{"commit": 1, "update": 2, "stmt_execute": 2, "stmt_prepare": 2}))
}
