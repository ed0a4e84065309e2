package console_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
)

// A POST without the CSRF token, with a wrong one, with another browser's, or from another
// origin is refused with 403 and changes nothing; each refusal is audited.
func TestWritesNeedTheCSRFToken(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "T", "B")
	b, log := writable(t, f)
	path := fmt.Sprintf("/stores/s/events/%d", id)
	token := b.get(path).csrf(t)

	other := b.another() // another browser, with a cookie of its own
	require.NotEqual(t, token, other.get(path).csrf(t))
	stranger := b.another() // no cookie at all

	for name, try := range map[string]func() page{
		"no token": func() page { return b.post(path+"/requeue", url.Values{"confirm": {"yes"}}) },
		"wrong token": func() page {
			return b.post(path+"/requeue", url.Values{"confirm": {"yes"}, "csrf": {token[:len(token)-2] + "xx"}})
		},
		"empty token":  func() page { return b.post(path+"/skip", url.Values{"confirm": {"yes"}, "csrf": {""}}) },
		"no cookie":    func() page { return stranger.post(path+"/requeue", url.Values{"confirm": {"yes"}, "csrf": {token}}) },
		"other cookie": func() page { return other.post(path+"/requeue", url.Values{"confirm": {"yes"}, "csrf": {token}}) },
		"cross-origin": func() page {
			req, err := http.NewRequest(http.MethodPost, b.srv.URL+path+"/requeue",
				strings.NewReader(url.Values{"confirm": {"yes"}, "csrf": {token}}.Encode()))
			require.NoError(t, err)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Sec-Fetch-Site", "cross-site")
			return b.do(req)
		},
		"bulk, no token": func() page {
			return b.post("/stores/s/dead-letters/requeue", url.Values{"confirm": {"yes"}, "count": {"1"}, "max_id": {"999"}})
		},
	} {
		p := try()
		assert.Equal(t, http.StatusForbidden, p.status, name)
		assert.Contains(t, p.body, `id="error"`, name)
		assert.Equal(t, outbox.StatusFail, f.status(t, id), name)
	}
	recs := log.all()
	require.Len(t, recs, 7)
	for _, r := range recs {
		assert.True(t, strings.HasPrefix(r["outcome"], "refused"), "%v", r)
		assert.Equal(t, "0", r["rows"])
	}

	// The right token, with its cookie, works.
	ok := b.post(path+"/requeue", url.Values{"confirm": {"yes"}, "csrf": {token}})
	assert.Equal(t, http.StatusOK, ok.status, ok.body)
	assert.Equal(t, outbox.StatusWait, f.status(t, id))
}

// An action's path answers GET (or any method but POST) with 405, doing nothing; a page's
// path refuses POST the same way.
func TestActionsArePOSTOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "T", "B")
	in := newInbox(t, f.db, "console-methods")
	b, log := writable(t, f, console.Inbox{Inbox: in})
	for _, path := range []string{
		fmt.Sprintf("/stores/s/events/%d/requeue?confirm=yes", id),
		fmt.Sprintf("/stores/s/events/%d/skip?confirm=yes", id),
		"/stores/s/dead-letters/requeue?confirm=yes&count=1&max_id=999",
		"/stores/s/dead-letters/skip?confirm=yes&count=1&max_id=999",
		"/inboxes/console-methods/rejected/1/replay",
		"/inboxes/console-methods/rejected/1/resend",
	} {
		p := b.get(path)
		assert.Equal(t, http.StatusMethodNotAllowed, p.status, path)
		assert.Equal(t, "nosniff", p.header.Get("X-Content-Type-Options"), path)
		req, err := http.NewRequest(http.MethodPut, b.srv.URL+path, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusMethodNotAllowed, b.do(req).status, path)
	}
	assert.Equal(t, http.StatusMethodNotAllowed, b.post(fmt.Sprintf("/stores/s/events/%d", id), nil).status)
	assert.Equal(t, outbox.StatusFail, f.status(t, id))
	assert.Empty(t, log.all(), "nothing reached an action")
}

