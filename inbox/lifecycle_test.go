package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// newConsumer is a consumer of the rig's topic in the inbox's group, not started; Close when
// t ends.
func (r *consRig) newConsumer(t *testing.T, h inbox.Handler, cfg inbox.ConsumerConfig) *inbox.Consumer {
	t.Helper()
	cfg.NameServers = []string{testsvc.RocketMQNameServer(t)}
	cfg.Topic = r.topic
	c, err := inbox.NewConsumer(r.in, h, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Start reports its refusals synchronously, with the library's sentinels: while running
// ErrAlreadyRunning, after Close ErrClosed. Stop is safe twice and when not running; after
// Stop the consumer starts again (a new push consumer under the hood) and consumes; Run
// returns nil once stopped.
func TestConsumerStartStopStartAgain(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	c := r.newConsumer(t, r.effectHandler("c", nil), inbox.ConsumerConfig{})
	ctx := context.Background()
	require.NoError(t, c.Stop(ctx), "Stop before any start")

	require.NoError(t, c.Start(ctx))
	err := c.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrAlreadyRunning, "a second Start while running")
	require.ErrorIs(t, c.Run(ctx), outbox.ErrAlreadyRunning, "Run while running")
	first := r.insert(t, "ORD-1", 3)
	r.waitEffects(t, len(first), 30*time.Second)

	var stops sync.WaitGroup
	for range 2 { // concurrently
		stops.Go(func() { assert.NoError(t, c.Stop(ctx)) })
	}
	stops.Wait()
	require.NoError(t, c.Stop(ctx), "Stop once stopped")

	// Started again: consumes what was committed while stopped, and what comes after.
	during := r.insert(t, "ORD-2", 3)
	runDone := make(chan error, 1)
	go func() { runDone <- c.Run(ctx) }()
	after := r.insert(t, "ORD-3", 3)
	r.waitEffects(t, len(first)+len(during)+len(after), 30*time.Second)
	r.checkLedger(t)
	require.NoError(t, c.Stop(ctx))
	select {
	case err := <-runDone:
		require.NoError(t, err, "Run returns nil once stopped")
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after Stop")
	}

	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close twice")
	require.ErrorIs(t, c.Start(ctx), outbox.ErrClosed)
	require.ErrorIs(t, c.Run(ctx), outbox.ErrClosed)
	require.NoError(t, c.Stop(ctx), "Stop after Close")
}

// A handler that never returns does not hold Stop: when Stop's context ends, Stop returns an
// error wrapping the context's, saying how many deliveries were in progress; the handler's
// context is cancelled (its transaction rolls back, nothing of it commits), the push consumer
// is shut down without it, and its message is delivered again once the consumer starts
// again, to be handled once. The end of Start's context and Close are bounded the same way,
// by StopTimeout.
func TestConsumerStopGivesUpAHandlerThatNeverReturns(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	var calls callCount
	stuck, release := make(chan string, 10), make(chan struct{})
	var cancelled atomic.Int32
	h := r.effectHandler("c", func(ctx context.Context, _ *sql.Tx, msg *inbox.Message) error {
		if strings.HasPrefix(msg.BizNo, "STUCK") && calls.add(msg.EventID) == 1 {
			context.AfterFunc(ctx, func() { cancelled.Add(1) })
			stuck <- msg.EventID
			<-release // ignores ctx: never returns while the test runs
		}
		return nil
	})
	t.Cleanup(func() { close(release) })
	c := r.newConsumer(t, h, inbox.ConsumerConfig{StopTimeout: 2 * time.Second})
	// start starts c with ctx, has an event stuck in its handler, and returns its id.
	start := func(ctx context.Context, name string) string {
		t.Helper()
		started := time.Now()
		require.NoError(t, c.Start(ctx))
		time.Sleep(time.Until(started.Add(4 * time.Second))) // past the shutdown's grace after a start
		id := r.insertOne(t, name, `{"stuck":true}`)
		select {
		case got := <-stuck:
			require.Equal(t, id, got)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the stuck handler never ran", name)
		}
		return id
	}
	stopped := func(what string) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- c.Stop(context.Background()) }()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the shutdown waited for the handler that never returns", what)
		}
	}

	ok := r.insert(t, "ORD-OK", 3)
	first := start(context.Background(), "STUCK-1")
	r.waitEffects(t, len(ok), 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := c.Stop(ctx)
	t.Logf("Stop: %v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "1 deliveries in progress")
	assert.Contains(t, err.Error(), "delivered again")
	require.Eventually(t, func() bool { return cancelled.Load() == 1 }, 10*time.Second, 10*time.Millisecond,
		"the handler's context is cancelled")
	stopped("Stop") // the shutdown goes on without the handler: a Stop without a deadline returns

	// Started again (a new push consumer), with a context that ends while a handler is stuck:
	// the shutdown gives up on it after StopTimeout. The first stuck message came again.
	runCtx, endRun := context.WithCancel(context.Background())
	second := start(runCtx, "STUCK-2")
	r.waitEffects(t, len(ok)+1, 30*time.Second)
	endRun()
	stopped("the end of Start's context")
	require.Eventually(t, func() bool { return cancelled.Load() == 2 }, 10*time.Second, 10*time.Millisecond,
		"the second stuck handler's context is cancelled")

	// And Close, bounded by StopTimeout.
	third := start(context.Background(), "STUCK-3")
	r.waitEffects(t, len(ok)+2, 30*time.Second)
	err = c.Close()
	t.Logf("Close: %v", err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "1 deliveries in progress")
	stopped("Close")

	byID := r.checkLedger(t, third)
	for _, id := range []string{first, second} {
		require.Len(t, byID[id], 1, "given up, delivered again, handled once")
		assert.Equal(t, 2, calls.get(id), "delivered a second time")
	}
}

// Close and Stop called from inside a handler return: they do not wait for the handler
// they are called from. The handler's effect commits and is acknowledged.
func TestConsumerStopAndCloseFromAHandler(t *testing.T) {
	t.Parallel()
	r := newConsRig(t, consRigOptions{})
	r.publish(t)
	var c *inbox.Consumer
	returned := make(chan string, 2)
	h := r.effectHandler("c", func(ctx context.Context, _ *sql.Tx, msg *inbox.Message) error {
		var err error
		switch msg.BizNo {
		case "STOP":
			err = c.Stop(ctx)
		case "CLOSE":
			err = c.Close()
		default:
			return nil
		}
		if err != nil {
			return outbox.Permanent(err)
		}
		returned <- msg.BizNo
		return nil
	})
	c = r.newConsumer(t, h, inbox.ConsumerConfig{})
	require.NoError(t, c.Start(context.Background()))
	stop := r.insertOne(t, "STOP", `{}`)
	wait := func(what string) {
		t.Helper()
		select {
		case got := <-returned:
			require.Equal(t, what, got)
		case <-time.After(60 * time.Second):
			t.Fatalf("%s from inside a handler did not return", what)
		}
	}
	wait("STOP")
	require.NoError(t, c.Stop(context.Background()), "the shutdown the handler began ends once it has returned")
	require.NoError(t, c.Start(context.Background()))
	closing := r.insertOne(t, "CLOSE", `{}`)
	wait("CLOSE")
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Start(context.Background()), outbox.ErrClosed)
	byID := r.checkLedger(t)
	require.Len(t, byID[stop], 1)
	require.Len(t, byID[closing], 1)
	rej, err := r.in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	assert.Empty(t, rej, "Stop and Close from the handler returned nil")
}

// Start checks the inbox's tables before it connects to anything: a missing table is a
// refusal wrapping ErrInvalidConfig that names the fix.
func TestConsumerStartRefusesAMissingTable(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	in, err := inbox.New(db, inbox.Config{Group: testsvc.UniqueTable("cg_inbox"), Table: testsvc.UniqueTable("t_inbox"),
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	c, err := inbox.NewConsumer(in, func(context.Context, *sql.Tx, *inbox.Message) error { return nil },
		inbox.ConsumerConfig{NameServers: []string{"127.0.0.1:1"}, Topic: "T"}) // never dialled
	require.NoError(t, err)
	err = c.Start(context.Background())
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "CreateSchema")
	require.ErrorIs(t, c.Run(context.Background()), outbox.ErrInvalidConfig)
	require.NoError(t, c.Close())
	_, err = inbox.NewConsumer(in, func(context.Context, *sql.Tx, *inbox.Message) error { return nil },
		inbox.ConsumerConfig{NameServers: []string{"127.0.0.1:1"}, Topic: "T", StopTimeout: -time.Second})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "StopTimeout")
	assert.False(t, errors.Is(err, outbox.ErrClosed))
}
