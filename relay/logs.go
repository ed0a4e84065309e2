package relay

import (
	"context"
	"log/slog"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// binlogLogs leaves out of the binlog client's logs the error of its KILL of the stream's
// connection when the connection had already ended (1094, Unknown thread id): closing a
// stream kills its connection, and after a broken stream, a purge handover or a server
// restart that connection is already gone, which is normal.
type binlogLogs struct{ slog.Handler }

func (h binlogLogs) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Message == "kill connection" && killedAlready(rec) {
		return nil
	}
	return h.Handler.Handle(ctx, rec)
}

func (h binlogLogs) WithAttrs(as []slog.Attr) slog.Handler {
	return binlogLogs{h.Handler.WithAttrs(as)}
}

func (h binlogLogs) WithGroup(n string) slog.Handler { return binlogLogs{h.Handler.WithGroup(n)} }

// killedAlready reports whether rec's error says the thread to kill did not exist.
func killedAlready(rec slog.Record) bool {
	found := false
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key != "error" {
			return true
		}
		if err, ok := a.Value.Any().(error); ok && gomysql.ErrorCode(err.Error()) == gomysql.ER_NO_SUCH_THREAD {
			found = true
		}
		return false
	})
	return found
}
