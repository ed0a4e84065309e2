package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// server is a running `outboxctl serve`.
type server struct {
	url   string // the console's root, with its prefix
	cmd   *exec.Cmd
	mu    sync.Mutex
	after []string // the stderr lines after the start line: the audit records
	lines chan struct{}
	stop  os.Signal // what stops it at the test's end: SIGINT unless a test says otherwise
}

// startServe runs the binary's serve with args and env, on a free loopback port unless args
// say otherwise, and returns once it listens. It is stopped with SIGINT at the test's end,
// and must exit 0 (SIGTERM where a test sets stop).
func startServe(t *testing.T, env []string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(cleanEnv(), env...)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	s := &server{cmd: cmd, lines: make(chan struct{}, 1), stop: syscall.SIGINT}
	started := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		first := true
		for sc.Scan() {
			line := sc.Text()
			if first {
				first = false
				started <- line
				continue
			}
			s.mu.Lock()
			s.after = append(s.after, line)
			s.mu.Unlock()
			select {
			case s.lines <- struct{}{}:
			default:
			}
		}
		close(started)
	}()
	var line string
	select {
	case line = <-started:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("serve did not start")
	}
	m := regexp.MustCompile(`console on (http://\S+) `).FindStringSubmatch(line)
	require.NotNil(t, m, "the start line: %q", line)
	s.url = m[1]
	t.Cleanup(func() {
		require.NoError(t, cmd.Process.Signal(s.stop))
		assert.NoError(t, cmd.Wait(), "serve exits 0 on %v", s.stop)
	})
	return s
}

// audit waits for the next audit record on the server's stderr.
func (s *server) audit(t *testing.T) map[string]any {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		lines := append([]string(nil), s.after...)
		s.mu.Unlock()
		if len(lines) > 0 {
			var rec map[string]any
			require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &rec), lines[len(lines)-1])
			return rec
		}
		select {
		case <-s.lines:
		case <-deadline:
			t.Fatal("no audit record")
		}
	}
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// A read-only console, the default: the pages of every store given, no buttons, and a
// POST refused even with a good CSRF token; on loopback without credentials.
func TestServeReadOnlyOverEveryStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dead := f.insert(t, "ORDER_CREATED", "ORD-<b>1</b>", []byte(`{"n":1}`))
	f.set(t, dead, outbox.StatusFail, time.Hour)
	// Two stores (-table names the table of both: here one database under two names).
	dsn := testsvc.MySQLDSN(t)
	s := startServe(t, []string{"OUTBOX_TABLE=" + f.table}, "-store", "east="+dsn, "-store", "west="+dsn, "serve", "--listen", "127.0.0.1:0")

	c := &http.Client{}
	body := get(t, c, s.url)
	assert.Contains(t, body, "east")
	for host, want := range map[string]int{"rebound.example:8080": http.StatusMisdirectedRequest, "localhost:8080": http.StatusOK, "[::1]:8080": http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, s.url, nil)
		req.Host = host
		res, err := c.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		assert.Equal(t, want, res.StatusCode, "Host %s: a console without credentials answers loopback names only", host)
	}
	assert.Contains(t, body, "west")
	page := get(t, c, s.url+fmt.Sprintf("stores/east/events/%d", dead))
	assert.Contains(t, page, "ORD-&lt;b&gt;1&lt;/b&gt;", "markup shown as text")
	assert.NotContains(t, page, `id="requeue"`, "read-only: no buttons")

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	page = get(t, c, s.url+"stores/east/dead-letters")
	token := ""
	if m := csrfInput.FindStringSubmatch(page); m != nil {
		token = m[1]
	}
	res, err := c.PostForm(s.url+fmt.Sprintf("stores/east/events/%d/requeue", dead), url.Values{"csrf": {token}, "confirm": {"yes"}})
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusForbidden, res.StatusCode)
	assert.Equal(t, outbox.StatusFail, f.status(t, dead), "nothing changed")
	rec := s.audit(t)
	assert.Equal(t, "requeue", rec["action"])
	assert.Contains(t, fmt.Sprint(rec["outcome"]), "read-only")
}

