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
	"github.com/go-outbox/outbox/internal/testsvc"
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

// A clean Close of the relay is quiet: a relay that leads and sends to the real broker
// under a steady insert load, closed many times (after it has led a while, and while it is
// still starting), logs nothing at warn or above, neither itself, nor its binlog client, nor
// the RocketMQ client. Not parallel: the RocketMQ client's log route is process-wide.
func TestRelayCloseIsQuiet(t *testing.T) {
	// Synced logs, as production runs them: the relay warns of anything else at Start.
	e := newEnv(t, newServer(t, "--innodb-flush-log-at-trx-commit=1"), outbox.Unordered)
	topic := testsvc.NewTopic(t, "RELAY_QUIET")
	e.routeTo(t, topic)
	// The topic's route reaches the client first: a send before it is a warning of its own.
	warm, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName: testsvc.UniqueTable("relay")})
	require.NoError(t, err)
	waitFor(t, time.Minute, "the topic's route", func() bool {
		return warm.Send(context.Background(), []outbox.Event{{ID: 1, EventID: "warm", Topic: topic, BizNo: "warm", EventType: "WARM", Payload: []byte("{}")}}, false)[0] == nil
	})
	require.NoError(t, warm.Close())
	logs := &recorder{}
	outbox.RouteRocketMQClientLogs(slog.New(logs))
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName: testsvc.UniqueTable("relay")})
	require.NoError(t, err)
	defer outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler))
	stop := make(chan struct{})
	var inserted atomic.Int64
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tx, err := e.store.BeginTx(context.Background(), nil)
			if err != nil {
				return // the test has ended
			}
			_, err = tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: fmt.Sprintf("quiet-%d", i), EventType: "QUIET", Payload: []byte("{}")})
			if err != nil || tx.Commit() != nil {
				_ = tx.Rollback()
				return
			}
			inserted.Add(1)
		}
	}()
	defer func() { close(stop); <-loaded }()
	const closes = 8
	for i := range closes {
		cfg := e.config(fmt.Sprintf("relay-quiet-%d", i))
		cfg.Logger = slog.New(logs)
		r, err := relay.New(e.dsn, sender, cfg)
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		if i%4 == 3 {
			time.Sleep(time.Duration(i) * time.Millisecond) // Close while it starts
		} else {
			waitLeader(t, r)
			time.Sleep(300 * time.Millisecond)
		}
		require.NoError(t, r.Close())
		if err := <-done; err != nil {
			require.ErrorIs(t, err, outbox.ErrClosed)
		}
		loud := logs.loud()
		if len(loud) > 0 {
			t.Fatalf("close %d (of %d) logged at warn or above: %q", i, closes, loud)
		}
	}
	require.NoError(t, sender.Close())
	assert.Empty(t, logs.loud(), "the sender's close logged nothing at warn or above")
	t.Logf("%d events inserted; statuses %v", inserted.Load(), e.statuses(t))
}

// loud returns the records at warn or above, each with its attributes.
func (h *recorder) loud() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Level >= slog.LevelWarn {
			s := r.Message
			r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
			out = append(out, s)
		}
	}
	return out
}
