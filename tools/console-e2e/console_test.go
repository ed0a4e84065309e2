package consolee2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/inbox"
)

// An operator opens the console in a browser, finds the dead letter from the overview,
// reads it and requeues it with two clicks (the button, then the confirmation); the
// publisher sends it through the real broker, a real consumer receives it with its event
// id, and the console then shows it SUCCESS. On the way: the store's overview, the key it
// blocks (the table publishes in key order: the two later events of its order wait behind
// it, and follow it once it is requeued), and an inbox's rejected message, replayed by a
// click. Each page is photographed for docs/console.md (ScreenshotsEnv).
func TestConsoleRequeueByClickDeliversThroughRocketMQ(t *testing.T) {
	f := newFixture(t, outbox.KeyOrder, true)
	// The broker refuses the order's first event for good: it is dead-lettered at once, and
	// the order's later events wait behind it.
	f.faulty.Refuse(func(ev outbox.Event) bool { return ev.BizNo == "ORD-1001" && ev.EventType == "ORDER_CREATED" })
	ids := f.insert(t,
		outbox.EventInput{BizNo: "ORD-1001", EventType: "ORDER_CREATED", Payload: []byte(`{"order":"ORD-1001","customer":"C-77","total":{"amount":"129.90","currency":"EUR"},"lines":[{"sku":"BK-204","qty":2},{"sku":"MG-011","qty":1}]}`)},
		outbox.EventInput{BizNo: "ORD-1001", EventType: "ORDER_PAID", Payload: []byte(`{"order":"ORD-1001","payment":"PAY-5531"}`)},
		outbox.EventInput{BizNo: "ORD-1001", EventType: "ORDER_SHIPPED", Payload: []byte(`{"order":"ORD-1001","parcel":"PX-88120"}`)},
		outbox.EventInput{BizNo: "ORD-1002", EventType: "ORDER_CREATED", Payload: []byte(`{"order":"ORD-1002","customer":"C-12"}`)},
		outbox.EventInput{BizNo: "ORD-1003", EventType: "ORDER_CREATED", Payload: []byte(`{"order":"ORD-1003","customer":"C-31"}`)},
	)
	f.start(t)
	dead := f.waitStatus(t, ids[0], outbox.StatusFail)
	f.waitStatus(t, ids[3], outbox.StatusSuccess)
	f.waitStatus(t, ids[4], outbox.StatusSuccess)
	got := f.waitDelivered(t, ids[3], ids[4])
	for _, id := range ids[:3] {
		if got[id] != 0 {
			t.Fatalf("event %s of the blocked order reached the consumer before the requeue", id)
		}
	}
	// From here on the broker takes every event.
	f.faulty.Reset()

	// An inbox that rejected a message the consumer received: its handler refused it for
	// good, as a service's would.
	in := f.newInbox(t, "points-service")
	var msg *inbox.Message
	for _, m := range f.consumer.Messages() {
		if m.GetProperty("eventId") == ids[3] {
			msg = &inbox.Message{EventID: ids[3], EventType: m.GetTags(), BizNo: m.GetKeys(), Body: m.Body,
				Properties: m.GetProperties(), Topic: m.Topic, MsgID: m.MsgId, Deliveries: 1, BornAt: time.UnixMilli(m.BornTimestamp)}
		}
	}
	if msg == nil {
		t.Fatal("the consumer kept no message of event " + ids[3])
	}
	refuse := func(context.Context, *sql.Tx, *inbox.Message) error {
		return outbox.Permanent(errors.New("customer C-12 has no points account: open one, then replay"))
	}
	if o, err := in.Handle(context.Background(), msg, refuse); err != nil || o != inbox.Rejected {
		t.Fatalf("the inbox's handler refused the message: outcome %v, %v; want rejected", o, err)
	}
	replayed := 0
	base := f.serve(t, console.Config{
		Stores:      []console.Store{f.storeConfig("orders")},
		Inboxes:     []console.Inbox{{Inbox: in, Replay: func(context.Context, *sql.Tx, *inbox.Message) error { replayed++; return nil }}},
		AllowWrites: true,
	})

	b := newBrowser(t, 5*time.Minute)
	b.open(base)
	b.shot("overview")
	if got := b.text(`stores`); !strings.Contains(got, "orders") {
		t.Fatalf("the overview's stores read %q, without the store orders", got)
	}
	b.clickCSS(`#stores tr[data-store="orders"] a`)
	b.shot("store")
	if got := b.text("count-fail"); got != "1" {
		t.Fatalf("the store's overview counts %q dead letters, want 1", got)
	}
	if got := b.text("count-wait"); got != "2" {
		t.Fatalf("the store's overview counts %q WAIT events, want 2 (those the dead letter holds back)", got)
	}

	b.click("nav-blocked")
	row := fmt.Sprintf(`#blocked tr[data-id="%d"]`, dead.ID)
	if !b.has(row) {
		t.Fatalf("the blocked keys page has no row for dead letter %d:\n%s", dead.ID, b.bodyText())
	}
	if got := eval[string](b, fmt.Sprintf(`document.querySelector(%q).innerText`, row)); !strings.Contains(got, "ORD-1001") || !strings.Contains(got, "2") {
		t.Fatalf("the blocked key's row reads %q, want its biz no ORD-1001 and the 2 events waiting", got)
	}
	b.shot("blocked")

	b.click("nav-dead-letters")
	row = fmt.Sprintf(`#events tr[data-id="%d"]`, dead.ID)
	if !b.has(row) {
		t.Fatalf("the dead letters page has no row for %d:\n%s", dead.ID, b.bodyText())
	}
	b.shot("dead-letters")
	b.clickCSS(row + ` a`)
	if got := b.text("status"); got != "FAIL" {
		t.Fatalf("the event page shows status %q, want FAIL", got)
	}
	if got := b.text("payload"); !strings.Contains(got, `"currency": "EUR"`) {
		t.Fatalf("the payload is not shown pretty-printed: %q", got)
	}
	if got := b.text("last-error"); !strings.Contains(got, "refused") {
		t.Fatalf("the event page's last error reads %q, want the broker's refusal", got)
	}
	if got := b.text("properties"); !strings.Contains(got, dead.EventID) {
		t.Fatalf("the event's properties %q do not carry its event id %s", got, dead.EventID)
	}
	eventPage := b.location()
	b.shot("event")

	b.click("requeue")
	if !b.has("#cancel") {
		t.Fatal("the confirmation page offers no way back (#cancel)")
	}
	b.shot("confirm")
	if got := f.get(t, dead.EventID).Status; got != outbox.StatusFail {
		t.Fatalf("the event is %s before the confirmation, want still FAIL", got)
	}
	b.click("confirm")
	if got := b.text("flash"); got == "" {
		t.Fatal("the page after the requeue shows an empty flash message")
	}
	b.shot("requeued")

	// Delivered through the broker: the dead letter, then the two events it held back.
	f.waitDelivered(t, ids[0], ids[1], ids[2])
	f.waitStatus(t, ids[2], outbox.StatusSuccess)
	deadline := time.Now().Add(waitFor)
	for {
		b.open(eventPage)
		s := b.text("status")
		if s == "SUCCESS" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event page still shows %s %s after the delivery", s, waitFor)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if b.has("#requeue") {
		t.Fatal("the page of an event sent offers a requeue")
	}
	audited := false
	for _, r := range f.audit.Records() {
		if strings.Contains(fmt.Sprint(r), "requeue") && strings.Contains(fmt.Sprint(r), "e2e-operator") {
			audited = true
		}
	}
	if !audited {
		t.Fatalf("no audit record names the requeue and its operator: %v", f.audit.Records())
	}

	// The inbox's rejected message, read and replayed.
	b.open(base)
	b.clickCSS(`#inboxes tr[data-group="points-service"] a`)
	rej, err := in.RejectedByEventID(context.Background(), ids[3])
	if err != nil {
		t.Fatalf("the inbox's rejected message: %v", err)
	}
	row = fmt.Sprintf(`#rejected tr[data-id="%d"]`, rej.ID)
	if !b.has(row) {
		t.Fatalf("the rejected list has no row for %d:\n%s", rej.ID, b.bodyText())
	}
	b.shot("rejected")
	b.clickCSS(row + ` a`)
	if got := b.text("reason"); !strings.Contains(got, "no points account") {
		t.Fatalf("the rejected message's reason reads %q", got)
	}
	b.shot("rejected-message")
	b.click("replay")
	b.click("confirm")
	if got := b.text("flash"); got == "" {
		t.Fatal("the page after the replay shows an empty flash message")
	}
	if replayed != 1 {
		t.Fatalf("the replay ran the handler %d times, want 1", replayed)
	}
	if _, err := in.RejectedByEventID(context.Background(), ids[3]); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("the rejected message is still kept after its replay: %v", err)
	}
	if d := b.Dialogs(); len(d) != 0 {
		t.Fatalf("the console opened dialogs: %q", d)
	}
}

