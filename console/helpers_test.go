package console_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/console"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/inbox/inboxtest"
	"github.com/go-outbox/outbox/internal/testsvc"
)

func TestMain(m *testing.M) { os.Exit(testsvc.RunWithLeakCheck(m)) }

// fixture is a fresh outbox table (and, when asked, an inbox) on the test database.
type fixture struct {
	db    *sql.DB
	store *outbox.MySQLStore
	table string
	admin *outbox.Admin
}

func newFixture(t *testing.T, cfg outbox.MySQLConfig) *fixture {
	t.Helper()
	db := testsvc.OpenDB(t)
	cfg.Table = testsvc.UniqueTable("t_console")
	store := testsvc.NewStore(t, db, cfg)
	return &fixture{db: db, store: store, table: cfg.Table, admin: outbox.NewAdmin(store)}
}

// insert commits one event through the library and returns its row id.
func (f *fixture) insert(t testing.TB, eventType, bizNo string, payload []byte) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := f.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	eventID, err := tx.InsertEvent(ctx, outbox.EventInput{EventType: eventType, BizNo: bizNo, Payload: payload})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	ev, err := f.admin.GetByEventID(ctx, eventID)
	require.NoError(t, err)
	return ev.ID
}

// kill makes the event a dead letter as a publisher leaves one: FAIL, its last error and
// one failure in its history. (The console itself runs no SQL; the test sets the scene.)
func (f *fixture) kill(t testing.TB, id int64, lastError string) {
	t.Helper()
	_, err := f.db.Exec("UPDATE `"+f.table+"` SET status = 'FAIL', retry_count = 3, claim_owner = 'pub-1', claimed_at = UTC_TIMESTAMP(3), "+
		"last_error = ?, failures = CONCAT('\\n', JSON_OBJECT('at', CAST(UTC_TIMESTAMP(3) AS CHAR), 'instance', 'pub-1', "+
		"'class', 'permanent', 'message', ?)) WHERE id = ?", lastError, lastError, id)
	require.NoError(t, err)
}

// dead inserts and kills an event, returning its id.
func (f *fixture) dead(t testing.TB, eventType, bizNo string) int64 {
	t.Helper()
	id := f.insert(t, eventType, bizNo, []byte(`{"order":1}`))
	f.kill(t, id, "broker refused: no route")
	return id
}

func (f *fixture) status(t testing.TB, id int64) outbox.Status {
	t.Helper()
	ev, err := f.admin.Get(context.Background(), id)
	require.NoError(t, err)
	return ev.Status
}

// newInbox makes an inbox of its own tables on db, dropped when t ends.
func newInbox(t *testing.T, db *sql.DB, group string) *inbox.Inbox {
	t.Helper()
	table := testsvc.UniqueTable("t_console_in")
	in, err := inbox.New(db, inbox.Config{Group: group, Table: table, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(context.Background()))
	t.Cleanup(func() {
		_, _ = db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`")
	})
	return in
}

// reject records a message of a new event as rejected by the group, returning its event id.
func reject(t *testing.T, in *inbox.Inbox, eventType, bizNo string, body []byte, why string) string {
	t.Helper()
	eventID := uuid.Must(uuid.NewV7()).String()
	msg := inboxtest.Message(outbox.Event{EventID: eventID, EventType: eventType, BizNo: bizNo, Payload: body})
	o, err := in.Handle(context.Background(), msg, func(context.Context, *sql.Tx, *inbox.Message) error {
		return outbox.Permanent(errors.New(why))
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Rejected, o)
	return eventID
}

// auditLog captures the audit records.
type auditLog struct {
	mu      sync.Mutex
	records []slog.Record
}

func (l *auditLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *auditLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *auditLog) WithGroup(string) slog.Handler            { return l }
func (l *auditLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Clone())
	return nil
}

// all returns each record's attributes, flattened (a group's as group.key).
func (l *auditLog) all() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]string
	for _, r := range l.records {
		m := map[string]string{"level": r.Level.String(), "msg": r.Message}
		r.Attrs(func(a slog.Attr) bool {
			flatten(m, "", a)
			return true
		})
		out = append(out, m)
	}
	return out
}

func flatten(m map[string]string, prefix string, a slog.Attr) {
	if a.Value.Kind() == slog.KindGroup {
		for _, g := range a.Value.Group() {
			flatten(m, prefix+a.Key+".", g)
		}
		return
	}
	m[prefix+a.Key] = a.Value.String()
}

// browser is an HTTP client with cookies against a console server.
type browser struct {
	t      *testing.T
	srv    *httptest.Server
	client *http.Client
}

func serve(t *testing.T, h http.Handler) *browser {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	b := &browser{t: t, srv: srv, client: &http.Client{Jar: jar}}
	t.Cleanup(b.client.CloseIdleConnections)
	return b
}

// newConsole serves a console of cfg, its audit records captured.
func newConsole(t *testing.T, cfg console.Config) (*browser, *auditLog) {
	t.Helper()
	log := &auditLog{}
	cfg.Logger = slog.New(log)
	h, err := console.New(cfg)
	require.NoError(t, err)
	return serve(t, h), log
}

// page is an answer: its status, headers and body.
type page struct {
	status int
	header http.Header
	body   string
	url    string
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	resp, err := b.client.Do(req)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return page{status: resp.StatusCode, header: resp.Header, body: string(data), url: resp.Request.URL.RequestURI()}
}

func (b *browser) get(path string) page {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	require.NoError(b.t, err)
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the token in the forms of p.
func (p page) csrf(t testing.TB) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(p.body)
	require.NotNil(t, m, "the page has a form with a CSRF token:\n%s", p.body)
	return m[1]
}

// hidden returns the value of the hidden field name of p's forms.
func (p page) hidden(t testing.TB, name string) string {
	t.Helper()
	m := regexp.MustCompile(`name="` + regexp.QuoteMeta(name) + `" value="([^"]*)"`).FindStringSubmatch(p.body)
	require.NotNil(t, m, "the page has a field %s:\n%s", name, p.body)
	return m[1]
}

// next is the page's "older" or "more" link, "" without one.
func (p page) next() string {
	m := regexp.MustCompile(`<a href="([^"]+)" id="next"`).FindStringSubmatch(p.body)
	if m == nil {
		return ""
	}
	return strings.ReplaceAll(m[1], "&amp;", "&")
}

// rowIDs are the data-id values of the rows of the table id, in order.
func (p page) rowIDs(table string) []string {
	start := strings.Index(p.body, `id="`+table+`"`)
	if start < 0 {
		return nil
	}
	rest := p.body[start:]
	if end := strings.Index(rest, "</table>"); end >= 0 {
		rest = rest[:end]
	}
	var ids []string
	for _, m := range regexp.MustCompile(`data-id="([^"]+)"`).FindAllStringSubmatch(rest, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// requireUser is a service's authentication middleware: basic auth, one user.
func requireUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "secret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="ops"`)
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// basicAuth is a client transport that sends credentials with every request.
type basicAuth struct{ user, password string }

func (a basicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(a.user, a.password)
	return http.DefaultTransport.RoundTrip(r)
}

// another is a second browser (cookies of its own) on the same server.
func (b *browser) another() *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(b.t, err)
	o := &browser{t: b.t, srv: b.srv, client: &http.Client{Jar: jar}}
	b.t.Cleanup(o.client.CloseIdleConnections)
	return o
}
