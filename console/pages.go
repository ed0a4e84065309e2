package console

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// inputError is a request value the console cannot use: answered 400, naming the field.
type inputError struct{ field, msg string }

func (e *inputError) Error() string { return e.field + ": " + e.msg }

// statusOf is the HTTP status of an error of the library: 4xx for what the request asked
// wrong (nothing was changed), 500 for the rest.
func statusOf(err error) int {
	var ie *inputError
	switch {
	case errors.As(err, &ie), errors.Is(err, outbox.ErrInvalidInput), errors.Is(err, outbox.ErrInvalidConfig):
		return http.StatusBadRequest
	case errors.Is(err, outbox.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, outbox.ErrNotDeadLetter):
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// fail answers err as an error page.
func (c *console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.refuse(w, r, statusOf(err), err.Error())
}

// positiveID reads an id (a path segment or a form field) named field: a positive integer.
func positiveID(field, s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return 0, &inputError{field, fmt.Sprintf("%.40q is not an id (a positive whole number)", s)}
	}
	return n, nil
}

// optionalID reads an optional pagination id: "" is 0.
func optionalID(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	return positiveID(field, s)
}

func (c *console) store(w http.ResponseWriter, r *http.Request) *storeView {
	s := c.byStore[r.PathValue("store")]
	if s == nil {
		c.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No store is named %q.", r.PathValue("store")))
	}
	return s
}

func (c *console) inbox(w http.ResponseWriter, r *http.Request) *inboxView {
	in := c.byGroup[r.PathValue("group")]
	if in == nil {
		c.refuse(w, r, http.StatusNotFound, fmt.Sprintf("No inbox is of group %q.", r.PathValue("group")))
	}
	return in
}

func (c *console) storeNav(s *storeView, current string) []navLink {
	return []navLink{
		{ID: "nav-store", Href: c.href(nil, "stores", s.Name), Label: s.Name, Current: current == "store"},
		{ID: "nav-dead-letters", Href: c.href(nil, "stores", s.Name, "dead-letters"), Label: "Dead letters", Current: current == "dead-letters"},
		{ID: "nav-blocked", Href: c.href(nil, "stores", s.Name, "blocked"), Label: "Blocked keys", Current: current == "blocked"},
	}
}

func (c *console) inboxNav(in *inboxView, current string) []navLink {
	return []navLink{{ID: "nav-rejected", Href: c.href(nil, "inboxes", in.group, "rejected"), Label: in.group + ": rejected", Current: current == "rejected"}}
}

// The overview: every store's counts and every inbox's rejected messages.

type overviewStore struct {
	Name, Href, DeadHref string
	Stats                outbox.TableStats
	Err                  string
}

type overviewInbox struct {
	Group, Href    string
	Count          int
	More           bool
	Replay, Resend bool
	Err            string
}

// overviewRejected is how many rejected messages the overview counts at most.
const overviewRejected = 20

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	var data struct {
		Stores  []overviewStore
		Inboxes []overviewInbox
	}
	for _, s := range c.stores {
		o := overviewStore{Name: s.Name, Href: c.href(nil, "stores", s.Name),
			DeadHref: c.href(nil, "stores", s.Name, "dead-letters")}
		st, err := s.Store.Store.Stats(r.Context(), outbox.StatsOptions{Lease: s.Lease})
		if err != nil {
			o.Err = err.Error()
		}
		o.Stats = st
		data.Stores = append(data.Stores, o)
	}
	for _, in := range c.inboxes {
		o := overviewInbox{Group: in.group, Href: c.href(nil, "inboxes", in.group, "rejected"),
			Replay: in.Replay != nil, Resend: in.Sender != nil}
		rs, err := in.Inbox.Inbox.Rejected(r.Context(), 0, overviewRejected+1)
		if err != nil {
			o.Err = err.Error()
		}
		o.Count, o.More = min(len(rs), overviewRejected), len(rs) > overviewRejected
		data.Inboxes = append(data.Inboxes, o)
	}
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Data: data})
}

// The store's page.

type bar struct {
	X, Y, W, H int
	N          int64
	Label      string
}

type chart struct {
	Width, Height int
	AxisY         int // the baseline's top
	Bars          []bar
	Total, Peak   int64
}

