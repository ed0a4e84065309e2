package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
)

// Every page renders with real data: the counts, the dead letters, one event with its
// pretty-printed payload, failure history and properties, the blocked keys, the inbox's
// rejected messages and one of them; every answer carries the security headers.
func TestPagesRenderRealData(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder, Routes: outbox.Routes{Topic: "orders_topic"}})
	wait := f.insert(t, "ORDER_CREATED", "ORD-1", []byte(`{}`))
	dead := f.insert(t, "ORDER_PAID", "ORD-2", []byte(`{"order":2,"lines":[1,2]}`))
	f.kill(t, dead, "broker refused: topic missing")
	behind := f.insert(t, "ORDER_SHIPPED", "ORD-2", []byte(`{}`))
	binary := f.insert(t, "BLOB", "ORD-3", []byte{0xff, 0xfe, 0x00, 0x01})
	f.kill(t, binary, "bad")
	in := newInbox(t, f.db, "console-pages")
	eventID := reject(t, in, "ORDER_PAID", "ORD-9", []byte(`{"x":1}`), "no such order")

	b, _ := newConsole(t, console.Config{
		Stores:  []console.Store{{Name: "orders", Store: f.store, RocketMQ: &outbox.RocketMQConfig{}}},
		Inboxes: []console.Inbox{{Inbox: in}},
	})

	home := b.get("/")
	require.Equal(t, http.StatusOK, home.status, home.body)
	assert.Contains(t, home.body, `href="/stores/orders"`)
	assert.Contains(t, home.body, `href="/inboxes/console-pages/rejected"`)
	assert.Contains(t, home.body, `id="read-only"`, "read-only by default, and says so")
	for k, v := range map[string]string{
		"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
		"Cache-Control": "no-store", "Content-Type": "text/html; charset=utf-8",
	} {
		assert.Equal(t, v, home.header.Get(k), k)
	}
	assert.Contains(t, home.header.Get("Content-Security-Policy"), "default-src 'self'")
	assert.NotContains(t, home.header.Get("Content-Security-Policy"), "unsafe-inline")
	assert.Contains(t, home.header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	assert.Contains(t, home.body, `<a href="/inboxes/console-pages/rejected">1</a>`, "the inbox's rejected messages counted")

	st := b.get("/stores/orders")
	require.Equal(t, http.StatusOK, st.status, st.body)
	assert.Contains(t, st.body, `id="count-fail"><a href="/stores/orders/dead-letters">2</a>`)
	assert.Contains(t, st.body, `id="count-wait">2<`, "two WAIT events: %d and %d", wait, behind)
	assert.Contains(t, st.body, `id="count-skipped">0<`, "SKIPPED counted")
	assert.Contains(t, st.body, `<svg id="sent-per-minute"`)
	assert.Contains(t, st.body, `href="/stores/orders/dead-letters?type=ORDER_PAID"`, "FAIL by type links the filtered list")
	assert.Contains(t, st.body, `id="nav-dead-letters"`)
	assert.Contains(t, st.body, `id="nav-blocked"`)
	assert.Contains(t, st.body, `id="stale-claims"`)
	assert.Contains(t, st.body, `id="relay"`)
	assert.Contains(t, b.get("/static/console.css").body, ".card")

	dl := b.get("/stores/orders/dead-letters")
	require.Equal(t, http.StatusOK, dl.status, dl.body)
	assert.Equal(t, []string{strconv.FormatInt(binary, 10), strconv.FormatInt(dead, 10)}, dl.rowIDs("events"), "newest first, FAIL only")
	assert.Empty(t, dl.next())

	ev := b.get(fmt.Sprintf("/stores/orders/events/%d", dead))
	require.Equal(t, http.StatusOK, ev.status, ev.body)
	assert.Contains(t, ev.body, `<span id="status" class="status s-FAIL">FAIL</span>`)
	assert.Contains(t, ev.body, "{\n  &#34;order&#34;: 2,\n  &#34;lines&#34;: [\n    1,\n    2\n  ]\n}", "the JSON payload pretty-printed")
	assert.Contains(t, ev.body, `id="failures"`)
	assert.Contains(t, ev.body, "<td>pub-1</td><td>permanent</td>", "the failure history")
	assert.Contains(t, ev.body, "<code>orders_topic</code>", "the topic the sender sends it to")
	assert.Contains(t, ev.body, "<code>eventId</code>")
	assert.Contains(t, ev.body, "<code>SHARDING_KEY</code></th><td><code>ORD-2</code>", "key order: the biz no is the sharding key")
	assert.NotContains(t, ev.body, `id="requeue"`, "read-only: no buttons")

	bin := b.get(fmt.Sprintf("/stores/orders/events/%d", binary))
	assert.Contains(t, bin.body, "binary, in hex")
	assert.Contains(t, bin.body, "ff fe 00 01")

	blocked := b.get("/stores/orders/blocked")
	require.Equal(t, http.StatusOK, blocked.status, blocked.body)
	assert.Equal(t, []string{strconv.FormatInt(dead, 10)}, blocked.rowIDs("blocked"), "ORD-2's dead letter holds ORD-2's next event")
	assert.Contains(t, blocked.body, `<td class="n">1</td>`, "one event waits behind it")
	assert.NotContains(t, blocked.body, `id="unordered"`)

	rl := b.get("/inboxes/console-pages/rejected")
	require.Equal(t, http.StatusOK, rl.status, rl.body)
	ids := rl.rowIDs("rejected")
	require.Len(t, ids, 1)
	assert.Contains(t, rl.body, eventID)
	assert.Contains(t, rl.body, `id="nav-rejected"`)
	rm := b.get("/inboxes/console-pages/rejected/" + ids[0])
	require.Equal(t, http.StatusOK, rm.status, rm.body)
	assert.Contains(t, rm.body, "no such order")
	assert.Contains(t, rm.body, `<span class="tag" id="reason-class">permanent</span>`)
	assert.Contains(t, rm.body, "{\n  &#34;x&#34;: 1\n}")
	assert.NotContains(t, rm.body, `id="replay"`)

	for path, want := range map[string]int{
		"/stores/nope":                          http.StatusNotFound,
		"/stores/orders/events/999999999":       http.StatusNotFound,
		"/stores/orders/events/abc":             http.StatusBadRequest,
		"/inboxes/nope/rejected":                http.StatusNotFound,
		"/inboxes/console-pages/rejected/99999": http.StatusNotFound,
		"/elsewhere":                            http.StatusNotFound,
	} {
		p := b.get(path)
		assert.Equal(t, want, p.status, path)
		if want != http.StatusNotFound || strings.HasPrefix(path, "/stores/orders/") {
			assert.Contains(t, p.body, `id="error"`, path)
		}
	}
}

