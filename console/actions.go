package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-outbox/outbox"
)

// act is what an action does.
type act int

const (
	actRequeue act = iota
	actSkip
	actReplay
	actResend
)

// segment is the last segment of the action's path.
func segment(kind act) string {
	return [...]string{actRequeue: "requeue", actSkip: "skip", actReplay: "replay", actResend: "resend"}[kind]
}

// confirmData is the confirmation page's.
type confirmData struct {
	Question   string
	Details    []kv
	Note       string
	CanConfirm bool
	Action     string
	Hidden     []kv
	Verb       string
	Class      string
	Cancel     string
	CSRF       string
}

func (c *console) confirm(w http.ResponseWriter, r *http.Request, title string, nav []navLink, d confirmData) {
	d.CSRF = c.csrfToken(w, r)
	c.render(w, r, http.StatusOK, "confirm", page{Title: title, Nav: nav, Data: d})
}

// failAction answers err, records it in the audit, and changes nothing more.
func (c *console) failAction(w http.ResponseWriter, r *http.Request, a *audit, err error) {
	a.outcome, a.err = "error", err
	c.fail(w, r, err)
}

// done records the rows an action changed and redirects to the page at to with msg.
func (c *console) done(w http.ResponseWriter, r *http.Request, a *audit, rows int64, to, msg string) {
	a.outcome, a.rows = "done", rows
	c.setFlash(w, r, msg)
	http.Redirect(w, r, to, http.StatusSeeOther)
}

func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "yes" }

// actionID reads the {id} of an action's path and names it in the audit record; an id that
// is not one is answered (400), and false returned.
func (c *console) actionID(w http.ResponseWriter, r *http.Request, a *audit) (int64, bool) {
	id, err := positiveID("id", r.PathValue("id"))
	if err != nil {
		c.failAction(w, r, a, err)
		return 0, false
	}
	a.with(slog.Int64("id", id))
	return id, true
}

// single requeues or skips one dead letter: without confirm=yes it answers the
// confirmation page, with it it acts.
func (c *console) single(kind act) func(http.ResponseWriter, *http.Request, *audit) {
	verb, done := "Requeue", "requeued: it is WAIT, due now"
	if kind == actSkip {
		verb, done = "Skip", "skipped: it is SKIPPED and will never be sent"
	}
	return func(w http.ResponseWriter, r *http.Request, a *audit) {
		s := c.store(w, r)
		if s == nil {
			a.outcome = "refused: no such store"
			return
		}
		id, ok := c.actionID(w, r, a)
		if !ok {
			return
		}
		sid := strconv.FormatInt(id, 10)
		eventHref := c.href(nil, "stores", s.Name, "events", sid)
		topic := ""
		if kind == actRequeue {
			topic = r.PostFormValue("topic")
			if topic != "" {
				a.with(slog.String("topic", topic))
			}
		}
		if !confirmed(r) {
			ev, err := s.admin.Get(r.Context(), id)
			if err != nil {
				c.failAction(w, r, a, err)
				return
			}
			if ev.Status != outbox.StatusFail {
				c.failAction(w, r, a, fmt.Errorf("%w: event %d is %s", outbox.ErrNotDeadLetter, id, ev.Status))
				return
			}
			if topic == ev.Topic {
				topic = "" // its own: a plain requeue
			}
			if err := s.requeueTopic(r.Context(), topic); err != nil {
				c.failAction(w, r, a, err)
				return
			}
			a.outcome = "asked to confirm"
			d := confirmData{
				Question: fmt.Sprintf("%s dead letter %d of %s?", verb, id, s.Name),
				Details: []kv{{"Event type", ev.EventType}, {"Biz no", ev.BizNo}, {"Event id", ev.EventID},
					{"Topic", ev.Topic}, {"Last error", clip(ev.LastError, 300)}},
				CanConfirm: true, Action: c.href(nil, "stores", s.Name, "events", sid, segment(kind)), Verb: verb, Cancel: eventHref,
			}
			if topic != "" {
				d.Question = fmt.Sprintf("Requeue dead letter %d of %s to topic %s?", id, s.Name, topic)
				d.Details = append(d.Details, kv{"To topic", topic})
				d.Hidden = append(d.Hidden, kv{"topic", topic})
			}
			if kind == actSkip {
				d.Class, d.Note = "danger", "A skipped event is never sent. Under key order, the events of its biz no behind it go on without it."
			} else {
				d.Note = "It is sent again by the publishers, from its first try."
			}
			c.confirm(w, r, verb+" event", c.storeNav(s, ""), d)
			return
		}
		var err error
		if kind == actSkip {
			err = s.admin.Skip(r.Context(), id)
		} else {
			err = s.admin.RequeueTo(r.Context(), id, topic)
		}
		if err != nil {
			c.failAction(w, r, a, err)
			return
		}
		if topic != "" {
			done = "requeued to topic " + topic + ": it is WAIT, due now"
		}
		c.done(w, r, a, 1, eventHref, fmt.Sprintf("Event %d %s.", id, done))
	}
}

