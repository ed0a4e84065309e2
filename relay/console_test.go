package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// The operator console over a table a real relay publishes: its store page names the relay
// as the leader, with its position and a live heartbeat, and counts the relay's sends in
// the last minute; a dead letter the relay wrote is requeued from the console, and the relay
// sends it, through the real broker. Once the relay has closed, the page says the
// publishers poll.
func TestConsoleOverARelayedTable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-console")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	faulty := outboxtest.NewFaultySender(rocketSender(t))
	faulty.Refuse(func(ev outbox.Event) bool { return ev.BizNo == "poison" })

	r, stop := start(t, e.dsn, faulty, e.config("relay-console-1"))
	waitLeader(t, r)
	sent := e.insert(t, 20, byIndex("relayed"))
	dead := e.insert(t, 1, func(int) string { return "poison" })[0]
	c.WaitDistinct(t, len(sent), 60*time.Second)
	waitFor(t, 20*time.Second, "20 SUCCESS and 1 FAIL", func() bool {
		st := e.statuses(t)
		return st["SUCCESS"] == 20 && st["FAIL"] == 1
	})

	h, err := console.New(console.Config{Stores: []console.Store{{Name: "orders", Store: e.store}}, AllowWrites: true, Logger: testLogger()})
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar}

	page := fetch(t, client, srv.URL+"/stores/orders")
	assert.Contains(t, page, "<tr><th>Mode</th><td>relay</td></tr>")
	assert.Contains(t, page, "<tr><th>Leader</th><td>relay-console-1</td></tr>")
	assert.Contains(t, page, `<td id="relay-live">yes</td>`)
	_, _, gtid := e.checkpoint(t)
	require.NotEmpty(t, gtid)
	assert.Contains(t, page, "<code>"+gtid[:strings.IndexAny(gtid+",", ",")]) // the position, or its first domain
	st, err := e.store.Stats(context.Background(), outbox.StatsOptions{SentPerMinute: true})
	require.NoError(t, err)
	var lastHour int64
	for _, n := range st.SentPerMinute {
		lastHour += n
	}
	assert.Equal(t, int64(len(sent)), lastHour, "the relay's sends are counted by the minute it marked them")

	ev, err := outbox.NewAdmin(e.store).GetByEventID(context.Background(), dead)
	require.NoError(t, err)
	require.Equal(t, outbox.StatusFail, ev.Status)
	eventPage := fetch(t, client, fmt.Sprintf("%s/stores/orders/events/%d", srv.URL, ev.ID))
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(eventPage)
	require.NotNil(t, m, "the event page has a requeue form")
	faulty.Reset() // the broker takes it now
	res, err := client.PostForm(fmt.Sprintf("%s/stores/orders/events/%d/requeue", srv.URL, ev.ID), url.Values{"csrf": {m[1]}, "confirm": {"yes"}})
	require.NoError(t, err)
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode, "the redirect's page: %s", body)
	assert.Contains(t, string(body), `id="flash"`)
	c.WaitDistinct(t, len(sent)+1, 60*time.Second)
	assert.Contains(t, c.Deliveries(), dead, "the requeued dead letter reaches the broker")
	waitFor(t, 20*time.Second, "the requeued event SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 21 })
	var owner string
	require.NoError(t, e.db.QueryRow("SELECT claim_owner FROM "+e.table+" WHERE event_id = ?", dead).Scan(&owner))
	assert.Equal(t, "relay-console-1", owner, "sent by the relay")

	stop()
	page = fetch(t, client, srv.URL+"/stores/orders")
	assert.Contains(t, page, "<tr><th>Mode</th><td>polling</td></tr>", "a relay that closes hands the table back")
	assert.Contains(t, page, `<td id="relay-live">no</td>`)
}

func fetch(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	res, err := c.Get(u)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", u, b)
	return string(b)
}
