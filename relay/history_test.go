package relay_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
	"github.com/go-outbox/outbox/relay"
)

// The relay records each failed send in the row's failure history, in the statement that
// records the retry or the dead letter, and its OnDeadLetter gets the history with the
// final failure last; the other events of the table are sent and keep no history.
func TestRelayRecordsTheFailureHistory(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	var (
		mu   sync.Mutex
		dead []outbox.Event
		sent atomic.Int64
	)
	cfg := e.config("relay-1")
	cfg.MaxAttempts = 3
	cfg.Backoff = func(int) time.Duration { return 10 * time.Millisecond }
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, _ error) {
		mu.Lock()
		defer mu.Unlock()
		dead = append(dead, ev)
	}
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		if ev.BizNo == "bad" {
			return errors.New("broker said no\nsecond line")
		}
		sent.Add(1)
		return nil
	})
	r, _ := start(t, e.dsn, sender, cfg)
	waitLeader(t, r)
	ctx := context.Background()
	_, err := insertOne(ctx, e, "bad")
	require.NoError(t, err)
	_, err = insertOne(ctx, e, "good")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the dead letter's callback", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(dead) == 1
	})
	waitFor(t, 10*time.Second, "the good event sent", func() bool { return sent.Load() == 1 })

	mu.Lock()
	ev := dead[0]
	mu.Unlock()
	require.Len(t, ev.Failures, 3, "three attempts, three failures")
	for i, f := range ev.Failures {
		assert.Equal(t, "relay-1", f.Instance)
		assert.Equal(t, "retryable", f.Class)
		assert.Equal(t, "broker said no\nsecond line", f.Message)
		assert.False(t, f.At.IsZero())
		if i > 0 {
			assert.False(t, f.At.Before(ev.Failures[i-1].At), "oldest first")
		}
	}
	got, err := outbox.NewAdmin(e.store).Get(ctx, ev.ID)
	require.NoError(t, err)
	assert.Equal(t, ev.Failures, got.Failures, "the callback's history is the row's")

	var nulls int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE status = 'SUCCESS' AND failures IS NULL").Scan(&nulls))
	assert.Equal(t, 1, nulls, "the sent event has no history")
}

// A table made before the failure history is refused with the ALTER that adds the column;
// after it (instant), the relay runs on the table.
func TestRelayRefusesATableWithoutTheFailuresColumnNamingTheAlter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	_, err := e.db.Exec("ALTER TABLE " + mysqldialect.Quote(e.table) + " DROP COLUMN failures")
	require.NoError(t, err)
	var sent atomic.Int64
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { sent.Add(1); return nil })

	r, err := relay.New(e.dsn, sender, e.config("relay-1"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a relay that accepts the table runs
	err = r.Run(ctx)
	cancel()
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	alter := "ALTER TABLE `" + e.table + "` ADD COLUMN failures TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"
	assert.Contains(t, err.Error(), "has no column failures")
	assert.Contains(t, err.Error(), alter)
	require.NoError(t, r.Close())

	_, err = e.db.Exec(alter + ", ALGORITHM=INSTANT")
	require.NoError(t, err, "the ALTER is instant")
	r, _ = start(t, e.dsn, sender, e.config("relay-2"))
	waitLeader(t, r)
	_, err = insertOne(context.Background(), e, "after")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the event sent", func() bool { return sent.Load() == 1 })
}

// The relay caps its retries' backoff by MaxBackoff, by the rule the publisher follows
// (outbox.RetryPolicy): a backoff of a thousand hours waits MaxBackoff, so the event's
// second and last attempt comes, and dead-letters it, within seconds.
func TestRelayCapsTheBackoff(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	cfg := e.config("relay-cap")
	cfg.MaxAttempts = 2
	cfg.Backoff = func(int) time.Duration { return 1000 * time.Hour }
	cfg.MaxBackoff = time.Second
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		return errors.New("broker said no")
	})
	r, _ := start(t, e.dsn, sender, cfg)
	waitLeader(t, r)
	ctx := context.Background()
	id, err := insertOne(ctx, e, "bad")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "the first failure recorded", func() bool { return e.statuses(t)["WAIT"] == 1 && retries(t, e, id) == 1 })
	var dueIn float64
	require.NoError(t, e.db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), next_retry_time) / 1e6 FROM "+e.table+" WHERE event_id = ?", id).Scan(&dueIn))
	assert.LessOrEqual(t, dueIn, 1.0, "the retry is due within MaxBackoff, by the database clock")
	waitFor(t, 30*time.Second, "the dead letter after the capped backoff", func() bool { return e.statuses(t)["FAIL"] == 1 })
}

// retries is the retry count of the event whose event id is eventID.
func retries(t *testing.T, e *env, eventID string) int {
	t.Helper()
	var n int
	require.NoError(t, e.db.QueryRow("SELECT retry_count FROM "+e.table+" WHERE event_id = ?", eventID).Scan(&n))
	return n
}