// Every dead letter a filter selects is requeued by one confirmed click, after a dry run
// that counts them; those it does not select stay dead letters. The requeued ones reach
// the real consumer.
func TestConsoleBulkRequeueAfterADryRun(t *testing.T) {
	f := newFixture(t, outbox.Unordered, true)
	f.faulty.Refuse(nil) // the broker refuses everything at first
	declined := f.insert(t,
		outbox.EventInput{BizNo: "ORD-2001", EventType: "PAYMENT_DECLINED", Payload: []byte(`{"order":"ORD-2001","code":"05"}`)},
		outbox.EventInput{BizNo: "ORD-2002", EventType: "PAYMENT_DECLINED", Payload: []byte(`{"order":"ORD-2002","code":"51"}`)},
		outbox.EventInput{BizNo: "ORD-2003", EventType: "PAYMENT_DECLINED", Payload: []byte(`{"order":"ORD-2003","code":"05"}`)},
	)
	other := f.insert(t, outbox.EventInput{BizNo: "ORD-2004", EventType: "REFUND_FAILED", Payload: []byte(`{"order":"ORD-2004"}`)})[0]
	f.start(t)
	for _, id := range append(declined, other) {
		f.waitStatus(t, id, outbox.StatusFail)
	}
	f.faulty.Reset()
	base := f.serve(t, console.Config{Stores: []console.Store{f.storeConfig("payments")}, AllowWrites: true})

	b := newBrowser(t, 5*time.Minute)
	b.open(base + "stores/payments/dead-letters")
	b.do("filter by event type", chromedp.SetValue(chromedp.CSS(`#filter input[name="type"]`), "PAYMENT_DECLINED"))
	b.click("apply")
	if n := eval[int](b, `document.querySelectorAll("#events tbody tr").length`); n != 3 {
		t.Fatalf("the filtered list shows %d dead letters, want 3:\n%s", n, b.bodyText())
	}
	b.click("requeue-all")
	if got := b.text("question"); !strings.Contains(got, "3") {
		t.Fatalf("the dry run's question reads %q, without the count 3", got)
	}
	b.shot("confirm-bulk")
	for _, id := range declined {
		if s := f.get(t, id).Status; s != outbox.StatusFail {
			t.Fatalf("event %s is %s after the dry run, want still FAIL", id, s)
		}
	}
	b.click("confirm")
	if got := b.text("flash"); !strings.Contains(got, "3") {
		t.Fatalf("the flash message after the bulk requeue reads %q, without the count 3", got)
	}
	f.waitDelivered(t, declined...)
	for _, id := range declined {
		f.waitStatus(t, id, outbox.StatusSuccess)
	}
	if s := f.get(t, other).Status; s != outbox.StatusFail {
		t.Fatalf("the dead letter the filter did not select is %s, want still FAIL", s)
	}
	if n := f.consumer.Deliveries()[other]; n != 0 {
		t.Fatalf("the dead letter the filter did not select reached the consumer %d times", n)
	}
}

