package consolee2e

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/outboxtest"
)

// ScreenshotsEnv, set to 1, makes the tests write their screenshots of the console's pages
// to docs/console/ (off by default, so that a test run leaves the tree as it was):
//
//	OUTBOX_CONSOLE_SCREENSHOTS=1 go -C tools test -race -count=1 -run Console ./console-e2e/
const ScreenshotsEnv = "OUTBOX_CONSOLE_SCREENSHOTS"

// waitFor bounds every wait of these tests for the publisher, the broker or the console:
// far longer than any of them takes, so that a slow machine is not a failure.
const waitFor = 2 * time.Minute

// fixture is one outbox table with a publisher on it, sending through a faulty sender that
// wraps a real sender: RocketMQ's (with a real consumer on a topic of its own) when the test
// needs delivery, a memory sender when it only needs dead letters.
type fixture struct {
	db       *sql.DB
	store    *outbox.MySQLStore
	admin    *outbox.Admin
	faulty   *outboxtest.FaultySender
	rocketmq *outbox.RocketMQConfig   // nil without the broker
	consumer *testsvc.Consumer        // nil without the broker
	pub      *outbox.Publisher        // nil until start
	lease    time.Duration            // the publisher's
	audit    *auditLog                // the console's audit records
	inbox    *inbox.Inbox             // nil until newInbox
	memory   *outboxtest.MemorySender // nil with the broker
}

// newFixture makes a fresh table t_e2e_* with ordering, and a sender over the real broker
// when broker is true.
func newFixture(t *testing.T, ordering outbox.Ordering, broker bool) *fixture {
	t.Helper()
	db := testsvc.OpenDB(t)
	routes := outbox.Routes{Topic: "OUTBOX_CONSOLE_E2E"}
	if broker {
		routes.Topic = testsvc.NewTopic(t, "OUTBOX_CONSOLE_E2E")
	}
	f := &fixture{
		db:    db,
		store: testsvc.NewStore(t, db, outbox.MySQLConfig{Table: testsvc.UniqueTable("t_e2e"), Ordering: ordering, Routes: routes}),
		lease: 30 * time.Second,
		audit: &auditLog{},
	}
	f.admin = outbox.NewAdmin(f.store)
	var inner outbox.Sender
	if broker {
		topic := routes.Topic
		f.consumer = testsvc.Consume(t, topic)
		f.rocketmq = &outbox.RocketMQConfig{
			NameServers: []string{testsvc.RocketMQNameServer(t)},
			GroupName:   testsvc.UniqueTable("pg_console"),
		}
		s, err := outbox.NewRocketMQSender(*f.rocketmq)
		if err != nil {
			t.Fatalf("new RocketMQ sender: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("close the RocketMQ sender: %v", err)
			}
		})
		inner = s
	} else {
		f.memory = outboxtest.NewMemorySender()
		inner = f.memory
	}
	f.faulty = outboxtest.NewFaultySender(inner)
	return f
}

// start starts the publisher; it is closed when t ends (before the sender it wraps).
func (f *fixture) start(t *testing.T) {
	t.Helper()
	p, err := outbox.NewPublisher(f.store, f.faulty, outbox.Config{
		PollInterval: 100 * time.Millisecond,
		MaxAttempts:  1,
		Logger:       slog.New(slog.DiscardHandler),
		Tuning:       outbox.Tuning{Lease: f.lease, ReclaimInterval: time.Second},
	})
	if err != nil {
		t.Fatalf("new publisher: %v", err)
	}
	if err := p.Start(context.Background()); err != nil {
		t.Fatalf("start the publisher: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close the publisher: %v", err)
		}
	})
	f.pub = p
}

