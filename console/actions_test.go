package console_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

func writable(t *testing.T, f *fixture, inboxes ...console.Inbox) (*browser, *auditLog) {
	t.Helper()
	return newConsole(t, console.Config{
		Stores: []console.Store{{Name: "s", Store: f.store}}, Inboxes: inboxes, AllowWrites: true,
		User: func(r *http.Request) string { return r.Header.Get("X-Test-User") },
	})
}

// Requeue and skip one dead letter: the first POST answers a confirmation page and changes
// nothing, the confirmed one changes the row, redirects to the event with a message, and
// each POST writes one audit record.
func TestRequeueAndSkipOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	requeued, skipped := f.dead(t, "T", "B-1"), f.dead(t, "T", "B-2")
	b, log := writable(t, f)

	var token string
	for _, c := range []struct {
		id     int64
		action string
		want   outbox.Status
	}{{requeued, "requeue", outbox.StatusWait}, {skipped, "skip", outbox.StatusSkipped}} {
		path := fmt.Sprintf("/stores/s/events/%d", c.id)
		ev := b.get(path)
		require.Equal(t, http.StatusOK, ev.status, ev.body)
		assert.Contains(t, ev.body, `id="`+c.action+`"`, "a dead letter has its buttons")
		conf := b.post(path+"/"+c.action, url.Values{"csrf": {ev.csrf(t)}})
		require.Equal(t, http.StatusOK, conf.status, conf.body)
		assert.Contains(t, conf.body, `id="confirm"`)
		assert.Contains(t, conf.body, `id="cancel"`)
		token = conf.csrf(t)
		assert.Equal(t, outbox.StatusFail, f.status(t, c.id), "asking changes nothing")

		done := b.post(path+"/"+c.action, url.Values{"csrf": {conf.csrf(t)}, "confirm": {"yes"}})
		require.Equal(t, http.StatusOK, done.status, done.body)
		assert.Equal(t, path, done.url)
		assert.Contains(t, done.body, `id="flash"`)
		assert.Contains(t, done.body, `<span id="status" class="status s-`+string(c.want)+`">`)
		assert.Equal(t, c.want, f.status(t, c.id))
		assert.NotContains(t, done.body, `id="`+c.action+`"`, "no buttons for an event that is no dead letter")

		again := b.post(path+"/"+c.action, url.Values{"csrf": {conf.csrf(t)}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusConflict, again.status, "not a dead letter any more")
		assert.Contains(t, again.body, `id="error"`)
		assert.Equal(t, c.want, f.status(t, c.id))
	}
	missing := b.post("/stores/s/events/999999/requeue", url.Values{"csrf": {token}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusNotFound, missing.status, missing.body)

	recs := log.all()
	require.Len(t, recs, 7, "one record per POST: ask, act, act again, for each; and the missing one")
	for _, r := range recs {
		assert.Equal(t, "INFO", r["level"])
		assert.Equal(t, "anonymous", r["user"], "User returned \"\"")
		assert.Equal(t, "s", r["store"])
		assert.NotEmpty(t, r["remote"])
	}
	assert.Equal(t, "requeue", recs[0]["action"])
	assert.Equal(t, "asked to confirm", recs[0]["outcome"])
	assert.Equal(t, "0", recs[0]["rows"])
	assert.Equal(t, strconv.FormatInt(requeued, 10), recs[1]["id"])
	assert.Equal(t, "done", recs[1]["outcome"])
	assert.Equal(t, "1", recs[1]["rows"])
	assert.Equal(t, "error", recs[2]["outcome"])
	assert.Contains(t, recs[2]["error"], "not a dead letter")
	assert.Equal(t, "skip", recs[4]["action"])
	assert.Equal(t, "1", recs[4]["rows"])
}

// csrfOrEmpty is the page's token, or "" on a page without forms (the cookie is set by
// pages with forms only).
func (p page) csrfOrEmpty() string {
	if m := csrfRE.FindStringSubmatch(p.body); m != nil {
		return m[1]
	}
	return ""
}

// A bulk requeue: the first POST counts (a dry run) and shows the count, changing nothing;
// the confirmed POST requeues at most that many, none newer than the newest counted, so
// that a dead letter that fails after the count is left alone. The filter holds: other
// types are untouched.
func TestBulkRequeueIsBoundedByTheConfirmedCount(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	var matching []int64
	for i := range 3 {
		matching = append(matching, f.dead(t, "PAY", fmt.Sprintf("P-%d", i)))
	}
	other := f.dead(t, "SHIP", "S-1")
	b, log := writable(t, f)

	dl := b.get("/stores/s/dead-letters?type=PAY")
	require.Contains(t, dl.body, `id="requeue-all"`)
	dry := b.post("/stores/s/dead-letters/requeue", url.Values{"csrf": {dl.csrf(t)}, "type": {"PAY"}})
	require.Equal(t, http.StatusOK, dry.status, dry.body)
	assert.Contains(t, dry.body, "3 dead letters match this filter")
	assert.Contains(t, dry.body, `id="confirm"`)
	assert.Equal(t, "3", dry.hidden(t, "count"))
	assert.Equal(t, strconv.FormatInt(matching[2], 10), dry.hidden(t, "max_id"))
	for _, id := range matching {
		assert.Equal(t, outbox.StatusFail, f.status(t, id), "the dry run changes nothing")
	}

	late := f.dead(t, "PAY", "P-late") // fails after the count
	done := b.post("/stores/s/dead-letters/requeue", url.Values{"csrf": {dry.csrf(t)}, "confirm": {"yes"},
		"type": {dry.hidden(t, "type")}, "biz": {""}, "since": {""}, "until": {""},
		"count": {dry.hidden(t, "count")}, "max_id": {dry.hidden(t, "max_id")}})
	require.Equal(t, http.StatusOK, done.status, done.body)
	assert.Contains(t, done.body, `id="flash"`)
	assert.Contains(t, done.body, "3 of the 3 dead letters confirmed were requeued")
	for _, id := range matching {
		assert.Equal(t, outbox.StatusWait, f.status(t, id))
	}
	assert.Equal(t, outbox.StatusFail, f.status(t, late), "not counted, not requeued")
	assert.Equal(t, outbox.StatusFail, f.status(t, other), "another type")
	assert.Equal(t, []string{strconv.FormatInt(late, 10)}, done.rowIDs("events"), "back on the filtered list")

	// A forged count larger than the confirmed one still cannot reach past max_id.
	forged := b.post("/stores/s/dead-letters/skip", url.Values{"csrf": {dry.csrf(t)}, "confirm": {"yes"},
		"type": {"SHIP"}, "count": {"5"}, "max_id": {strconv.FormatInt(other, 10)}})
	require.Equal(t, http.StatusOK, forged.status, forged.body)
	assert.Equal(t, outbox.StatusSkipped, f.status(t, other))
	assert.Equal(t, outbox.StatusFail, f.status(t, late), "newer than max_id")

	none := b.post("/stores/s/dead-letters/skip", url.Values{"csrf": {dry.csrf(t)}, "type": {"NOTHING"}})
	assert.Equal(t, http.StatusOK, none.status)
	assert.Contains(t, none.body, "No dead letters match")
	assert.NotContains(t, none.body, `id="confirm"`)

	recs := log.all()
	require.Len(t, recs, 4)
	assert.Equal(t, "requeue-all", recs[0]["action"])
	assert.Equal(t, "dry run", recs[0]["outcome"])
	assert.Equal(t, "3", recs[0]["matched"])
	assert.Equal(t, "PAY", recs[0]["filter.type"])
	assert.Equal(t, "done", recs[1]["outcome"])
	assert.Equal(t, "3", recs[1]["rows"])
	assert.Equal(t, "3", recs[1]["count"])
	assert.Equal(t, "skip-all", recs[2]["action"])
	assert.Equal(t, "1", recs[2]["rows"])
}

// The inbox's rejected messages: replay with the group's handler (its effect committed, the
// row gone), resend through a sender (the event sent as it was, the row gone).
func TestInboxReplayAndResend(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	in := newInbox(t, f.db, "console%replay") // a group name may hold %
	replayed := reject(t, in, "PAID", "R-1", []byte(`{"n":1}`), "no such order yet")
	resent := reject(t, in, "PAID", "R-2", []byte(`{"n":2}`), "no such order yet")
	var handled []string
	sender := outboxtest.NewMemorySender()
	b, log := writable(t, f, console.Inbox{
		Inbox: in,
		Replay: func(_ context.Context, _ *sql.Tx, msg *inbox.Message) error {
			handled = append(handled, msg.EventID)
			return nil
		},
		Sender: sender,
	})
	list := b.get("/inboxes/console%25replay/rejected")
	ids := list.rowIDs("rejected")
	require.Len(t, ids, 2)

	for i, c := range []struct{ action, id string }{{"replay", ids[0]}, {"resend", ids[1]}} {
		path := "/inboxes/console%25replay/rejected/" + c.id
		m := b.get(path)
		require.Equal(t, http.StatusOK, m.status, m.body)
		assert.Contains(t, m.body, `id="replay"`)
		assert.Contains(t, m.body, `id="resend"`)
		conf := b.post(path+"/"+c.action, url.Values{"csrf": {m.csrf(t)}})
		require.Equal(t, http.StatusOK, conf.status, conf.body)
		assert.Contains(t, conf.body, `id="confirm"`)
		assert.Contains(t, conf.body, `action="`+path+"/"+c.action+`"`, "the form posts to the escaped path")
		assert.Len(t, b.get("/inboxes/console%25replay/rejected").rowIDs("rejected"), 2-i, "asking changes nothing")
		done := b.post(path+"/"+c.action, url.Values{"csrf": {conf.csrf(t)}, "confirm": {"yes"}})
		require.Equal(t, http.StatusOK, done.status, done.body)
		assert.Equal(t, "/inboxes/console%25replay/rejected", done.url)
		assert.Contains(t, done.body, `id="flash"`)
		assert.NotContains(t, done.rowIDs("rejected"), c.id, "the row is gone")
		assert.Equal(t, http.StatusNotFound, b.get(path).status)
	}
	assert.Equal(t, []string{replayed}, handled)
	sent := sender.Events()
	require.Len(t, sent, 1)
	assert.Equal(t, resent, sent[0].EventID)
	assert.Equal(t, `{"n":2}`, string(sent[0].Payload))

	recs := log.all()
	require.Len(t, recs, 4)
	assert.Equal(t, "console%replay", recs[1]["group"])
	assert.Equal(t, "replay", recs[1]["action"])
	assert.Equal(t, "handled", recs[1]["replay_outcome"])
	assert.Equal(t, "1", recs[1]["rows"])
	assert.Equal(t, "resend", recs[3]["action"])
	assert.Equal(t, "done", recs[3]["outcome"])
}

// An inbox without Replay or Sender offers neither: no buttons, and the POST refused.
func TestInboxActionsNotOffered(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	in := newInbox(t, f.db, "console-none")
	reject(t, in, "PAID", "N-1", []byte(`{}`), "nope")
	f.dead(t, "T", "B")
	b, _ := writable(t, f, console.Inbox{Inbox: in})
	id := b.get("/inboxes/console-none/rejected").rowIDs("rejected")[0]
	m := b.get("/inboxes/console-none/rejected/" + id)
	assert.NotContains(t, m.body, `id="replay"`)
	assert.NotContains(t, m.body, `id="resend"`)
	ev := b.get("/stores/s/dead-letters") // a page with a form token
	tok := ev.csrfOrEmpty()
	require.NotEmpty(t, tok)
	for _, a := range []string{"replay", "resend"} {
		p := b.post("/inboxes/console-none/rejected/"+id+"/"+a, url.Values{"csrf": {tok}, "confirm": {"yes"}})
		assert.Equal(t, http.StatusNotFound, p.status, a)
	}
	assert.Len(t, b.get("/inboxes/console-none/rejected").rowIDs("rejected"), 1)
}

// A replay whose handler fails changes nothing: the error is shown, the rejected row stays,
// and the audit record has the error.
func TestReplayThatFailsKeepsTheMessage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	in := newInbox(t, f.db, "console-replay-fails")
	reject(t, in, "PAID", "F-1", []byte(`{}`), "no such order")
	b, log := writable(t, f, console.Inbox{Inbox: in, Replay: func(context.Context, *sql.Tx, *inbox.Message) error {
		return fmt.Errorf("still no such order")
	}})
	id := b.get("/inboxes/console-replay-fails/rejected").rowIDs("rejected")[0]
	path := "/inboxes/console-replay-fails/rejected/" + id
	m := b.get(path)
	p := b.post(path+"/replay", url.Values{"csrf": {m.csrf(t)}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusInternalServerError, p.status)
	assert.Contains(t, p.body, `id="error"`)
	assert.Contains(t, p.body, "still no such order")
	assert.Equal(t, []string{id}, b.get("/inboxes/console-replay-fails/rejected").rowIDs("rejected"))
	recs := log.all()
	require.Len(t, recs, 1)
	assert.Equal(t, "error", recs[0]["outcome"])
	assert.Contains(t, recs[0]["error"], "still no such order")
	assert.Equal(t, "0", recs[0]["rows"])
}

// The rejected messages page by id, oldest first, without overlap.
func TestRejectedPageByID(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	in := newInbox(t, f.db, "console-paged")
	var want []string
	for i := range 5 {
		want = append(want, reject(t, in, "T", fmt.Sprintf("P-%d", i), []byte(`{}`), "nope"))
	}
	b, _ := newConsole(t, console.Config{Inboxes: []console.Inbox{{Inbox: in}}, PageSize: 2})
	var got []string
	path, pages := "/inboxes/console-paged/rejected", 0
	for path != "" && pages < 5 {
		p := b.get(path)
		require.Equal(t, http.StatusOK, p.status, p.body)
		for _, id := range p.rowIDs("rejected") {
			m := b.get("/inboxes/console-paged/rejected/" + id)
			require.Equal(t, http.StatusOK, m.status)
			for _, eventID := range want {
				if strings.Contains(m.body, eventID) {
					got = append(got, eventID)
				}
			}
		}
		path = p.next()
		pages++
	}
	assert.Equal(t, 3, pages)
	assert.Equal(t, want, got, "every message once, oldest first")
}

// A database that stops answering: the store's pages answer 500 with the error, the
// overview shows it in the store's row (one store down hides no other), and an action
// changes nothing, its audit record saying so.
func TestDatabaseDownChangesNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{})
	id := f.dead(t, "PAID", "DOWN-1")
	down := testsvc.OpenDB(t) // a pool of its own, closed below: a database gone for the console
	store, err := outbox.NewMySQLStore(down, outbox.MySQLConfig{Table: f.table})
	require.NoError(t, err)
	b, log := newConsole(t, console.Config{Stores: []console.Store{{Name: "s", Store: store}}, AllowWrites: true})
	path := fmt.Sprintf("/stores/s/events/%d", id)
	ev := b.get(path)
	require.Equal(t, http.StatusOK, ev.status, ev.body)
	csrf := ev.csrf(t)

	require.NoError(t, down.Close())
	home := b.get("/")
	assert.Equal(t, http.StatusOK, home.status)
	assert.Contains(t, home.body, "database is closed", "the store's row says why")
	for _, p := range []string{"/stores/s", "/stores/s/dead-letters", path, "/stores/s/blocked"} {
		pg := b.get(p)
		assert.Equal(t, http.StatusInternalServerError, pg.status, p)
		assert.Contains(t, pg.body, `id="error"`, p)
	}
	p := b.post(path+"/requeue", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	assert.Equal(t, http.StatusInternalServerError, p.status)
	assert.Equal(t, outbox.StatusFail, f.status(t, id), "nothing changed")
	recs := log.all()
	require.NotEmpty(t, recs)
	last := recs[len(recs)-1]
	assert.Equal(t, "error", last["outcome"])
	assert.Equal(t, "0", last["rows"])
	assert.NotEmpty(t, last["error"])
}

