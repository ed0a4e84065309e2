package relay

import (
	"context"
	"log/slog"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
)

// binlogLogs passes on the binlog client's errors at WARN, and leaves out the error of its
// KILL of the stream's connection when the connection had already ended (1094, Unknown
// thread id). Every failure of the client's that ends a stream also comes back to the relay,
// which logs it at the level it deserves (a stream broken and reopened is a warning); and
// closing a stream kills its connection, which after a broken stream, a purge handover or a
// server restart has already gone, as is normal.
type binlogLogs struct{ slog.Handler }

func (h binlogLogs) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Message == "kill connection" && killedAlready(rec) {
		return nil
	}
	if rec.Level > slog.LevelWarn {
		if !h.Handler.Enabled(ctx, slog.LevelWarn) {
			return nil
		}
		rec.Level = slog.LevelWarn
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