// Read-only (the default): no buttons on any page, a banner, and every POST refused with
// 403, the right token or not, changing nothing.
func TestReadOnlyRefusesWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "T", "B")
	in := newInbox(t, f.db, "console-ro")
	reject(t, in, "T", "B", []byte(`{}`), "nope")
	log := &auditLog{}
	h, err := console.New(console.Config{Stores: []console.Store{{Name: "s", Store: f.store}},
		Inboxes: []console.Inbox{{Inbox: in, Replay: nil, Sender: nil}}, Logger: slog.New(log)})
	require.NoError(t, err)
	b := serve(t, h)

	rid := b.get("/inboxes/console-ro/rejected").rowIDs("rejected")[0]
	for _, path := range []string{"/", "/stores/s", "/stores/s/dead-letters", fmt.Sprintf("/stores/s/events/%d", id),
		"/stores/s/blocked", "/inboxes/console-ro/rejected", "/inboxes/console-ro/rejected/" + rid} {
		p := b.get(path)
		require.Equal(t, http.StatusOK, p.status, path)
		assert.Contains(t, p.body, `id="read-only"`, path)
		assert.NotContains(t, p.body, "<form method=\"post\"", path)
		for _, button := range []string{"requeue", "skip", "requeue-all", "skip-all", "replay", "resend", "confirm"} {
			assert.NotContains(t, p.body, `id="`+button+`"`, path)
		}
	}
	for _, path := range []string{
		fmt.Sprintf("/stores/s/events/%d/requeue", id), fmt.Sprintf("/stores/s/events/%d/skip", id),
		"/stores/s/dead-letters/requeue", "/stores/s/dead-letters/skip",
		"/inboxes/console-ro/rejected/" + rid + "/replay", "/inboxes/console-ro/rejected/" + rid + "/resend",
	} {
		p := b.post(path, url.Values{"confirm": {"yes"}, "count": {"1"}, "max_id": {"999999"}})
		assert.Equal(t, http.StatusForbidden, p.status, path)
		assert.Contains(t, p.body, "read-only", path)
	}
	assert.Equal(t, outbox.StatusFail, f.status(t, id))
	assert.Len(t, b.get("/inboxes/console-ro/rejected").rowIDs("rejected"), 1)
	recs := log.all()
	require.Len(t, recs, 6)
	for _, r := range recs {
		assert.Equal(t, "refused: read-only", r["outcome"])
	}
}

const markup = `<script>alert("x")</script>`
const escaped = `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`

// Markup in what the console shows (a payload, as text and inside JSON, a biz no, an event
// type, a last error, a rejected message's reason and body, a filter value echoed back)
// shows as text: the raw tag is nowhere, its escaped form is.
func TestMarkupIsEscaped(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{Ordering: outbox.KeyOrder})
	text := f.insert(t, "T"+markup, "B"+markup, []byte("plain "+markup))
	f.kill(t, text, "error "+markup)
	js := f.insert(t, "JSON", "B"+markup, []byte(`{"html":"`+strings.ReplaceAll(markup, `"`, `\"`)+`"}`))
	f.kill(t, js, "boom")
	f.insert(t, "LATER", "B"+markup, []byte(`{}`)) // blocked behind them
	in := newInbox(t, f.db, "console-xss")
	reject(t, in, "T"+markup, "B"+markup, []byte("body "+markup), "reason "+markup)
	b, _ := writable(t, f, console.Inbox{Inbox: in})

	rid := b.get("/inboxes/console-xss/rejected").rowIDs("rejected")[0]
	for _, path := range []string{
		"/stores/s",
		"/stores/s/dead-letters",
		fmt.Sprintf("/stores/s/events/%d", text),
		fmt.Sprintf("/stores/s/events/%d", js),
		"/stores/s/blocked",
		"/inboxes/console-xss/rejected",
		"/inboxes/console-xss/rejected/" + rid,
		"/stores/s/dead-letters?" + url.Values{"type": {markup}, "biz": {markup}}.Encode(),
	} {
		p := b.get(path)
		require.Equal(t, http.StatusOK, p.status, path)
		assert.NotContains(t, p.body, "<script", path)
		assert.Contains(t, p.body, "&lt;script&gt;", path)
	}
	ev := b.get(fmt.Sprintf("/stores/s/events/%d", text))
	assert.Contains(t, ev.body, "plain "+escaped)
	assert.Contains(t, ev.body, "error "+escaped)
	assert.Contains(t, ev.body, "B"+escaped)
	assert.Contains(t, ev.body, "T"+escaped)
	echo := b.get("/stores/s/dead-letters?" + url.Values{"type": {markup}}.Encode())
	assert.Contains(t, echo.body, `value="`+escaped+`"`)
	rm := b.get("/inboxes/console-xss/rejected/" + rid)
	assert.Contains(t, rm.body, "body "+escaped)
	assert.Contains(t, rm.body, "reason "+escaped)

	// The confirmation pages too, and a bad filter's error page.
	tok := ev.csrf(t)
	conf := b.post(fmt.Sprintf("/stores/s/events/%d/requeue", text), url.Values{"csrf": {tok}})
	assert.NotContains(t, conf.body, "<script")
	assert.Contains(t, conf.body, "error "+escaped)
	bulk := b.post("/stores/s/dead-letters/skip", url.Values{"csrf": {tok}, "biz": {"B" + markup}})
	assert.NotContains(t, bulk.body, "<script")
	assert.Contains(t, bulk.body, "2 dead letters match")
	bad := b.get("/stores/s/dead-letters?" + url.Values{"since": {markup}}.Encode())
	assert.Equal(t, http.StatusBadRequest, bad.status)
	assert.NotContains(t, bad.body, "<script")
	assert.Equal(t, outbox.StatusFail, f.status(t, text))
}

