package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// A binlog stream that breaks is reopened; the binlog client's kill of the broken stream's
// connection, which has ended already (1094, Unknown thread id), is no error in the logs.
func TestRelayReopensAStreamWithoutLoggingAnError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	logs := &recorder{}
	cfg := e.config("relay-quiet")
	cfg.Logger = slog.New(logs)
	var sent atomic.Int64
	r, err := relay.New(e.dsn, okSender(&sent), cfg)
	require.NoError(t, err)
	defer func() { require.NoError(t, r.Close()) }()
	require.NoError(t, r.Start(context.Background()))
	waitLeader(t, r)
	dump := func() (id int64) {
		waitFor(t, 20*time.Second, "the relay's binlog connection", func() bool {
			err := e.db.QueryRow("SELECT id FROM information_schema.processlist WHERE command = 'Binlog Dump'").Scan(&id)
			return err == nil
		})
		return id
	}
	first := dump()
	_, err = e.db.Exec(fmt.Sprintf("KILL %d", first))
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the stream reopened", func() bool {
		return len(logs.find(slog.LevelWarn, "binlog stream broken")) > 0 && dump() != first
	})
	e.insert(t, 3, byIndex("after-reopen"))
	waitFor(t, 20*time.Second, "the events SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 3 })
	require.NoError(t, r.Stop(context.Background()))
	assert.Empty(t, logs.find(slog.LevelError, ""), "no ERROR logged")
	assert.Equal(t, int64(1), r.Stats().Terms, "reopened within the term")
}