// sentChart draws perMinute (oldest minute first, the last the current one, ending at now)
// as bars; nil without data.
func sentChart(perMinute []int64, now time.Time) *chart {
	if len(perMinute) == 0 {
		return nil
	}
	const barW, height = 10, 100
	ch := &chart{Width: barW * len(perMinute), Height: height, AxisY: height - 1}
	for _, n := range perMinute {
		ch.Total += n
		ch.Peak = max(ch.Peak, n)
	}
	start := now.UTC().Truncate(time.Minute).Add(-time.Duration(len(perMinute)-1) * time.Minute)
	for i, n := range perMinute {
		h := 0
		if ch.Peak > 0 {
			h = int(n * height / ch.Peak)
		}
		if n > 0 && h == 0 {
			h = 1
		}
		ch.Bars = append(ch.Bars, bar{X: i * barW, Y: height - h, W: barW - 2, H: h, N: n,
			Label: start.Add(time.Duration(i) * time.Minute).Format("15:04")})
	}
	return ch
}

type failType struct {
	Type, Href string
	N          int64
}

func (c *console) storePage(w http.ResponseWriter, r *http.Request) {
	s := c.store(w, r)
	if s == nil {
		return
	}
	var data struct {
		Stats      outbox.TableStats
		Err        string
		DeadHref   string
		Lease      time.Duration
		Chart      *chart
		FailByType []failType
	}
	data.DeadHref, data.Lease = c.href(nil, "stores", s.Name, "dead-letters"), s.Lease
	st, err := s.Store.Store.Stats(r.Context(), outbox.StatsOptions{Lease: s.Lease, SentPerMinute: true, CountSkipped: true})
	if err != nil {
		data.Err = err.Error()
	}
	data.Stats, data.Chart = st, sentChart(st.SentPerMinute, time.Now())
	for typ, n := range st.FailByType {
		data.FailByType = append(data.FailByType, failType{Type: typ, N: n,
			Href: c.href(url.Values{"type": {typ}}, "stores", s.Name, "dead-letters")})
	}
	slices.SortFunc(data.FailByType, func(a, b failType) int { return cmp.Or(cmp.Compare(b.N, a.N), strings.Compare(a.Type, b.Type)) })
	status := http.StatusOK
	if err != nil {
		status = statusOf(err)
	}
	c.render(w, r, status, "store", page{Title: "Store " + s.Name, Nav: c.storeNav(s, "store"), Data: data})
}

// The dead letters.

// filterForm is a dead-letter filter as the form writes it.
type filterForm struct{ Type, Biz, Since, Until string }

func (f filterForm) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"type": f.Type, "biz": f.Biz, "since": f.Since, "until": f.Until} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

// timeLayouts are the forms a filter's time may take: RFC 3339, or a UTC date and time
// without a zone (as a datetime-local input sends it), or a UTC date.
var timeLayouts = []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02T15:04", "2006-01-02 15:04:05.999999999", "2006-01-02 15:04", "2006-01-02"}

func parseTime(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			if t.Year() < 1970 || t.Year() > 9999 {
				return time.Time{}, &inputError{field, fmt.Sprintf("%.40q is outside the years 1970 to 9999", s)}
			}
			return t.UTC(), nil
		}
	}
	return time.Time{}, &inputError{field, fmt.Sprintf("%.40q is not a time (want e.g. 2026-12-01T10:00:00Z, 2026-12-01 10:00 in UTC, or 2026-12-01)", s)}
}

// maxFilterText bounds a filter's event type or biz no: the columns are shorter.
const maxFilterText = 256

// readFilter reads the dead-letter filter of r's form: always status FAIL.
func readFilter(r *http.Request) (filterForm, outbox.Filter, error) {
	ff := filterForm{Type: r.FormValue("type"), Biz: r.FormValue("biz"), Since: strings.TrimSpace(r.FormValue("since")), Until: strings.TrimSpace(r.FormValue("until"))}
	f := outbox.Filter{Status: outbox.StatusFail, EventType: ff.Type, BizNo: ff.Biz}
	if len(ff.Type) > maxFilterText {
		return ff, f, &inputError{"type", fmt.Sprintf("at most %d bytes", maxFilterText)}
	}
	if len(ff.Biz) > maxFilterText {
		return ff, f, &inputError{"biz", fmt.Sprintf("at most %d bytes", maxFilterText)}
	}
	var err error
	if f.CreatedSince, err = parseTime("since", ff.Since); err != nil {
		return ff, f, err
	}
	if f.CreatedUntil, err = parseTime("until", ff.Until); err != nil {
		return ff, f, err
	}
	if !f.CreatedSince.IsZero() && !f.CreatedUntil.IsZero() && !f.CreatedSince.Before(f.CreatedUntil) {
		return ff, f, &inputError{"until", "must be after since"}
	}
	return ff, f, nil
}

