package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// newTracing is an SDK tracer provider that records every span in memory, shut down when
// t ends. Nothing is registered globally.
func newTracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { assert.NoError(t, tp.Shutdown(context.Background())) })
	return tp, rec
}

// withTraceState returns ctx with a remote parent whose tracestate is state, as an incoming
// request carries it: spans started under it inherit the tracestate.
func withTraceState(t *testing.T, ctx context.Context, state string) context.Context {
	t.Helper()
	ts, err := trace.ParseTraceState(state)
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled, TraceState: ts, Remote: true,
	})
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// traceparentOf is the W3C traceparent of sc, as the propagator writes it.
func traceparentOf(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// insertIn commits one event written with ctx and returns its id.
func (b *bundle) insertIn(t *testing.T, ctx context.Context, bizNo string) int64 {
	t.Helper()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(`{"order":"` + bizNo + `"}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return id
}

// A span in InsertEvent's context is stored as its W3C traceparent and tracestate; without
// one, both columns stay ”. A tracestate too long for its column loses its last entries.
func TestInsertEventStoresTheTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, _ := newTracing(t)
	ctx, span := tp.Tracer("order-api").Start(withTraceState(t, context.Background(), "vendor=abc,other=x1"), "create order")
	traced := b.insertIn(t, ctx, "ORD-TRACED")
	span.End()
	plain := b.insertIn(t, context.Background(), "ORD-PLAIN")

	ev := b.get(t, traced)
	assert.Equal(t, traceparentOf(span.SpanContext()), ev.TraceParent)
	assert.Len(t, ev.TraceParent, 55)
	assert.Equal(t, "vendor=abc,other=x1", ev.TraceState)

	ev = b.get(t, plain)
	assert.Empty(t, ev.TraceParent)
	assert.Empty(t, ev.TraceState)
	var parent, state string
	require.NoError(t, b.db.QueryRow("SELECT trace_parent, trace_state FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ?", plain).Scan(&parent, &state))
	assert.Equal(t, "", parent)
	assert.Equal(t, "", state)

	// 20 entries of 20 characters: 419 characters, over the column's 256.
	entries := make([]string, 20)
	for i := range entries {
		entries[i] = fmt.Sprintf("k%02d=%s", i, strings.Repeat("v", 16))
	}
	ctx, long := tp.Tracer("order-api").Start(withTraceState(t, context.Background(), strings.Join(entries, ",")), "create order")
	ev = b.get(t, b.insertIn(t, ctx, "ORD-LONG-STATE"))
	long.End()
	assert.Equal(t, traceparentOf(long.SpanContext()), ev.TraceParent)
	assert.Equal(t, strings.Join(entries[:12], ","), ev.TraceState, "whole entries, the first ones, within 256 characters")
	_, err := trace.ParseTraceState(ev.TraceState)
	assert.NoError(t, err)
}

// Events sent through the real broker carry their stored trace context as the traceparent
// and tracestate properties, which a real consumer reads and continues; an event stored
// without one carries neither, and nor does one whose stored values are malformed. The
// batch send is one producer span linked to every traced event's insert span.
func TestTraceContextTravelsThroughTheBroker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	topic := testsvc.NewTopic(t, "OUTBOX_TRACE")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	tp, rec := newTracing(t)

	api := tp.Tracer("order-api")
	var insertSpans []trace.SpanContext
	traced := map[int64]bool{}
	for i := range 3 {
		ctx, span := api.Start(withTraceState(t, context.Background(), fmt.Sprintf("vendor=v%d", i)), "create order")
		traced[b.insertIn(t, ctx, fmt.Sprintf("ORD-T%d", i))] = true
		span.End()
		insertSpans = append(insertSpans, span.SpanContext())
	}
	plain := b.insertIn(t, context.Background(), "ORD-PLAIN")
	badParent := b.insertIn(t, context.Background(), "ORD-BAD-PARENT")
	b.exec(t, "UPDATE {t} SET trace_parent = ?, trace_state = 'vendor=x' WHERE id = ?",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", badParent) // an all-zero trace id
	badState := b.insertIn(t, context.Background(), "ORD-BAD-STATE")
	const goodParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.exec(t, "UPDATE {t} SET trace_parent = ?, trace_state = 'not a tracestate' WHERE id = ?", goodParent, badState)

	cfg := fastConfig("order-trace", &logSink{})
	cfg.Tuning.ClaimPerRow = false // one batch, one span; TestSendSpanPerEvent covers per-row
	cfg.TracerProvider = tp
	p := newPublisher(t, b.store, newFastRocketMQSender(t), cfg)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	require.Equal(t, 6, stats.Sent)
	consumer.WaitDistinct(t, 6, 60*time.Second)

	rowOf := map[string]int64{}
	for id, eventID := range b.eventIDs(t) {
		rowOf[eventID] = id
	}
	consumerTracer := tp.Tracer("points-service")
	for _, m := range consumer.Messages() {
		id := rowOf[m.GetProperty(outbox.PropertyEventID)]
		ev := b.get(t, id)
		parent, state := m.GetProperty(outbox.PropertyTraceParent), m.GetProperty(outbox.PropertyTraceState)
		switch id {
		case plain, badParent:
			assert.Empty(t, parent, "event %d", id)
			assert.Empty(t, state, "event %d", id)
			continue
		case badState:
			assert.Equal(t, goodParent, parent)
			assert.Empty(t, state, "a malformed tracestate is dropped, the traceparent kept")
			continue
		}
		require.True(t, traced[id], "event %d", id)
		assert.Equal(t, ev.TraceParent, parent, "event %d", id)
		assert.Equal(t, ev.TraceState, state, "event %d", id)
		assert.NotEmpty(t, state)

		// The consumer continues the trace of the transaction that wrote the event.
		ctx := propagation.TraceContext{}.Extract(context.Background(), messageCarrier{m})
		_, span := consumerTracer.Start(ctx, "process "+topic, trace.WithSpanKind(trace.SpanKindConsumer))
		span.End()
		assert.Equal(t, ev.TraceParent[3:35], span.SpanContext().TraceID().String(), "same trace as the insert")
	}

	var sends []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			sends = append(sends, s)
		}
	}
	require.Len(t, sends, 1, "one batch, one span")
	send := sends[0]
	assert.Equal(t, "send "+topic, send.Name())
	assert.Equal(t, codes.Unset, send.Status().Code)
	var linked []trace.SpanContext
	for _, l := range send.Links() {
		linked = append(linked, l.SpanContext.WithRemote(false))
	}
	// The links are the insert spans, and the one well-formed stored context of badState.
	for _, sc := range insertSpans {
		assert.Contains(t, linked, sc.WithRemote(false))
	}
	assert.Len(t, linked, len(insertSpans)+1)
	attrs := map[string]string{}
	for _, kv := range send.Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	assert.Equal(t, "rocketmq", attrs["messaging.system"])
	assert.Equal(t, topic, attrs["messaging.destination.name"])
	assert.Equal(t, "6", attrs["messaging.batch.message_count"])
}

// messageCarrier reads a message's properties for a propagator.
type messageCarrier struct{ m *primitive.MessageExt }

func (c messageCarrier) Get(key string) string { return c.m.GetProperty(key) }
func (c messageCarrier) Set(string, string)    {}
func (c messageCarrier) Keys() []string        { return nil }

// In per-row mode each send is a span of its own, linked to its event's insert span, with an
// error status when the send failed; a sender without a topic names the span "outbox send".
// Without a TracerProvider, no span is made.
func TestSendSpanPerEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tp, rec := newTracing(t)
	ctx, insert := tp.Tracer("order-api").Start(context.Background(), "create order")
	ok := b.insertIn(t, ctx, "ORD-OK")
	insert.End()
	failing := b.insertIn(t, context.Background(), "ORD-FAIL")

	sender := &failingFor{id: failing}
	cfg := fastConfig("order-span", &logSink{})
	cfg.Tuning.ClaimPerRow = true
	cfg.TracerProvider = tp
	p := newPublisher(t, b.store, sender, cfg)
	stats, err := p.PublishPending(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, stats.Sent)
	require.Equal(t, 1, stats.Retried)

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.SpanKind() == trace.SpanKindProducer {
			for _, kv := range s.Attributes() {
				if kv.Key == "outbox.event.id" {
					spans[kv.Value.AsString()] = s
				}
			}
		}
	}
	require.Len(t, spans, 2)
	sent := spans[b.get(t, ok).EventID]
	require.NotNil(t, sent)
	assert.Equal(t, "send ORDER_EVENT_TOPIC", sent.Name(), "named for the store's default topic")
	require.Len(t, sent.Links(), 1)
	assert.Equal(t, insert.SpanContext().WithRemote(true), sent.Links()[0].SpanContext)
	assert.Equal(t, codes.Unset, sent.Status().Code)

	failed := spans[b.get(t, failing).EventID]
	require.NotNil(t, failed)
	assert.Empty(t, failed.Links(), "stored without a trace context: nothing to link to")
	assert.Equal(t, codes.Error, failed.Status().Code)
	assert.Contains(t, failed.Status().Description, "refused")

	// The same without a TracerProvider: no span.
	before := len(rec.Ended())
	b2 := setup(t)
	ctx, insert2 := tp.Tracer("order-api").Start(context.Background(), "create order")
	b2.insertIn(t, ctx, "ORD-UNTRACED-PUBLISHER")
	insert2.End()
	p2 := newPublisher(t, b2.store, newRecorder(), fastConfig("order-nospan", &logSink{}))
	stats, err = p2.PublishPending(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, stats.Sent)
	assert.Len(t, rec.Ended(), before+1, "only the insert span")
}

// failingFor fails the send of one event, by row id, and accepts the others, in one call for
// the whole batch. It names no topic.
type failingFor struct{ id int64 }

func (f *failingFor) Send(_ context.Context, evs []outbox.Event, _ bool) []error {
	errs := make([]error, len(evs))
	for i, ev := range evs {
		if ev.ID == f.id {
			errs[i] = errors.New("refused by the test")
		}
	}
	return errs
}

func (f *failingFor) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (f *failingFor) Check(context.Context, []string) error { return nil }

// A batch of more than 128 events, claimed and sent at once, gets one send span per 128 of
// its events: an SDK keeps 128 links per span and drops the rest, so one span for the batch
// would leave most of its events' traces unlinked. Every event's trace is linked from
// exactly one span, no span has more than 128 links or dropped any, and (with the fake
// sender) a failed event marks only its own span. Through a fake batch sender and through
// the real broker.
func TestSendSpansLinkEveryEventOfALargeBatch(t *testing.T) {
	t.Parallel()
	const events, parts = 300, 3 // 128 + 128 + 44
	for _, real := range []bool{false, true} {
		name := "fake batch sender"
		if real {
			name = "rocketmq"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tp, rec := newTracing(t)
			api := tp.Tracer("order-api")
			ctx := context.Background()

			// Each event in a trace of its own, all committed in one transaction.
			tx, err := b.store.BeginTx(ctx, nil)
			require.NoError(t, err)
			traceOf := map[int64]trace.TraceID{}
			var failing int64
			for i := range events {
				spanCtx, span := api.Start(ctx, "create order")
				bizNo := fmt.Sprintf("ORD-B%03d", i)
				id, err := outbox.InsertForTest(spanCtx, tx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
				span.End()
				require.NoError(t, err)
				traceOf[id] = span.SpanContext().TraceID()
				if i == 200 {
					failing = id
				}
			}
			require.NoError(t, tx.Commit())
			require.Len(t, traceOf, events)

			var sender outbox.Sender = &failingFor{id: failing}
			if real {
				sender = newFastRocketMQSender(t)
			}
			cfg := fastConfig("order-trace-batch", &logSink{})
			cfg.Tuning.ClaimPerRow = false
			cfg.Tuning.BatchSize = events
			cfg.TracerProvider = tp
			p := newPublisher(t, b.store, sender, cfg)
			outbox.SetClaimLimitForTest(p, events) // the whole batch in the first claim
			stats, err := p.PublishPending(ctx)
			require.NoError(t, err)
			require.Equal(t, events, stats.Claimed, "one batch")
			if real {
				require.Equal(t, events, stats.Sent)
			} else {
				require.Equal(t, events-1, stats.Sent)
				require.Equal(t, 1, stats.Retried)
			}

			var sends []sdktrace.ReadOnlySpan
			for _, s := range rec.Ended() {
				if s.SpanKind() == trace.SpanKindProducer {
					sends = append(sends, s)
				}
			}
			require.Len(t, sends, parts, "one span per 128 events of the batch")
			linkedBy := map[trace.TraceID]int{}
			seenParts := map[string]bool{}
			covered, failedSpans := 0, 0
			for _, s := range sends {
				assert.LessOrEqual(t, len(s.Links()), 128)
				assert.Zero(t, s.DroppedLinks(), "the SDK dropped links")
				attrs := map[string]string{}
				for _, kv := range s.Attributes() {
					attrs[string(kv.Key)] = kv.Value.String()
				}
				assert.Equal(t, strconv.Itoa(parts), attrs["outbox.send.parts"])
				seenParts[attrs["outbox.send.part"]] = true
				n, err := strconv.Atoi(attrs["messaging.batch.message_count"])
				require.NoError(t, err)
				assert.Len(t, s.Links(), n, "a link for each of the span's events")
				covered += n
				spanTraces := map[trace.TraceID]bool{}
				for _, l := range s.Links() {
					linkedBy[l.SpanContext.TraceID()]++
					spanTraces[l.SpanContext.TraceID()] = true
				}
				if s.Status().Code == codes.Error {
					failedSpans++
					assert.True(t, spanTraces[traceOf[failing]], "the failed span is the failed event's")
					assert.Equal(t, "1", attrs["outbox.send.failed"])
				}
			}
			assert.Equal(t, map[string]bool{"1": true, "2": true, "3": true}, seenParts)
			assert.Equal(t, events, covered, "the spans cover the batch")
			for id, tid := range traceOf {
				assert.Equal(t, 1, linkedBy[tid], "event %d's trace is linked from one send span", id)
			}
			assert.Len(t, linkedBy, events, "nothing else is linked")
			if real {
				assert.Zero(t, failedSpans)
			} else {
				assert.Equal(t, 1, failedSpans, "only the failed event's span is an error")
			}
		})
	}
}

// The sender sets traceparent and tracestate only from well-formed stored values.
func TestRocketMQMessageTraceProperties(t *testing.T) {
	t.Parallel()
	s, err := outbox.NewRocketMQSenderWithProducerForTest(outbox.RocketMQConfig{}, &fakeProducer{})
	require.NoError(t, err)
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, tc := range []struct {
		name, parent, state, wantParent, wantState string
	}{
		{"none", "", "", "", ""},
		{"parent only", parent, "", parent, ""},
		{"both", parent, "vendor=abc,b=2", parent, "vendor=abc,b=2"},
		{"malformed state", parent, "=,=", parent, ""},
		{"state without parent", "", "vendor=abc", "", ""},
		{"upper-case hex", strings.ToUpper(parent), "vendor=abc", "", ""},
		{"zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", "", ""},
		{"short", parent[:54], "", "", ""},
		{"garbage", "hello", "vendor=abc", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := outbox.MessageForTest(s, outbox.Event{EventID: "e", BizNo: "b", EventType: "E", Payload: []byte("x"),
				TraceParent: tc.parent, TraceState: tc.state}, false)
			assert.Equal(t, tc.wantParent, m.GetProperty(outbox.PropertyTraceParent))
			assert.Equal(t, tc.wantState, m.GetProperty(outbox.PropertyTraceState))
			_, has := m.GetProperties()[outbox.PropertyTraceParent]
			assert.Equal(t, tc.wantParent != "", has)
		})
	}
}

// A table made before the trace columns is refused by CreateSchema and by the insert, naming
// the fix; docs/upgrading.md's statement makes it usable, and its rows have no trace
// context.
func TestTableWithoutTraceColumnsNamesTheUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := b.insert(t, 1)[0]
	b.exec(t, "ALTER TABLE {t} DROP COLUMN trace_parent, DROP COLUMN trace_state") // the layout before tracing

	err := b.store.CreateSchema(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "lacks the trace_parent, trace_state columns")
	assert.Contains(t, err.Error(), "docs/upgrading.md")
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{"order":1}`)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no trace_parent column")
	assert.Contains(t, err.Error(), "docs/upgrading.md")
	require.NoError(t, tx.Rollback())

	// docs/upgrading.md's statement.
	b.exec(t, `ALTER TABLE {t}
    ADD COLUMN trace_parent CHAR(55) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    ADD COLUMN trace_state VARCHAR(256) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT ''`)
	require.NoError(t, b.store.CreateSchema(ctx))
	ev := b.get(t, old)
	assert.Empty(t, ev.TraceParent)
	assert.Empty(t, ev.TraceState)
	tp, _ := newTracing(t)
	tctx, span := tp.Tracer("order-api").Start(ctx, "create order")
	ev = b.get(t, b.insertIn(t, tctx, "ORD-AFTER-UPGRADE"))
	span.End()
	assert.Equal(t, traceparentOf(span.SpanContext()), ev.TraceParent)
}