// A dead letter requeued to another topic of its store: the event page offers the store's
// topics, the confirmation names the one chosen, the confirmed requeue writes it on the row,
// and the audit record names it; a topic outside the store's set is refused (400) and
// changes nothing. Once requeued, its old error shows as an earlier attempt's, not in red.
func TestRequeueToAnotherTopic(t *testing.T) {
	t.Parallel()
	f := newFixture(t, outbox.MySQLConfig{Routes: outbox.Routes{Topics: []string{"PAY", "SHIP"}}})
	id := f.dead(t, "ORDER_PAID", "B-1")
	b, log := writable(t, f)
	path := fmt.Sprintf("/stores/s/events/%d", id)
	ev := b.get(path)
	require.Equal(t, http.StatusOK, ev.status, ev.body)
	for _, topic := range []string{"ORDER_EVENT_TOPIC", "PAY", "SHIP"} {
		assert.Contains(t, ev.body, `<option value="`+topic+`"`, "the store's topics are offered")
	}
	assert.Contains(t, ev.body, `class="err" id="last-error"`, "a dead letter's error is its state")

	bad := b.post(path+"/requeue", url.Values{"csrf": {ev.csrf(t)}, "topic": {"PAYY"}})
	assert.Equal(t, http.StatusBadRequest, bad.status, bad.body)
	assert.Contains(t, bad.body, "ORDER_EVENT_TOPIC, PAY, SHIP")
	assert.Equal(t, outbox.StatusFail, f.status(t, id))

	conf := b.post(path+"/requeue", url.Values{"csrf": {ev.csrf(t)}, "topic": {"PAY"}})
	require.Equal(t, http.StatusOK, conf.status, conf.body)
	assert.Contains(t, conf.body, "to topic PAY")
	done := b.post(path+"/requeue", url.Values{"csrf": {conf.csrf(t)}, "confirm": {"yes"}, "topic": {"PAY"}})
	require.Equal(t, http.StatusOK, done.status, done.body)
	assert.Contains(t, done.body, "requeued to topic PAY")
	got, err := outbox.NewAdmin(f.store).Get(context.Background(), id)
	require.NoError(t, err)
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Equal(t, "PAY", got.Topic)
	assert.Contains(t, done.body, `<td id="topic">PAY</td>`)
	assert.NotContains(t, done.body, `class="err" id="last-error"`, "the old error is no longer shown as its state")
	assert.Contains(t, done.body, "of an earlier attempt")

	recs := log.all()
	require.Len(t, recs, 3)
	for _, r := range recs[1:] {
		assert.Equal(t, "PAY", r["topic"], "the audit names the topic")
	}
	assert.Equal(t, "PAYY", recs[0]["topic"], "and the refused one's")
}