// A read-only console shows no button anywhere, and refuses a POST forged from the page
// (fetch, with no token): the dead letter stays as it is. A writable console refuses the
// same forged POST for its missing CSRF token.
func TestConsoleReadOnlyAndForgedPosts(t *testing.T) {
	f := newFixture(t, outbox.Unordered, false)
	f.faulty.Refuse(nil)
	id := f.insert(t, outbox.EventInput{BizNo: "ORD-3001", EventType: "ORDER_CREATED", Payload: []byte(`{"order":"ORD-3001"}`)})[0]
	f.start(t)
	dead := f.waitStatus(t, id, outbox.StatusFail)
	// An inbox with a rejected message, replay and resend offered, to a writable console.
	in := f.newInbox(t, "points-service")
	msg := &inbox.Message{EventID: dead.EventID, EventType: dead.EventType, BizNo: dead.BizNo, Body: dead.Payload, Deliveries: 1}
	if o, err := in.Handle(context.Background(), msg, func(context.Context, *sql.Tx, *inbox.Message) error {
		return outbox.Permanent(errors.New("refused"))
	}); err != nil || o != inbox.Rejected {
		t.Fatalf("the inbox's handler refused the message: outcome %v, %v; want rejected", o, err)
	}
	rej, err := in.RejectedByEventID(context.Background(), dead.EventID)
	if err != nil {
		t.Fatalf("the inbox's rejected message: %v", err)
	}
	offered := console.Inbox{Inbox: in, Replay: func(context.Context, *sql.Tx, *inbox.Message) error { return nil }, Sender: f.faulty}
	ro := f.serve(t, console.Config{Stores: []console.Store{f.storeConfig("orders")}, Inboxes: []console.Inbox{offered}})
	rw := f.serve(t, console.Config{Stores: []console.Store{f.storeConfig("orders")}, Inboxes: []console.Inbox{offered}, AllowWrites: true})
	buttons := `#requeue, #skip, #requeue-all, #skip-all, #replay, #resend, #confirm, form[method="post"]`

	b := newBrowser(t, 5*time.Minute)
	event := fmt.Sprintf("stores/orders/events/%d", dead.ID)
	rejected := fmt.Sprintf("inboxes/points-service/rejected/%d", rej.ID)
	b.open(rw + rejected)
	if !b.has("#replay") || !b.has("#resend") {
		t.Fatal("the writable console's rejected message offers no replay or resend")
	}
	for _, page := range []string{"", "stores/orders", "stores/orders/dead-letters", event, "stores/orders/blocked", "inboxes/points-service/rejected", rejected} {
		b.open(ro + page)
		if b.has(buttons) {
			t.Fatalf("the read-only page %s shows a button or a form that posts", ro+page)
		}
		if !b.has("#read-only") {
			t.Fatalf("the read-only page %s does not say it is read-only", ro+page)
		}
	}
	b.open(ro + event)
	for _, action := range []string{"requeue", "skip"} {
		if code := b.post(ro+event+"/"+action, "confirm=yes"); code != 403 {
			t.Fatalf("the read-only console answered a forged POST %s with %d, want 403", action, code)
		}
	}
	if code := b.post(ro+"stores/orders/dead-letters/requeue", "confirm=yes"); code != 403 {
		t.Fatalf("the read-only console answered a forged bulk requeue with %d, want 403", code)
	}
	for _, action := range []string{"replay", "resend"} {
		if code := b.post(ro+rejected+"/"+action, "confirm=yes"); code != 403 {
			t.Fatalf("the read-only console answered a forged POST %s with %d, want 403", action, code)
		}
	}
	if _, err := in.RejectedByEventID(context.Background(), dead.EventID); err != nil {
		t.Fatalf("after the forged POSTs the rejected message is gone: %v", err)
	}

	b.open(rw + event)
	if !b.has("#requeue") {
		t.Fatal("the writable console's event page shows no requeue button")
	}
	for _, form := range []string{"confirm=yes", "confirm=yes&csrf=forged"} {
		if code := b.post(rw+event+"/requeue", form); code != 403 {
			t.Fatalf("the writable console answered a POST without a valid token (%s) with %d, want 403", form, code)
		}
	}
	if s := f.get(t, id).Status; s != outbox.StatusFail {
		t.Fatalf("after the forged POSTs the event is %s, want still FAIL", s)
	}
	// The same POST with the token of the page's own form is taken: it answers the
	// confirmation page (no confirm=yes), so the refusals above were the token's.
	token := eval[string](b, `document.querySelector('input[name="csrf"]').value`)
	if code := b.post(rw+event+"/requeue", "csrf="+url.QueryEscape(token)); code != 200 {
		t.Fatalf("the writable console answered a POST with the page's own token with %d, want 200 (the confirmation page)", code)
	}
	// The read-only console refuses it even with a token.
	b.open(ro + event)
	if code := b.post(ro+event+"/requeue", "confirm=yes&csrf="+url.QueryEscape(token)); code != 403 {
		t.Fatalf("the read-only console answered a POST with a token with %d, want 403", code)
	}
	if s := f.get(t, id).Status; s != outbox.StatusFail {
		t.Fatalf("after the POSTs the event is %s, want still FAIL", s)
	}
	if d := b.Dialogs(); len(d) != 0 {
		t.Fatalf("the console opened dialogs: %q", d)
	}
}