func filterAttrs(ff filterForm) slog.Attr {
	return slog.Group("filter", slog.String("type", ff.Type), slog.String("biz", ff.Biz),
		slog.String("since", ff.Since), slog.String("until", ff.Until))
}

// bulk requeues or skips the dead letters a filter selects. Without confirm=yes it counts
// them (a dry run) and finds the newest one's id, and answers a page that asks to confirm
// that many; with confirm=yes it acts on at most that many, none newer than that id, so
// that a dead letter that came after the count is left alone.
func (c *console) bulk(kind act) func(http.ResponseWriter, *http.Request, *audit) {
	verb, past := "Requeue", "requeued"
	if kind == actSkip {
		verb, past = "Skip", "skipped"
	}
	return func(w http.ResponseWriter, r *http.Request, a *audit) {
		s := c.store(w, r)
		if s == nil {
			a.outcome = "refused: no such store"
			return
		}
		ff, f, err := readFilter(r)
		a.with(filterAttrs(ff))
		if err != nil {
			c.failAction(w, r, a, err)
			return
		}
		run := func(f outbox.Filter, dryRun bool) (int64, error) {
			opts := outbox.RequeueOptions{DryRun: dryRun}
			if kind == actSkip {
				return s.admin.SkipFailed(r.Context(), f, opts)
			}
			return s.admin.RequeueFailed(r.Context(), f, opts)
		}
		listHref := c.href(ff.values(), "stores", s.Name, "dead-letters")
		if !confirmed(r) {
			lf := f
			lf.Limit = 1
			newest, err := s.admin.List(r.Context(), lf)
			if err != nil {
				c.failAction(w, r, a, err)
				return
			}
			d := confirmData{Action: c.href(nil, "stores", s.Name, "dead-letters", segment(kind)), Verb: fmt.Sprintf("%s them", verb), Cancel: listHref,
				Details: filterDetails(ff)}
			if kind == actSkip {
				d.Class = "danger"
			}
			var n int64
			if len(newest) > 0 {
				f.MaxID, f.Limit = newest[0].ID, BulkMax
				if n, err = run(f, true); err != nil {
					c.failAction(w, r, a, err)
					return
				}
			}
			a.outcome = "dry run"
			a.with(slog.Int64("matched", n), slog.Int64("max_id", f.MaxID))
			switch {
			case n == 0:
				d.Question = "No dead letters match this filter: nothing to " + verb + "."
			default:
				d.CanConfirm = true
				d.Question = fmt.Sprintf("%d dead letters match this filter. %s them?", n, verb)
				d.Note = fmt.Sprintf("Confirming %s at most %d dead letters, with ids up to %d: those counted now. One that fails after this count is left alone.", past, n, f.MaxID)
				if n == BulkMax {
					d.Note += fmt.Sprintf(" At most %d are done at once; run again for the rest.", BulkMax)
				}
				d.Hidden = []kv{{"type", ff.Type}, {"biz", ff.Biz}, {"since", ff.Since}, {"until", ff.Until},
					{"count", strconv.FormatInt(n, 10)}, {"max_id", strconv.FormatInt(f.MaxID, 10)}}
			}
			c.confirm(w, r, verb+" dead letters of "+s.Name, c.storeNav(s, "dead-letters"), d)
			return
		}
		count, err := strconv.Atoi(r.PostFormValue("count"))
		if err != nil || count < 1 || count > BulkMax {
			c.failAction(w, r, a, &inputError{"count", fmt.Sprintf("%.20q is not a count from 1 to %d", r.PostFormValue("count"), BulkMax)})
			return
		}
		maxID, err := positiveID("max_id", r.PostFormValue("max_id"))
		if err != nil {
			c.failAction(w, r, a, err)
			return
		}
		a.with(slog.Int("count", count), slog.Int64("max_id", maxID))
		f.MaxID, f.Limit = maxID, count
		n, err := run(f, false)
		a.rows = n
		if err != nil {
			c.failAction(w, r, a, err)
			return
		}
		c.done(w, r, a, n, listHref, fmt.Sprintf("%d of the %d dead letters confirmed were %s.", n, count, past))
	}
}