// insert commits evs in one transaction and returns their event ids, in order.
func (f *fixture) insert(t *testing.T, evs ...outbox.EventInput) []string {
	t.Helper()
	ctx := context.Background()
	tx, err := f.store.BeginTx(ctx, nil)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback() }()
	ids := make([]string, len(evs))
	for i, ev := range evs {
		if ids[i], err = tx.InsertEvent(ctx, ev); err != nil {
			t.Fatalf("insert %+v: %v", ev, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
	return ids
}

// get reads the event eventID.
func (f *fixture) get(t *testing.T, eventID string) outbox.Event {
	t.Helper()
	ev, err := f.admin.GetByEventID(context.Background(), eventID)
	if err != nil {
		t.Fatalf("read event %s: %v", eventID, err)
	}
	return ev
}

// waitStatus waits until the event eventID has status want, and returns it.
func (f *fixture) waitStatus(t *testing.T, eventID string, want outbox.Status) outbox.Event {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		ev := f.get(t, eventID)
		if ev.Status == want {
			return ev
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s (%s, %s) is %s after %s, want %s (last error %q)", eventID, ev.BizNo, ev.EventType, ev.Status, waitFor, want, ev.LastError)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitDelivered waits until the real consumer has received a message whose eventId property
// is each of eventIDs, and returns how often each arrived.
func (f *fixture) waitDelivered(t *testing.T, eventIDs ...string) map[string]int {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		got, missing := f.consumer.Deliveries(), 0
		for _, id := range eventIDs {
			if got[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events did not reach the consumer within %s (it received %v)", missing, len(eventIDs), waitFor, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// storeConfig is the console's view of the fixture's table, named name.
func (f *fixture) storeConfig(name string) console.Store {
	return console.Store{Name: name, Store: f.store, Lease: f.lease, RocketMQ: f.rocketmq}
}

// newInbox makes an inbox of group on fresh tables (dropped when t ends).
func (f *fixture) newInbox(t *testing.T, group string) *inbox.Inbox {
	t.Helper()
	table := testsvc.UniqueTable("t_e2e_inbox")
	in, err := inbox.New(f.db, inbox.Config{Group: group, Table: table, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("new inbox: %v", err)
	}
	ctx := context.Background()
	if err := in.CreateSchema(ctx); err != nil {
		t.Fatalf("create the inbox's tables: %v", err)
	}
	t.Cleanup(func() {
		for _, name := range []string{table, table + "_rejected"} {
			if _, err := f.db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+name+"`"); err != nil {
				t.Errorf("drop table %s: %v", name, err)
			}
		}
	})
	f.inbox = in
	return in
}

// serve mounts a console of cfg (its Prefix "/ops/outbox/" unless set) on a loopback server
// of t's own, below that prefix as a service would mount it, and returns the console's URL.
// The audit records go to the fixture's log.
func (f *fixture) serve(t *testing.T, cfg console.Config) string {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = "/ops/outbox/"
	}
	cfg.Logger = slog.New(f.audit)
	cfg.User = func(*http.Request) string { return "e2e-operator" }
	h, err := console.New(cfg)
	if err != nil {
		t.Fatalf("console.New: %v", err)
	}
	mux := http.NewServeMux()
	mux.Handle(cfg.Prefix, h)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "the service's own page: "+r.URL.Path, http.StatusNotFound)
	})
	srv := httptest.NewServer(mux) // 127.0.0.1
	t.Cleanup(srv.Close)
	return srv.URL + cfg.Prefix
}

// auditLog is a slog handler keeping the console's audit records.
type auditLog struct {
	mu      sync.Mutex
	records []map[string]string
}

func (a *auditLog) Enabled(context.Context, slog.Level) bool { return true }
func (a *auditLog) WithAttrs([]slog.Attr) slog.Handler       { return a }
func (a *auditLog) WithGroup(string) slog.Handler            { return a }
func (a *auditLog) Handle(_ context.Context, r slog.Record) error {
	rec := map[string]string{"msg": r.Message, "level": r.Level.String()}
	r.Attrs(func(at slog.Attr) bool {
		rec[at.Key] = at.Value.String()
		return true
	})
	a.mu.Lock()
	defer a.mu.Unlock()
	a.records = append(a.records, rec)
	return nil
}

// Records returns the records so far.
func (a *auditLog) Records() []map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]map[string]string(nil), a.records...)
}

// shot writes the tab's viewport as docs/console/name.png when ScreenshotsEnv is 1.
func (b *tab) shot(name string) {
	b.t.Helper()
	if os.Getenv(ScreenshotsEnv) != "1" {
		return
	}
	// The page is scrolled to its top, so that each picture starts with the page's title.
	b.do("scroll to the top", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	png := b.screenshot()
	dir := filepath.Join("..", "..", "docs", "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	file := filepath.Join(dir, name+".png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	b.t.Logf("wrote %s (%d bytes)", file, len(png))
}

// clickCSS clicks the first element matching the CSS selector sel and waits for the page
// it leads to, which must answer 200.
func (b *tab) clickCSS(sel string) {
	b.t.Helper()
	resp, err := chromedp.RunResponse(b.ctx, chromedp.Click(chromedp.CSS(sel), chromedp.NodeVisible))
	if err != nil {
		b.t.Fatalf("click %s on %s: %v", sel, b.location(), err)
	}
	if resp == nil || resp.Status != 200 {
		b.t.Fatalf("click %s: the page it led to (%s) answered %s, want 200", sel, b.location(), status(resp))
	}
}

// bodyText is the page's visible text.
func (b *tab) bodyText() string {
	b.t.Helper()
	return eval[string](b, `document.body.innerText`)
}

// post sends a POST of form (URL-encoded) to url from the page with fetch, as a script on
// the page could, without following a redirect, and returns the answer's status (0 for a
// redirect, which fetch hides as an opaque response).
func (b *tab) post(url, form string) int {
	b.t.Helper()
	return eval[int](b, fmt.Sprintf(`fetch(%q, {method: "POST", redirect: "manual",
		headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: %q}).then(r => r.status)`, url, form))
}