// The dead letters page by id, newest first: pages do not overlap, and the last has no
// "older" link. The filter is kept across pages.
func TestDeadLettersPageByID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	var want []string
	for i := range 7 {
		id := f.dead(t, "PAGED", fmt.Sprintf("K-%d", i))
		want = append([]string{strconv.FormatInt(id, 10)}, want...)
	}
	f.dead(t, "OTHER", "K-x") // filtered out
	b, _ := newConsole(t, console.Config{Stores: []console.Store{{Name: "s", Store: f.store}}, PageSize: 3})

	var got []string
	path := "/stores/s/dead-letters?type=PAGED"
	pages := 0
	for path != "" {
		p := b.get(path)
		require.Equal(t, http.StatusOK, p.status, p.body)
		ids := p.rowIDs("events")
		assert.LessOrEqual(t, len(ids), 3)
		got = append(got, ids...)
		path = p.next()
		if path != "" {
			assert.Contains(t, path, "type=PAGED", "the next page keeps the filter")
			assert.Contains(t, path, "before="+ids[len(ids)-1])
		}
		pages++
		require.Less(t, pages, 5)
	}
	assert.Equal(t, 3, pages)
	assert.Equal(t, want, got, "every dead letter once, newest first")

	empty := b.get("/stores/s/dead-letters?before=1")
	assert.Equal(t, http.StatusOK, empty.status)
	assert.Empty(t, empty.rowIDs("events"))
	assert.Contains(t, empty.body, `id="empty"`)
}

// A store and an inbox mounted under a prefix behind the service's own authentication: the
// links are the prefix's, the CSS loads, an action works through it, and the audit names
// the user the middleware found.
func TestMountedUnderAPrefix(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "T", "B")
	log := &auditLog{}
	h, err := console.New(console.Config{
		Stores: []console.Store{{Name: "main", Store: f.store}}, Prefix: "/ops/outbox/", AllowWrites: true,
		Logger: slog.New(log),
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/outbox/", requireUser(h))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the service's own page", http.StatusTeapot)
	})
	b := serve(t, mux)

	resp := b.get("/ops/outbox/")
	assert.Equal(t, http.StatusUnauthorized, resp.status, "the service's middleware guards it")
	b.client.Transport = basicAuth{"alice", "secret"}
	home := b.get("/ops/outbox/")
	require.Equal(t, http.StatusOK, home.status, home.body)
	assert.Contains(t, home.body, `href="/ops/outbox/static/console.css"`)
	assert.Contains(t, home.body, `href="/ops/outbox/stores/main"`)
	assert.Contains(t, home.body, `id="nav-overview"`)
	assert.Equal(t, http.StatusOK, b.get("/ops/outbox/static/console.css").status)
	st := b.get("/ops/outbox/stores/main")
	require.Equal(t, http.StatusOK, st.status)
	assert.Contains(t, st.body, `href="/ops/outbox/stores/main/dead-letters"`)
	dl := b.get("/ops/outbox/stores/main/dead-letters")
	assert.Equal(t, []string{strconv.FormatInt(id, 10)}, dl.rowIDs("events"))
	evPath := fmt.Sprintf("/ops/outbox/stores/main/events/%d", id)
	assert.Contains(t, dl.body, `href="`+evPath+`"`)
	ev := b.get(evPath)
	cookie := dl.header.Get("Set-Cookie") // the first page with a form sets it
	assert.Contains(t, cookie, "outbox_console_csrf=")
	assert.Contains(t, cookie, "Path=/ops/outbox/")
	assert.Contains(t, cookie, "HttpOnly")
	assert.Contains(t, cookie, "SameSite=Strict")
	conf := b.post(evPath+"/requeue", url.Values{"csrf": {ev.csrf(t)}})
	require.Equal(t, http.StatusOK, conf.status, conf.body)
	assert.Contains(t, conf.body, `action="`+evPath+`/requeue"`)
	assert.Contains(t, conf.body, `href="`+evPath+`" id="cancel"`)
	done := b.post(evPath+"/requeue", url.Values{"csrf": {conf.csrf(t)}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, done.status, done.body)
	assert.Equal(t, evPath, done.url, "redirected to the event")
	assert.Contains(t, done.body, `id="flash"`)
	assert.Equal(t, outbox.StatusWait, f.status(t, id))
	assert.Equal(t, http.StatusTeapot, b.get("/stores/main").status, "nothing answered outside the prefix")
	recs := log.all()
	require.NotEmpty(t, recs)
	assert.Equal(t, "alice", recs[len(recs)-1]["user"])
}