// With --allow-writes a dead letter is requeued through the console, by the same Admin call
// as `outboxctl requeue`, and the action is audited with who did it.
func TestServeWritesWithBasicAuth(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dead := f.insert(t, "ORDER_CREATED", "ORD-9", []byte(`{}`))
	f.set(t, dead, outbox.StatusFail, time.Hour)
	paid := f.insert(t, "ORDER_PAID", "ORD-9", []byte(`{}`))
	f.set(t, paid, outbox.StatusSending, time.Hour)
	// Both as a plain INSERT writes them, naming no topic: the stores' routes give theirs.
	_, err := f.db.Exec("UPDATE `"+f.table+"` SET topic = '' WHERE id IN (?, ?)", dead, paid)
	require.NoError(t, err)
	s := startServe(t, append(f.env, "OUTBOX_CONSOLE_BASIC_AUTH=ops:correct-horse"), "-default-topic", "ORDERS_T", "-topics", "PAY_T",
		"-route", "ORDER_PAID=PAY_T", "serve", "--listen", "127.0.0.1:0", "--allow-writes", "--prefix", "/ops/outbox/", "--lease", "1m")
	require.True(t, strings.HasSuffix(s.url, "/ops/outbox/"), s.url)

	res, err := http.Get(s.url)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode, "no credentials")
	assert.Contains(t, res.Header.Get("WWW-Authenticate"), "Basic")
	req, _ := http.NewRequest(http.MethodGet, s.url, nil)
	req.SetBasicAuth("ops", "wrong")
	res, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, res.StatusCode, "a wrong password")

	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: basicAuth{"ops", "correct-horse"}}
	mc, err := mysql.ParseDSN(testsvc.MySQLDSN(t))
	require.NoError(t, err)
	store := mc.DBName // a -dsn store is named after its database
	page := get(t, c, s.url+fmt.Sprintf("stores/%s/events/%d", store, dead))
	require.Contains(t, page, `id="requeue"`)
	assert.Contains(t, page, "ORDERS_T", "the topic shown is -default-topic's")
	assert.Contains(t, get(t, c, s.url+fmt.Sprintf("stores/%s/events/%d", store, paid)), "PAY_T", "and -route's")
	assert.Regexp(t, `id="stale-claims">1 SENDING claim`, get(t, c, s.url+"stores/"+store), "--lease judges the claims")
	m := csrfInput.FindStringSubmatch(page)
	require.NotNil(t, m)
	res, err = c.PostForm(s.url+fmt.Sprintf("stores/%s/events/%d/requeue", store, dead), url.Values{"csrf": {m[1]}, "confirm": {"yes"}})
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusSeeOther, res.StatusCode)
	assert.Equal(t, outbox.StatusWait, f.status(t, dead), "requeued")
	rec := s.audit(t)
	assert.Equal(t, "ops", rec["user"])
	assert.Equal(t, "requeue", rec["action"])
}

type basicAuth struct{ user, pass string }

func (b basicAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(b.user, b.pass)
	return http.DefaultTransport.RoundTrip(r)
}

// A bearer token from a file: accepted as the Authorization header, or as basic auth's
// password (what a browser can send), refused otherwise.
func TestServeTokenFile(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	file := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(file, []byte("s3cret-token-0123456789\n"), 0o600))
	s := startServe(t, f.env, "serve", "--listen", "127.0.0.1:0", "--token-file", file)
	s.stop = syscall.SIGTERM
	for _, tc := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, http.StatusUnauthorized},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-token-0123456789") }, http.StatusOK},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret-token-012345678") }, http.StatusUnauthorized},
		{"as a password", func(r *http.Request) { r.SetBasicAuth("alice", "s3cret-token-0123456789") }, http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodGet, s.url, nil)
		tc.set(req)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		res.Body.Close()
		assert.Equal(t, tc.want, res.StatusCode, tc.name)
	}
	req, _ := http.NewRequest(http.MethodPost, s.url+"stores/x/events/1/requeue", strings.NewReader(""))
	req.Header.Set("Authorization", "Bearer s3cret-token-0123456789")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, "token", s.audit(t)["user"], "the audit names the token as who")
}

