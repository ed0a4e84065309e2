package relay

import (
	"log/slog"
	"strings"
	"testing"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/stretchr/testify/assert"
)

// The binlog client kills its stream's connection when it closes; after a broken stream or
// a purge handover the connection has ended already, and the server answers 1094: that is
// no error worth logging. Other failures of the KILL, and the client's other errors, are
// logged as warnings.
func TestBinlogLogsLeaveOutAKillOfAnEndedConnection(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	l := quietLogger(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Error("kill connection", slog.Any("error", gomysql.NewError(gomysql.ER_NO_SUCH_THREAD, "Unknown thread id: 42")), slog.Int64("id", 42))
	assert.Empty(t, out.String())
	l.With(slog.String("a", "b")).Error("kill connection", slog.Any("error", gomysql.NewError(gomysql.ER_NO_SUCH_THREAD, "Unknown thread id: 43")))
	assert.Empty(t, out.String())

	// The client's other errors come back to the relay, which logs them: the client's own
	// logs of them are warnings.
	l.Error("kill connection", slog.Any("error", gomysql.NewError(gomysql.ER_SPECIFIC_ACCESS_DENIED_ERROR, "denied")))
	assert.Contains(t, out.String(), "level=WARN msg=\"kill connection\" error=\"ERROR 1227")
	l.Error("io.ReadFull(header) failed. err EOF: connection was bad")
	assert.Contains(t, out.String(), "level=WARN msg=\"io.ReadFull")
	assert.NotContains(t, out.String(), "level=ERROR")
	l.Info("syncer is closing...")
	assert.NotContains(t, out.String(), "closing", "info stays out")
}
