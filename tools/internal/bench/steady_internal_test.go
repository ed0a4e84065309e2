package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPerEventBytes: redo and binary log per event keep unknown as -1, and a binary log that
// is off (0 bytes) as 0.
func TestPerEventBytes(t *testing.T) {
	r := SteadyResult{Committed: 200, Elapsed: time.Second, RedoBytes: 51_200, BinlogBytes: 0}
	require.Equal(t, 256.0, r.RedoPerEvent())
	require.Equal(t, 0.0, r.BinlogPerEvent())
	r.BinlogBytes = 30_000
	require.Equal(t, 150.0, r.BinlogPerEvent())
	r.RedoBytes, r.BinlogBytes = -1, -1
	require.Equal(t, -1.0, r.RedoPerEvent())
	require.Equal(t, -1.0, r.BinlogPerEvent())
	require.Equal(t, -1.0, SteadyResult{BinlogBytes: 10}.BinlogPerEvent(), "no events: unknown")
}

// TestBinlogSettingsString names the settings as the server's variables.
func TestBinlogSettingsString(t *testing.T) {
	require.Equal(t, "log_bin OFF", BinlogSettings{Format: "MIXED", RowImage: "FULL", SyncBinlog: 0}.String())
	require.Equal(t, "log_bin ON, binlog_format=ROW, binlog_row_image=MINIMAL, sync_binlog=1",
		BinlogSettings{On: true, Format: "ROW", RowImage: "MINIMAL", SyncBinlog: 1}.String())
}
