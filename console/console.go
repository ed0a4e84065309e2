package console

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// Defaults and limits of [Config].
const (
	// PageSizeDefault is how many rows a list page shows when Config.PageSize is 0.
	PageSizeDefault = 50
	// PageSizeMax is the largest Config.PageSize.
	PageSizeMax = 500
	// CSRFKeyMinLen is the shortest Config.CSRFKey.
	CSRFKeyMinLen = 32
	// BulkMax is the most dead letters one bulk requeue or skip changes: the largest
	// [outbox.Filter.Limit]. A filter that selects more is done in several confirmed steps.
	BulkMax = 10000
)

// Config configures the console [New] returns.
type Config struct {
	// Stores are the outbox tables shown, each under its Name. At least one store or inbox
	// is required.
	Stores []Store
	// Inboxes are the inboxes whose rejected messages are shown, each under its group.
	Inboxes []Inbox
	// Prefix is the path the handler is mounted at, starting and ending with "/", e.g.
	// "/ops/outbox/". The handler sees the request's whole path (mount it without
	// http.StripPrefix) and writes its links below Prefix. Defaults to "/".
	Prefix string
	// AllowWrites lets operators requeue, skip, replay and resend. Without it the console is
	// read-only: it shows no buttons, and refuses every POST with 403. Defaults to false.
	AllowWrites bool
	// Logger receives the audit records, one Info record for each POST (who, from where,
	// which store or group, what action, which ids or filter, how many rows changed, the
	// outcome). Defaults to slog.Default() at the time of each record.
	Logger *slog.Logger
	// User names who made a request, for the audit records, e.g. from the identity the
	// service's authentication middleware put in the request's context. Defaults to the
	// request's basic-auth user, or "anonymous" without one.
	User func(*http.Request) string
	// CSRFKey signs the CSRF tokens: at least 32 bytes. Give several instances behind one
	// load balancer the same key. Defaults to a random key made by New (tokens then last as
	// long as the handler).
	CSRFKey []byte
	// PageSize is how many rows a list page shows: 1 to 500. Defaults to 50.
	PageSize int
}

// Store is an outbox table the console shows.
type Store struct {
	// Name names the store in the console's paths and pages, as outboxctl's -store NAME=DSN
	// does: required, unique, and without "/".
	Name string
	// Store is the table. Required.
	Store *outbox.MySQLStore
	// Lease is the publishers' [outbox.Tuning.Lease], against which the overview judges the
	// SENDING claims ([outbox.StatsOptions.Lease]). Zero judges none.
	Lease time.Duration
	// RocketMQ is the configuration of the sender that publishes the store's events: the
	// event page shows the topic and properties it sends each event with. nil shows those of
	// the zero RocketMQConfig.
	RocketMQ *outbox.RocketMQConfig
}

// Inbox is an inbox whose rejected messages the console shows.
type Inbox struct {
	// Inbox is shown under its Group. Required.
	Inbox *inbox.Inbox
	// Replay is the handler a rejected message is replayed with ([inbox.Inbox.Replay]): the
	// group's own handler. nil offers no replay.
	Replay inbox.Handler
	// Sender publishes a rejected message again ([inbox.Inbox.Resend]), for the running
	// consumers to handle. nil offers no resend.
	Sender outbox.Sender
}

