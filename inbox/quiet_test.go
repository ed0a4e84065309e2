package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// loudRecords is a slog handler that keeps the records at warn and above, with their
// attributes.
type loudRecords struct {
	mu   sync.Mutex
	msgs []string
}

func (w *loudRecords) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *loudRecords) Handle(_ context.Context, r slog.Record) error {
	s := r.Message
	r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, s)
	return nil
}
func (w *loudRecords) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *loudRecords) WithGroup(string) slog.Handler      { return w }
func (w *loudRecords) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msgs...)
}

// A clean Close of the inbox consumer is quiet: consumers of a topic a publisher fills at
// a steady rate, closed one after the other (after they have handled deliveries, and while
// they are still starting), log nothing at warn or above, neither the inbox nor the
// RocketMQ client. Not parallel: the RocketMQ client's log route is process-wide.
func TestConsumerCloseIsQuiet(t *testing.T) {
	r := newConsRig(t, consRigOptions{retries: true}) // a new group's missing retry topic is a start-up warning of its own
	r.publish(t)
	logs := &loudRecords{}
	in, err := inbox.New(r.inDB, inbox.Config{Group: r.group, Table: r.inTable, Logger: slog.New(logs)})
	require.NoError(t, err)
	stop := make(chan struct{})
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			tx, err := r.store.BeginTx(context.Background(), nil)
			if err != nil {
				return
			}
			_, err = tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: fmt.Sprintf("Q-%d", i), EventType: "QUIET", Payload: []byte("{}")})
			if err != nil || tx.Commit() != nil {
				_ = tx.Rollback()
				return
			}
		}
	}()
	defer func() { close(stop); <-loaded }()
	// Routed after the publisher's start: its producer's start-up is no part of this test.
	outbox.RouteRocketMQClientLogs(slog.New(logs))
	defer outbox.RouteRocketMQClientLogs(slog.New(slog.DiscardHandler))
	const closes = 5
	for i := range closes {
		c, err := inbox.NewConsumer(in, r.effectHandler(fmt.Sprintf("c%d", i), nil),
			inbox.ConsumerConfig{NameServers: []string{testsvc.RocketMQNameServer(t)}, Topic: r.topic})
		require.NoError(t, err)
		require.NoError(t, c.Start(context.Background()))
		if i%3 != 2 {
			n := r.countEffects()
			require.Eventually(t, func() bool { return r.countEffects() > n }, time.Minute, 50*time.Millisecond,
				"consumer %d handles deliveries", i)
		}
		require.NoError(t, c.Close())
		if loud := logs.get(); len(loud) > 0 {
			t.Fatalf("close %d (of %d) logged at warn or above: %q", i, closes, loud)
		}
	}
	// The client shuts a consumer down with a long-polling pull in flight, which ends by its
	// own timeout 30 s later with a warning: that end of a clean close is quiet too.
	time.Sleep(32 * time.Second)
	if loud := logs.get(); len(loud) > 0 {
		t.Fatalf("after the closes, the client logged at warn or above: %q", loud)
	}
}