// Markup in a biz no and a payload shows as text, in the list, on the event page and in a
// filter's value: no element of it is made, no script of it runs (the window variables it
// would set stay undefined, no dialog opens).
func TestConsoleShowsMarkupAsText(t *testing.T) {
	f := newFixture(t, outbox.Unordered, false)
	f.faulty.Refuse(nil)
	const (
		bizNo   = `<script>window.pwnedBiz=1</script>`
		payload = `{"note":"<script>window.pwnedPayload=1</script><img src=x onerror=\"window.pwnedImg=1;alert(1)\">"}`
	)
	id := f.insert(t, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(payload)})[0]
	f.start(t)
	dead := f.waitStatus(t, id, outbox.StatusFail)
	base := f.serve(t, console.Config{Stores: []console.Store{f.storeConfig("orders")}, AllowWrites: true})

	b := newBrowser(t, 5*time.Minute)
	noScript := func(where string) {
		t.Helper()
		for _, v := range []string{"pwnedBiz", "pwnedPayload", "pwnedImg", "pwnedFilter"} {
			if got := eval[string](b, "typeof window."+v); got != "undefined" {
				t.Fatalf("%s: window.%s is %s: markup ran as script", where, v, got)
			}
		}
		if n := eval[int](b, `document.querySelectorAll("main script, body script:not([src]), img[src=x]").length`); n != 0 {
			t.Fatalf("%s: %d elements were made from the markup", where, n)
		}
		if d := b.Dialogs(); len(d) != 0 {
			t.Fatalf("%s: dialogs opened: %q", where, d)
		}
	}
	b.open(base + "stores/orders/dead-letters")
	if got := b.text("events"); !strings.Contains(got, bizNo) {
		t.Fatalf("the dead letters list does not show the biz no as text:\n%s", got)
	}
	noScript("the dead letters list")
	b.clickCSS(fmt.Sprintf(`#events tr[data-id="%d"] a`, dead.ID))
	if got := b.text("payload"); !strings.Contains(got, `<script>window.pwnedPayload=1</script>`) || !strings.Contains(got, `onerror=`) {
		t.Fatalf("the event page does not show the payload's markup as text:\n%s", got)
	}
	if got := b.text("event"); !strings.Contains(got, bizNo) {
		t.Fatalf("the event page does not show the biz no as text:\n%s", got)
	}
	noScript("the event page")
	b.open(base + "stores/orders/dead-letters?biz=" + url.QueryEscape(`"><script>window.pwnedFilter=1</script>`))
	if got := eval[string](b, `document.querySelector('#filter input[name="biz"]').value`); got != `"><script>window.pwnedFilter=1</script>` {
		t.Fatalf("the filter's biz no input holds %q, want the value as given", got)
	}
	noScript("a hostile filter")
}