// New returns the console's handler. A Config that cannot work (no store and no inbox, a
// store without a name or a table, two stores or inboxes of one name, a Prefix that does not
// start and end with "/", a CSRFKey shorter than 32 bytes, a PageSize outside 1 to 500) is
// an error wrapping [outbox.ErrInvalidConfig].
func New(cfg Config) (http.Handler, error) {
	c, err := newConsole(cfg)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// console is the handler.
type console struct {
	cfg      Config
	prefix   string
	key      []byte
	pageSize int
	stores   []*storeView
	byStore  map[string]*storeView
	inboxes  []*inboxView
	byGroup  map[string]*inboxView
	mux      *http.ServeMux
	csrf     *http.CrossOriginProtection
	pages    *templates
}

// storeView is a store and what the console caches of it.
type storeView struct {
	Store
	admin *outbox.Admin

	mu      sync.Mutex
	checked bool
	info    outbox.StoreInfo
}

// storeInfo reports how the store publishes (its ordering and topics), from
// [outbox.MySQLStore.Check] at the first call that succeeds.
func (s *storeView) storeInfo(ctx context.Context) (outbox.StoreInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.checked {
		return s.info, nil
	}
	info, err := s.Store.Store.Check(ctx)
	if err != nil {
		return outbox.StoreInfo{}, err
	}
	s.checked, s.info = true, info
	return s.info, nil
}

// keyOrdered reports whether the store publishes in key order.
func (s *storeView) keyOrdered(ctx context.Context) (bool, error) {
	info, err := s.storeInfo(ctx)
	return info.Ordering != outbox.Unordered, err
}

// inboxView is an inbox as the console shows it.
type inboxView struct {
	Inbox
	group string
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: console: %s", outbox.ErrInvalidConfig, fmt.Sprintf(format, args...))
}

func newConsole(cfg Config) (*console, error) {
	if len(cfg.Stores) == 0 && len(cfg.Inboxes) == 0 {
		return nil, invalid("no stores and no inboxes: give at least one")
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "/"
	}
	if !strings.HasPrefix(prefix, "/") || !strings.HasSuffix(prefix, "/") {
		return nil, invalid("Prefix %q must start and end with \"/\"", prefix)
	}
	if prefix != "/" && path.Clean(prefix)+"/" != prefix || strings.ContainsAny(prefix, "{}?#% \t\r\n") {
		return nil, invalid("Prefix %q is not a clean path (no \"//\", \".\", \"..\", braces, spaces, '%%', '?' or '#')", prefix)
	}
	pageSize := cfg.PageSize
	if pageSize == 0 {
		pageSize = PageSizeDefault
	}
	if pageSize < 1 || pageSize > PageSizeMax {
		return nil, invalid("PageSize must be between 1 and %d, got %d", PageSizeMax, cfg.PageSize)
	}
	key := cfg.CSRFKey
	if key == nil {
		key = make([]byte, CSRFKeyMinLen)
		_, _ = rand.Read(key)
	} else if len(key) < CSRFKeyMinLen {
		return nil, invalid("CSRFKey must be at least %d bytes, got %d", CSRFKeyMinLen, len(key))
	} else {
		key = append([]byte(nil), key...)
	}
	c := &console{
		cfg: cfg, prefix: prefix, key: key, pageSize: pageSize,
		byStore: map[string]*storeView{}, byGroup: map[string]*inboxView{},
	}
	for i, s := range cfg.Stores {
		switch {
		case s.Name == "":
			return nil, invalid("store %d has no Name", i)
		case strings.ContainsAny(s.Name, "/\\?#%") || strings.TrimSpace(s.Name) != s.Name:
			return nil, invalid("store name %q holds '/', '\\', '?', '#', '%%' or leading or trailing space", s.Name)
		case s.Store == nil:
			return nil, invalid("store %q has a nil Store", s.Name)
		case s.Lease < 0:
			return nil, invalid("store %q has a negative Lease %s", s.Name, s.Lease)
		case c.byStore[s.Name] != nil:
			return nil, invalid("two stores are named %q", s.Name)
		}
		v := &storeView{Store: s, admin: outbox.NewAdmin(s.Store)}
		c.stores = append(c.stores, v)
		c.byStore[s.Name] = v
	}
	for i, in := range cfg.Inboxes {
		if in.Inbox == nil {
			return nil, invalid("inbox %d has a nil Inbox", i)
		}
		g := in.Inbox.Group()
		if c.byGroup[g] != nil {
			return nil, invalid("two inboxes are of group %q", g)
		}
		v := &inboxView{Inbox: in, group: g}
		c.inboxes = append(c.inboxes, v)
		c.byGroup[g] = v
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	c.pages = pages
	c.csrf = http.NewCrossOriginProtection()
	c.csrf.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.refuse(w, r, http.StatusForbidden, "cross-origin request refused")
	}))
	c.routes()
	return c, nil
}

// routes registers the pages and actions below the prefix. A GET of an action's path, or a
// POST of a page's, is answered 405 by the mux.
func (c *console) routes() {
	p := c.prefix
	m := http.NewServeMux()
	m.HandleFunc("GET "+p+"{$}", c.overview)
	m.HandleFunc("GET "+p+"static/console.css", c.stylesheet)
	m.HandleFunc("GET "+p+"stores/{store}", c.storePage)
	m.HandleFunc("GET "+p+"stores/{store}/dead-letters", c.deadLetters)
	m.HandleFunc("POST "+p+"stores/{store}/dead-letters/requeue", c.action("requeue-all", c.bulk(actRequeue)))
	m.HandleFunc("POST "+p+"stores/{store}/dead-letters/skip", c.action("skip-all", c.bulk(actSkip)))
	m.HandleFunc("GET "+p+"stores/{store}/events/{id}", c.eventPage)
	m.HandleFunc("POST "+p+"stores/{store}/events/{id}/requeue", c.action("requeue", c.single(actRequeue)))
	m.HandleFunc("POST "+p+"stores/{store}/events/{id}/skip", c.action("skip", c.single(actSkip)))
	m.HandleFunc("GET "+p+"stores/{store}/blocked", c.blocked)
	m.HandleFunc("GET "+p+"inboxes/{group}/rejected", c.rejectedList)
	m.HandleFunc("GET "+p+"inboxes/{group}/rejected/{id}", c.rejectedPage)
	m.HandleFunc("POST "+p+"inboxes/{group}/rejected/{id}/replay", c.action("replay", c.inboxAction(actReplay)))
	m.HandleFunc("POST "+p+"inboxes/{group}/rejected/{id}/resend", c.action("resend", c.inboxAction(actResend)))
	c.mux = m
}

// ServeHTTP sets the security headers of every answer and serves the request.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	c.mux.ServeHTTP(w, r)
}

// requeueTopic refuses a topic outside the store's set as a requeue's destination, with an
// error that names the set ("" keeps the event's own).
func (s *storeView) requeueTopic(ctx context.Context, topic string) error {
	if topic == "" {
		return nil
	}
	info, err := s.storeInfo(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(info.Topics, topic) {
		return fmt.Errorf("%w: topic %.140q is not one of the store's topics (%s)", outbox.ErrInvalidInput, topic, strings.Join(info.Topics, ", "))
	}
	return nil
}