// Hostile filter and id values: a value the console cannot read is answered 400 with a
// message naming the field; an SQL-ish string is only a value that matches nothing. Nothing
// is changed by any of them.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "T", "B")
	in := newInbox(t, f.db, "console-hostile")
	b, log := writable(t, f, console.Inbox{Inbox: in})

	for path, field := range map[string]string{
		"/stores/s/dead-letters?before=abc":                        "before",
		"/stores/s/dead-letters?before=-5":                         "before",
		"/stores/s/dead-letters?before=0":                          "before",
		"/stores/s/dead-letters?before=99999999999999999999999":    "before",
		"/stores/s/dead-letters?before=1e3":                        "before",
		"/stores/s/dead-letters?since=yesterday":                   "since",
		"/stores/s/dead-letters?since=0000-01-01":                  "since",
		"/stores/s/dead-letters?until=2026-13-45":                  "until",
		"/stores/s/dead-letters?since=2026-12-02&until=2026-12-01": "until",
		"/stores/s/dead-letters?type=" + strings.Repeat("x", 5000): "type",
		"/stores/s/dead-letters?biz=" + strings.Repeat("y", 5000):  "biz",
		"/stores/s/blocked?after=-1":                               "after",
		"/stores/s/blocked?after=x":                                "after",
		"/inboxes/console-hostile/rejected?after=%27%20OR%201=1":   "after",
		"/stores/s/events/-1":                                      "id",
		"/stores/s/events/0":                                       "id",
		"/stores/s/events/18446744073709551616":                    "id",
		"/inboxes/console-hostile/rejected/-3":                     "id",
	} {
		p := b.get(path)
		assert.Equal(t, http.StatusBadRequest, p.status, path)
		assert.Contains(t, p.body, `id="error"`, path)
		assert.Contains(t, p.body, field+":", path)
	}
	for _, q := range []url.Values{
		{"type": {"' OR 1=1 --"}},
		{"biz": {"x'; DROP TABLE t_event_record; --"}},
		{"type": {"T\x00"}},
		{"type": {"%"}},
		{"biz": {"_"}},
		{"before": {"9223372036854775807"}, "type": {"nope"}},
	} {
		p := b.get("/stores/s/dead-letters?" + q.Encode())
		assert.Equal(t, http.StatusOK, p.status, q.Encode())
		assert.Empty(t, p.rowIDs("events"), "no rows for %s", q.Encode())
	}
	all := b.get("/stores/s/dead-letters?before=9223372036854775807")
	assert.Equal(t, []string{fmt.Sprint(id)}, all.rowIDs("events"))

	// Forged bulk fields are refused before anything runs.
	tok := all.csrf(t)
	for _, form := range []url.Values{
		{"count": {"-1"}, "max_id": {fmt.Sprint(id)}},
		{"count": {"0"}, "max_id": {fmt.Sprint(id)}},
		{"count": {"abc"}, "max_id": {fmt.Sprint(id)}},
		{"count": {"99999999"}, "max_id": {fmt.Sprint(id)}},
		{"count": {"1"}, "max_id": {"-3"}},
		{"count": {"1"}, "max_id": {""}},
		{"count": {"1"}, "max_id": {fmt.Sprint(id)}, "since": {"not a time"}},
	} {
		form.Set("csrf", tok)
		form.Set("confirm", "yes")
		p := b.post("/stores/s/dead-letters/requeue", form)
		assert.Equal(t, http.StatusBadRequest, p.status, form.Encode())
		assert.Contains(t, p.body, `id="error"`)
	}
	assert.Equal(t, outbox.StatusFail, f.status(t, id))
	for _, r := range log.all() {
		assert.Equal(t, "error", r["outcome"])
		assert.Equal(t, "0", r["rows"])
	}
}