type listedRow struct {
	outbox.ListedEvent
	Href string
}

func (c *console) deadLetters(w http.ResponseWriter, r *http.Request) {
	s := c.store(w, r)
	if s == nil {
		return
	}
	ff, f, err := readFilter(r)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	before, err := optionalID("before", r.FormValue("before"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var data struct {
		F                   filterForm
		Self                string
		Rows                []listedRow
		Next                string
		Filtered, Paged     bool
		Writes              bool
		RequeueAll, SkipAll string
		CSRF                string
	}
	data.F, data.Self = ff, c.href(nil, "stores", s.Name, "dead-letters")
	data.Filtered, data.Paged = ff != filterForm{}, before > 0
	if before != 1 { // below id 1 there is nothing
		f.MaxID, f.Limit = max(before-1, 0), c.pageSize+1
		evs, err := s.admin.List(r.Context(), f)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		if len(evs) > c.pageSize {
			evs = evs[:c.pageSize]
			q := ff.values()
			q.Set("before", strconv.FormatInt(evs[len(evs)-1].ID, 10))
			data.Next = c.href(q, "stores", s.Name, "dead-letters")
		}
		for _, ev := range evs {
			data.Rows = append(data.Rows, listedRow{ev, c.href(nil, "stores", s.Name, "events", strconv.FormatInt(ev.ID, 10))})
		}
	}
	if c.cfg.AllowWrites {
		data.Writes, data.CSRF = true, c.csrfToken(w, r)
		data.RequeueAll = c.href(nil, "stores", s.Name, "dead-letters", "requeue")
		data.SkipAll = c.href(nil, "stores", s.Name, "dead-letters", "skip")
	}
	c.render(w, r, http.StatusOK, "deadletters", page{Title: "Dead letters of " + s.Name, Nav: c.storeNav(s, "dead-letters"), Data: data})
}

// One event.

func (c *console) eventPage(w http.ResponseWriter, r *http.Request) {
	s := c.store(w, r)
	if s == nil {
		return
	}
	id, err := positiveID("id", r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	ev, err := s.admin.Get(r.Context(), id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var data struct {
		Ev                    outbox.Event
		Payload               body
		MsgTopic              string
		Props                 []kv
		PropsErr              string
		Writes                bool
		CSRF                  string
		RequeueHref, SkipHref string
		Topics                []string // the store's topics a requeue may send it to
	}
	data.Ev, data.Payload = ev, showBody(ev.Payload)
	keyOrder, err := s.keyOrdered(r.Context())
	if err == nil {
		rc := outbox.RocketMQConfig{}
		if s.RocketMQ != nil {
			rc = *s.RocketMQ
		}
		var props map[string]string
		data.MsgTopic, props, err = outbox.RocketMQMessage(rc, ev, keyOrder)
		data.Props = sortedKV(props)
	}
	if err != nil {
		data.PropsErr = err.Error()
	}
	if c.cfg.AllowWrites && ev.Status == outbox.StatusFail {
		data.Writes, data.CSRF = true, c.csrfToken(w, r)
		data.RequeueHref = c.href(nil, "stores", s.Name, "events", strconv.FormatInt(id, 10), "requeue")
		data.SkipHref = c.href(nil, "stores", s.Name, "events", strconv.FormatInt(id, 10), "skip")
		if info, err := s.storeInfo(r.Context()); err == nil {
			data.Topics = info.Topics
		}
	}
	c.render(w, r, http.StatusOK, "event", page{Title: fmt.Sprintf("Event %d of %s", id, s.Name), Nav: c.storeNav(s, ""), Data: data})
}

func sortedKV(m map[string]string) []kv {
	out := make([]kv, 0, len(m))
	for k, v := range m {
		out = append(out, kv{k, v})
	}
	slices.SortFunc(out, func(a, b kv) int { return strings.Compare(a.K, b.K) })
	return out
}

// The blocked keys.

type blockedRow struct {
	outbox.BlockedKey
	Href string
}

func (c *console) blocked(w http.ResponseWriter, r *http.Request) {
	s := c.store(w, r)
	if s == nil {
		return
	}
	after, err := optionalID("after", r.FormValue("after"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var data struct {
		KeyOrder bool
		Rows     []blockedRow
		Next     string
		Paged    bool
	}
	data.Paged = after > 0
	if data.KeyOrder, err = s.keyOrdered(r.Context()); err != nil {
		c.fail(w, r, err)
		return
	}
	keys, err := s.admin.Blocked(r.Context(), after, c.pageSize+1)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	if len(keys) > c.pageSize {
		keys = keys[:c.pageSize]
		data.Next = c.href(url.Values{"after": {strconv.FormatInt(keys[len(keys)-1].ID, 10)}}, "stores", s.Name, "blocked")
	}
	for _, k := range keys {
		data.Rows = append(data.Rows, blockedRow{k, c.href(nil, "stores", s.Name, "events", strconv.FormatInt(k.ID, 10))})
	}
	c.render(w, r, http.StatusOK, "blocked", page{Title: "Blocked keys of " + s.Name, Nav: c.storeNav(s, "blocked"), Data: data})
}

// The inbox's rejected messages.

type rejectedRow struct {
	inbox.RejectedMessage
	Href string
}

func (c *console) rejectedList(w http.ResponseWriter, r *http.Request) {
	in := c.inbox(w, r)
	if in == nil {
		return
	}
	after, err := optionalID("after", r.FormValue("after"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	limit := min(c.pageSize, 999) + 1
	rs, err := in.Inbox.Inbox.Rejected(r.Context(), after, limit)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var data struct {
		Rows  []rejectedRow
		Next  string
		Paged bool
	}
	data.Paged = after > 0
	if len(rs) == limit {
		rs = rs[:limit-1]
		data.Next = c.href(url.Values{"after": {strconv.FormatInt(rs[len(rs)-1].ID, 10)}}, "inboxes", in.group, "rejected")
	}
	for _, m := range rs {
		data.Rows = append(data.Rows, rejectedRow{m, c.href(nil, "inboxes", in.group, "rejected", strconv.FormatInt(m.ID, 10))})
	}
	c.render(w, r, http.StatusOK, "rejected", page{Title: "Rejected messages of " + in.group, Nav: c.inboxNav(in, "rejected"), Data: data})
}

// rejectedByID reads the group's rejected message id, through the id's page of one.
func rejectedByID(r *http.Request, in *inboxView, id int64) (inbox.RejectedMessage, error) {
	rs, err := in.Inbox.Inbox.Rejected(r.Context(), id-1, 1)
	if err != nil {
		return inbox.RejectedMessage{}, err
	}
	if len(rs) == 0 || rs[0].ID != id {
		return inbox.RejectedMessage{}, fmt.Errorf("%w: no rejected message %d in group %s", outbox.ErrNotFound, id, in.group)
	}
	return rs[0], nil
}

func (c *console) rejectedPage(w http.ResponseWriter, r *http.Request) {
	in := c.inbox(w, r)
	if in == nil {
		return
	}
	id, err := positiveID("id", r.PathValue("id"))
	if err != nil {
		c.fail(w, r, err)
		return
	}
	m, err := rejectedByID(r, in, id)
	if err != nil {
		c.fail(w, r, err)
		return
	}
	var data struct {
		R                      inbox.RejectedMessage
		Body                   body
		Props                  []kv
		Writes                 bool
		CSRF                   string
		ReplayHref, ResendHref string
	}
	data.R, data.Body, data.Props = m, showBody(m.Message.Body), sortedKV(m.Message.Properties)
	if c.cfg.AllowWrites {
		data.Writes, data.CSRF = true, c.csrfToken(w, r)
		sid := strconv.FormatInt(id, 10)
		if in.Replay != nil {
			data.ReplayHref = c.href(nil, "inboxes", in.group, "rejected", sid, "replay")
		}
		if in.Sender != nil {
			data.ResendHref = c.href(nil, "inboxes", in.group, "rejected", sid, "resend")
		}
	}
	c.render(w, r, http.StatusOK, "rejectedmsg", page{Title: fmt.Sprintf("Rejected message %d of %s", id, in.group), Nav: c.inboxNav(in, ""), Data: data})
}
