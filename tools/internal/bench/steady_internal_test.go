package bench

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPerEventBytes: redo and binary log per event keep unknown as NaN, a binary log that is
// off (0 bytes) as 0, and a little below zero (noise) as it is.
func TestPerEventBytes(t *testing.T) {
	r := SteadyResult{Committed: 200, Elapsed: time.Second, RedoBytes: 51_200, BinlogBytes: 0}
	require.Equal(t, 256.0, r.RedoPerEvent())
	require.Equal(t, 0.0, r.BinlogPerEvent())
	r.BinlogBytes = 30_000
	require.Equal(t, 150.0, r.BinlogPerEvent())
	r.RedoBytes = -400
	require.Equal(t, -2.0, r.RedoPerEvent())
	r.RedoBytes, r.BinlogBytes = math.NaN(), math.NaN()
	require.True(t, math.IsNaN(r.RedoPerEvent()))
	require.True(t, math.IsNaN(r.BinlogPerEvent()))
	require.True(t, math.IsNaN(SteadyResult{BinlogBytes: 10}.BinlogPerEvent()), "no events: unknown")
}

// TestBinlogSettingsString names the settings as the server's variables.
func TestBinlogSettingsString(t *testing.T) {
	require.Equal(t, "log_bin OFF", BinlogSettings{Format: "MIXED", RowImage: "FULL", SyncBinlog: 0}.String())
	require.Equal(t, "log_bin ON, binlog_format=ROW, binlog_row_image=MINIMAL, sync_binlog=1",
		BinlogSettings{On: true, Format: "ROW", RowImage: "MINIMAL", SyncBinlog: 1}.String())
}
