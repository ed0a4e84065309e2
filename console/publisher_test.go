package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/outboxtest"
)

// A dead letter a real publisher made (its sender refused the event for good) shows its
// failure history as the publisher recorded it; requeued in the console once the cause is
// fixed, the publisher sends it, and the event page says SUCCESS.
func TestRequeueADeadLetterThePublisherMade(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	f := newFixture(t, outbox.MySQLConfig{})
	sent := outboxtest.NewMemorySender()
	sender := outboxtest.NewFaultySender(sent)
	sender.Refuse(nil)
	pub, err := outbox.NewPublisher(f.store, sender, outbox.Config{
		InstanceID: "console-pub-1", PollInterval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, pub.Start(ctx))
	defer func() { require.NoError(t, pub.Close()) }()

	id := f.insert(t, "ORDER_PAID", "ORD-7", []byte(`{"order":7}`))
	require.NoError(t, sender.WaitCounts(ctx, func(c outboxtest.FaultCounts) bool { return c.Refused >= 1 }))
	require.Eventually(t, func() bool { return f.status(t, id) == outbox.StatusFail }, 30*time.Second, 10*time.Millisecond)

	b, log := writable(t, f)
	path := fmt.Sprintf("/stores/s/events/%d", id)
	ev := b.get(path)
	require.Equal(t, http.StatusOK, ev.status, ev.body)
	assert.Contains(t, ev.body, `<span id="status" class="status s-FAIL">FAIL</span>`)
	assert.Contains(t, ev.body, "<td>console-pub-1</td><td>permanent</td>", "the failure the publisher recorded")
	assert.Contains(t, ev.body, outboxtest.ErrInjected.Error())

	sender.Reset() // the cause is fixed
	conf := b.post(path+"/requeue", url.Values{"csrf": {ev.csrf(t)}})
	require.Equal(t, http.StatusOK, conf.status, conf.body)
	done := b.post(path+"/requeue", url.Values{"csrf": {conf.csrf(t)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, done.status, done.body)
	got, err := sent.WaitFor(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, `{"order":7}`, string(got[0].Payload))
	require.Eventually(t, func() bool { return f.status(t, id) == outbox.StatusSuccess }, 30*time.Second, 10*time.Millisecond)
	assert.Contains(t, b.get(path).body, `<span id="status" class="status s-SUCCESS">SUCCESS</span>`)
	recs := log.all()
	require.Len(t, recs, 2)
	assert.Equal(t, "1", recs[1]["rows"])
}
