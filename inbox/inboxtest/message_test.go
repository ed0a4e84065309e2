package inboxtest_test

import (
	"context"
	"database/sql"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/inbox/inboxtest"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// brokerProperties are what the broker and the consumer's client add to a message on its
// way, none of them the event's: where it was stored and when its consumption began.
var brokerProperties = map[string]bool{
	"MIN_OFFSET": true, "MAX_OFFSET": true, "CONSUME_START_TIME": true, "CLUSTER": true,
	"WAIT": true, "REAL_TOPIC": true, "REAL_QID": true, "RETRY_TOPIC": true, "ORIGIN_MESSAGE_ID": true,
	"RECONSUME_TIME": true, "MAX_RECONSUME_TIMES": true, "TRACE_ON": true, "MSG_REGION": true,
}

// Message builds what the real consumer hands the handler: an event written by
// InsertEvent (with a trace context), read back, sent by the RocketMQSender (plain, in key
// order, as CloudEvents) and received by an inbox Consumer has the fields and properties
// Message gives it, but for the broker's own and the message id.
func TestMessageIsWhatTheConsumerDelivers(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	ns := testsvc.RocketMQNameServer(t)

	cases := []struct {
		name     string
		cfg      outbox.RocketMQConfig
		keyOrder bool
		opts     []inboxtest.Option
	}{
		{name: "plain"},
		{name: "key order", keyOrder: true, opts: []inboxtest.Option{inboxtest.KeyOrder()}},
		{name: "cloudevents", cfg: outbox.RocketMQConfig{CloudEventsSource: "/orders", CloudEventsContentType: "text/plain"},
			opts: []inboxtest.Option{inboxtest.CloudEvents("/orders", "text/plain")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			topic := testsvc.NewTopic(t, "OUTBOX_INBOXTEST")
			c.cfg.NameServers = []string{ns}
			store := testsvc.NewStore(t, db, outbox.MySQLConfig{Routes: outbox.Routes{Topic: topic}})
			admin := outbox.NewAdmin(store)
			sender, err := outbox.NewRocketMQSender(c.cfg)
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, sender.Close()) })

			ctx := trace.ContextWithSpanContext(t.Context(), trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
				TraceState: must(trace.ParseTraceState("vendor=abc")),
			}))
			tx, err := store.BeginTx(ctx, nil)
			require.NoError(t, err)
			eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "订单-1", EventType: "ORDER_CREATED", Payload: []byte(`{"order":"订单-1"}`)})
			require.NoError(t, err)
			require.NoError(t, tx.Commit())
			ev, err := admin.GetByEventID(t.Context(), eventID)
			require.NoError(t, err)
			require.NotEmpty(t, ev.TraceParent)
			require.Equal(t, []error{nil}, sender.Send(t.Context(), []outbox.Event{ev}, c.keyOrder))

			in := newInbox(t, db, inbox.Config{})
			got := make(chan *inbox.Message, 10)
			cons, err := inbox.NewConsumer(in, func(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
				got <- msg
				return nil
			}, inbox.ConsumerConfig{NameServers: []string{ns}, Topic: topic})
			require.NoError(t, err)
			require.NoError(t, cons.Start(t.Context()))
			t.Cleanup(func() { assert.NoError(t, cons.Close()) })
			var real *inbox.Message
			select {
			case real = <-got:
			case <-time.After(2 * time.Minute):
				t.Fatal("the consumer received nothing")
			}

			want := inboxtest.Message(ev, c.opts...)
			assert.Equal(t, real.EventID, want.EventID)
			assert.Equal(t, real.EventType, want.EventType)
			assert.Equal(t, real.BizNo, want.BizNo)
			assert.Equal(t, real.Body, want.Body)
			assert.Equal(t, real.Topic, want.Topic)
			assert.Equal(t, real.Deliveries, want.Deliveries)
			assert.Equal(t, real.MsgID, real.Properties[inboxtest.PropertyUniqueKey], "the delivered message id is its UNIQ_KEY")
			assert.Equal(t, want.MsgID, want.Properties[inboxtest.PropertyUniqueKey])
			assert.Len(t, want.MsgID, len(real.MsgID))
			assert.NotEqual(t, real.MsgID, want.MsgID, "a message of its own")
			ours := map[string]string{}
			for k, v := range real.Properties {
				if !brokerProperties[k] && k != inboxtest.PropertyUniqueKey {
					ours[k] = v
				}
			}
			delete(want.Properties, inboxtest.PropertyUniqueKey)
			assert.Equal(t, ours, want.Properties, "the delivered properties (all of them: %v)", slices.Sorted(maps.Keys(real.Properties)))
			assert.Equal(t, "vendor=abc", want.Properties[outbox.PropertyTraceState])
		})
	}
}

// A stored trace context that is not well formed is left out, as the sender leaves it out.
func TestMessageDropsAMalformedTraceContext(t *testing.T) {
	t.Parallel()
	ev := outbox.Event{EventID: "0190e0a0-0000-7000-8000-000000000001", BizNo: "A", EventType: "T", Payload: []byte("x"),
		TraceParent: "00-not-a-trace", TraceState: "vendor=abc"}
	msg := inboxtest.Message(ev)
	assert.NotContains(t, msg.Properties, outbox.PropertyTraceParent)
	assert.NotContains(t, msg.Properties, outbox.PropertyTraceState)

	ev.TraceParent = "00-0102030000000000000000000000000a-0405060000000000-01"
	ev.TraceState = "=bad"
	msg = inboxtest.Message(ev)
	assert.Equal(t, ev.TraceParent, msg.Properties[outbox.PropertyTraceParent])
	assert.NotContains(t, msg.Properties, outbox.PropertyTraceState, "a malformed tracestate is left out")
	assert.Equal(t, inboxtest.DefaultTopic, msg.Topic)
	ev.Topic = "PAYMENTS"
	assert.Equal(t, "PAYMENTS", inboxtest.Message(ev).Topic, "the event's own topic")

	again := inboxtest.Redelivery(msg)
	assert.Equal(t, 2, again.Deliveries)
	assert.Equal(t, msg.MsgID, again.MsgID)
	assert.Equal(t, 1, msg.Deliveries, "msg is not changed")
	again.Properties["x"] = "y"
	assert.NotContains(t, msg.Properties, "x")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// newInbox makes an inbox of a group and tables of its own on db, dropped when t ends.
func newInbox(t *testing.T, db *sql.DB, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	cfg.Group = testsvc.UniqueTable("g_inboxtest")
	cfg.Table = testsvc.UniqueTable("t_inbox")
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	in, err := inbox.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(t.Context()))
	t.Cleanup(func() {
		for _, table := range []string{cfg.Table, cfg.Table + "_rejected"} {
			_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
			assert.NoError(t, err)
		}
	})
	return in
}