// Bad flags and bad credentials exit 2 before anything listens: another address than
// loopback without credentials, a short token, -on.
func TestServeRefusesBadSettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	short := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(short, []byte("short"), 0o600))
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"serve", "--listen", "0.0.0.0:0"}, nil, "not a loopback address: give a token"},
		{[]string{"serve", "--listen", ":0"}, nil, "not a loopback address"},
		{[]string{"serve", "--listen", "nonsense"}, nil, "want HOST:PORT"},
		{[]string{"serve", "--token-file", short}, nil, "at least 16"},
		{[]string{"serve"}, []string{"OUTBOX_CONSOLE_BASIC_AUTH=nopassword"}, "want user:password"},
		{[]string{"-route", "X", "serve"}, nil, "want TYPE=TOPIC"},
		{[]string{"serve", "--inbox", "g=T"}, nil, "a resend goes to the topic the message was consumed from"},
		{[]string{"serve", "--prefix", "ops"}, nil, "Prefix"},
		{[]string{"-on", "x", "serve"}, nil, "leave out -on"},
		{[]string{"serve", "--inbox", "nosuch/g"}, nil, `unknown store "nosuch"`},
		{[]string{"serve", "--relay-table", f.table + "_relay"}, nil, "relay.CreateSchema"},
	} {
		r := runEnv(t, append(append([]string{}, f.env...), tc.env...), tc.args...)
		assert.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		assert.Contains(t, r.stderr, tc.want, tc.args)
	}
	r := runEnv(t, []string{"OUTBOX_DSN=root@tcp(127.0.0.1:1)/x", "OUTBOX_TABLE=" + f.table}, "-connect-timeout", "1s", "serve", "--listen", "127.0.0.1:0")
	assert.Equal(t, exitFail, r.code, "a database that does not answer: %s", r.stderr)
}

func get(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	require.NoError(t, err)
	res, err := c.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode, "%s: %s", u, b)
	return string(b)
}

// --inbox shows a group's rejected messages, its own only, and no group it was not given.
func TestServeInboxRejected(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	table := testsvc.UniqueTable("t_inbox")
	in, err := inbox.New(f.db, inbox.Config{Group: "cg_points", Table: table})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(context.Background()))
	other, err := inbox.New(f.db, inbox.Config{Group: "cg_mail", Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = f.db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`") })
	mine := uuid.Must(uuid.NewV7()).String()
	id := rejectOne(t, in, mine)
	theirs := uuid.Must(uuid.NewV7()).String()
	rejectOne(t, other, theirs)

	s := startServe(t, f.env, "serve", "--listen", "127.0.0.1:0", "--inbox", "cg_points", "--inbox-table", table)
	c := &http.Client{}
	list := get(t, c, s.url+"inboxes/cg_points/rejected")
	assert.Contains(t, list, mine)
	assert.NotContains(t, list, theirs, "another group's")
	page := get(t, c, s.url+fmt.Sprintf("inboxes/cg_points/rejected/%d", id))
	assert.Contains(t, page, "the payload has no user")
	res, err := http.Get(s.url + "inboxes/cg_mail/rejected")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusNotFound, res.StatusCode, "a group not given")
}

// --inbox GROUP with --namesrv and --allow-writes: a rejected message resent from the
// console reaches the real broker, in the topic it was consumed from, as the same event,
// and its row is gone.
func TestServeInboxResend(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	table := testsvc.UniqueTable("t_inbox")
	in, err := inbox.New(f.db, inbox.Config{Group: "cg_points", Table: table})
	require.NoError(t, err)
	require.NoError(t, in.CreateSchema(context.Background()))
	t.Cleanup(func() { _, _ = f.db.Exec("DROP TABLE IF EXISTS `" + table + "`, `" + table + "_rejected`") })
	eventID := uuid.Must(uuid.NewV7()).String()
	topic := testsvc.NewTopic(t, "CONSOLE_RESEND")
	id := rejectOneFrom(t, in, eventID, topic)
	consumer := testsvc.Consume(t, topic)
	ns := testsvc.RocketMQNameServer(t)

	s := startServe(t, f.env, "serve", "--listen", "127.0.0.1:0", "--allow-writes", "--inbox", "cg_points",
		"--inbox-table", table, "--namesrv", ns)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	page := get(t, c, s.url+fmt.Sprintf("inboxes/cg_points/rejected/%d", id))
	require.Contains(t, page, `id="resend"`)
	assert.NotContains(t, page, `id="replay"`, "replay needs the service's handler")
	m := csrfInput.FindStringSubmatch(page)
	require.NotNil(t, m)
	res, err := c.PostForm(s.url+fmt.Sprintf("inboxes/cg_points/rejected/%d/resend", id), url.Values{"csrf": {m[1]}, "confirm": {"yes"}})
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusSeeOther, res.StatusCode)
	consumer.WaitDistinct(t, 1, 30*time.Second)
	assert.Equal(t, eventID, consumer.Messages()[0].GetProperty(outbox.PropertyEventID), "the same event")
	left, err := in.Rejected(context.Background(), 0, 10)
	require.NoError(t, err)
	assert.Empty(t, left)
	rec := s.audit(t)
	assert.Equal(t, "resend", rec["action"])
}