func filterDetails(ff filterForm) []kv {
	or := func(s string) string {
		if s == "" {
			return "any"
		}
		return s
	}
	return []kv{{"Event type", or(ff.Type)}, {"Biz no", or(ff.Biz)}, {"Created since", or(ff.Since)}, {"Created until", or(ff.Until)}}
}

// inboxAction replays or resends one rejected message, after a confirmation page.
func (c *console) inboxAction(kind act) func(http.ResponseWriter, *http.Request, *audit) {
	verb := "Replay"
	if kind == actResend {
		verb = "Resend"
	}
	return func(w http.ResponseWriter, r *http.Request, a *audit) {
		in := c.inbox(w, r)
		if in == nil {
			a.outcome = "refused: no such inbox"
			return
		}
		id, ok := c.actionID(w, r, a)
		if !ok {
			return
		}
		if kind == actReplay && in.Replay == nil || kind == actResend && in.Sender == nil {
			a.outcome = "refused: not offered"
			c.refuse(w, r, http.StatusNotFound, fmt.Sprintf("%s is not offered for the inbox of group %s.", verb, in.group))
			return
		}
		sid := strconv.FormatInt(id, 10)
		msgHref := c.href(nil, "inboxes", in.group, "rejected", sid)
		if !confirmed(r) {
			m, err := rejectedByID(r, in, id)
			if err != nil {
				c.failAction(w, r, a, err)
				return
			}
			a.outcome = "asked to confirm"
			d := confirmData{
				Question: fmt.Sprintf("%s rejected message %d of %s?", verb, id, in.group),
				Details: []kv{{"Event id", m.Message.EventID}, {"Event type", m.Message.EventType}, {"Biz no", m.Message.BizNo},
					{"Reason", m.ReasonClass + ": " + clip(m.Reason, 300)}},
				CanConfirm: true, Action: c.href(nil, "inboxes", in.group, "rejected", sid, segment(kind)), Verb: verb, Cancel: msgHref,
			}
			if kind == actReplay {
				d.Note = "The group's handler runs it once more here, in one transaction with the removal of the rejected row."
			} else {
				d.Note = "It is published again as the same event; every group subscribed receives it, and those that handled it already drop it as a duplicate."
			}
			c.confirm(w, r, verb+" rejected message", c.inboxNav(in, ""), d)
			return
		}
		ctx := r.Context()
		var msg string
		if kind == actReplay {
			outcome, err := in.Inbox.Inbox.Replay(ctx, id, in.Replay)
			if err != nil {
				c.failAction(w, r, a, err)
				return
			}
			a.with(slog.String("replay_outcome", outcome.String()))
			msg = fmt.Sprintf("Rejected message %d replayed: %s.", id, outcome)
		} else {
			sendCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if err := in.Inbox.Inbox.Resend(sendCtx, id, in.Sender); err != nil {
				c.failAction(w, r, a, err)
				return
			}
			msg = fmt.Sprintf("Rejected message %d resent.", id)
		}
		c.done(w, r, a, 1, c.href(nil, "inboxes", in.group, "rejected"), msg)
	}
}