// The configurations New refuses, each with an error wrapping ErrInvalidConfig.
func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	in := newInbox(t, f.db, "console-cfg")
	ok := console.Store{Name: "a", Store: f.store}
	for name, cfg := range map[string]console.Config{
		"nothing":         {},
		"empty name":      {Stores: []console.Store{{Store: f.store}}},
		"slash in name":   {Stores: []console.Store{{Name: "a/b", Store: f.store}}},
		"nil store":       {Stores: []console.Store{{Name: "a"}}},
		"duplicate store": {Stores: []console.Store{ok, ok}},
		"nil inbox":       {Inboxes: []console.Inbox{{}}},
		"duplicate inbox": {Inboxes: []console.Inbox{{Inbox: in}, {Inbox: in}}},
		"prefix no lead":  {Stores: []console.Store{ok}, Prefix: "ops/"},
		"prefix no trail": {Stores: []console.Store{ok}, Prefix: "/ops"},
		"prefix unclean":  {Stores: []console.Store{ok}, Prefix: "/ops//x/"},
		"prefix braces":   {Stores: []console.Store{ok}, Prefix: "/{x}/"},
		"short CSRF key":  {Stores: []console.Store{ok}, CSRFKey: []byte("too short")},
		"negative page":   {Stores: []console.Store{ok}, PageSize: -1},
		"page too large":  {Stores: []console.Store{ok}, PageSize: console.PageSizeMax + 1},
		"negative lease":  {Stores: []console.Store{{Name: "a", Store: f.store, Lease: -1}}},
	} {
		h, err := console.New(cfg)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
		assert.Nil(t, h, name)
	}
	h, err := console.New(console.Config{Inboxes: []console.Inbox{{Inbox: in}}, PageSize: console.PageSizeMax,
		CSRFKey: make([]byte, console.CSRFKeyMinLen), Prefix: "/x/"})
	require.NoError(t, err, "an inbox alone is enough")
	assert.NotNil(t, h)
}

// The time filter: since inclusive, until exclusive, in RFC 3339, a UTC date and time, or
// a UTC date.
func TestDeadLettersFilterByTime(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "T", "B")
	ev, err := f.admin.Get(context.Background(), id)
	require.NoError(t, err)
	created := ev.CreateTime.UTC()
	b, _ := newConsole(t, console.Config{Stores: []console.Store{{Name: "s", Store: f.store}}})
	for q, want := range map[string]bool{
		"since=" + created.Add(-time.Hour).Format(time.RFC3339):                                                                           true,
		"since=" + url.QueryEscape(created.Add(time.Hour).Format(time.RFC3339)):                                                           false,
		"since=" + created.Add(-24*time.Hour).Format("2006-01-02"):                                                                        true,
		"until=" + created.Add(-24*time.Hour).Format("2006-01-02"):                                                                        false,
		"until=" + url.QueryEscape(created.Add(time.Minute).Format("2006-01-02 15:04")):                                                   true,
		"since=" + created.Add(-time.Minute).Format("2006-01-02T15:04") + "&until=" + created.Add(time.Minute).Format("2006-01-02T15:04"): true,
		"since=" + url.QueryEscape(created.In(time.FixedZone("UTC+8", 8*3600)).Add(-time.Second).Format(time.RFC3339)):                    true,
	} {
		p := b.get("/stores/s/dead-letters?" + q)
		require.Equal(t, http.StatusOK, p.status, q)
		if want {
			assert.Equal(t, []string{strconv.FormatInt(id, 10)}, p.rowIDs("events"), q)
		} else {
			assert.Empty(t, p.rowIDs("events"), q)
		}
	}
}
