package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// StoreInfo is what a store reports of itself ([Store.Check]): how it claims, and where its
// events may go.
type StoreInfo struct {
	// Ordering is the order the store claims in (see [Ordering]).
	Ordering Ordering
	// Topics are every topic the store's events may go to (for a [MySQLStore], the set of
	// [MySQLConfig.Routes]); nil means any. The publisher checks at Start that its sender
	// can send to each ([Sender.Check]), names metrics and spans only by these, and
	// dead-letters an event that names another (written by hand, past the store's checks).
	Topics []string
	// Warnings are what the store can work with but a person should fix, each a sentence
	// that says the fix; the publisher logs each at warn when it starts. (A [MySQLStore]'s:
	// a table without the server-side defaults other programs' plain INSERTs need.)
	Warnings []string
}

// Dispatch sends evs, events of a store that info describes, through s, and returns one
// error per event, in order: nil for each event the broker stored. It is the one place
// where every publishing path (the [Publisher]'s batch and per-row rounds, and the binlog
// relay) applies the rules a [Sender] does not decide:
//
//   - An event whose topic is empty, or outside info.Topics when that is not nil, is not
//     handed to the sender: it fails as [Permanent], naming the topic and the known ones.
//   - Without key order, the other events go to the sender in one call.
//   - In key order (info.Ordering is not [Unordered]), a biz no's events go out in the
//     order given (id order, as the claims return them) across all its topics: a biz no's
//     consecutive events of one topic go to the sender together, and its next events, of
//     another topic, only once the broker has stored every earlier one. Each call to the
//     sender carries, for each biz no, one run of events of one topic; the biz nos stay
//     concurrent, one call for all of them at each step. A biz no stops at its first
//     failure, in whatever topic: its later events are not sent, and get an error
//     wrapping [ErrNotSent] that names the failure. A topic a send found unavailable is not
//     tried again in the call: its later events get an error wrapping [ErrNotSent] and the
//     unavailable one. Once ctx is done, nothing more is sent, and the events left get
//     [ErrNotSent].
//
// A panic in the sender, or an answer of the wrong length, fails the events of that call
// alike.
func Dispatch(ctx context.Context, s Sender, evs []Event, info StoreInfo) []error {
	errs := make([]error, len(evs))
	var known map[string]bool
	if info.Topics != nil {
		known = make(map[string]bool, len(info.Topics))
		for _, t := range info.Topics {
			known[t] = true
		}
	}
	refusal := func(ev *Event) error { return refuseTopic(ev, known, info.Topics) }
	if info.Ordering == Unordered {
		at := make([]int, 0, len(evs))
		for i := range evs {
			if errs[i] = refusal(&evs[i]); errs[i] == nil {
				at = append(at, i)
			}
		}
		sendAt(ctx, s, evs, at, false, errs)
		return errs
	}
	(&keyDispatch{s: s, evs: evs, errs: errs}).run(ctx, refusal)
	return errs
}

// refuseTopic returns why ev cannot be sent to its topic, or nil.
func refuseTopic(ev *Event, known map[string]bool, set []string) error {
	switch {
	case ev.Topic == "":
		return Permanent(errors.New("outbox: the event names no topic, and its store gave it none"))
	case known != nil && !known[ev.Topic]:
		return Permanent(fmt.Errorf("outbox: the event's topic %.140q is not one of its store's topics (%s): requeue it to one of them (Admin.RequeueTo, or Admin.Requeue with RequeueOptions.Topic)",
			ev.Topic, strings.Join(set, ", ")))
	}
	return nil
}

// sendAt sends the events of evs at positions at in one call of s, writing their errors to
// errs.
func sendAt(ctx context.Context, s Sender, evs []Event, at []int, keyOrder bool, errs []error) {
	if len(at) == 0 {
		return
	}
	batch := evs
	if len(at) != len(evs) {
		batch = make([]Event, len(at))
		for k, i := range at {
			batch[k] = evs[i]
		}
	}
	res := callSender(ctx, s, batch, keyOrder)
	for k, i := range at {
		errs[i] = res[k]
	}
}

// callSender calls s.Send, turning a panic or an answer of the wrong length into an error
// for every event.
func callSender(ctx context.Context, s Sender, evs []Event, keyOrder bool) (errs []error) {
	defer func() {
		if r := recover(); r != nil {
			errs = repeatErr(fmt.Errorf("sender panicked: %v", r), len(evs))
		}
	}()
	errs = s.Send(ctx, evs, keyOrder)
	if len(errs) != len(evs) {
		return repeatErr(fmt.Errorf("sender returned %d results for %d events", len(errs), len(evs)), len(evs))
	}
	return errs
}

// keyDispatch is one key-ordered Dispatch: each biz no's events cut into segments, runs of
// one topic in the order given, sent a step at a time.
type keyDispatch struct {
	s    Sender
	evs  []Event
	errs []error
}

// keyRun is one biz no's part of a dispatch.
type keyRun struct {
	segs [][]int // positions in evs: runs of one topic, in order
	next int     // the segment the next step sends
	// stop is why the biz no goes no further (its first failure), nil while it goes on;
	// stopAt is the event id of the event that failed.
	stop   error
	stopAt string
}

func (d *keyDispatch) run(ctx context.Context, refusal func(*Event) error) {
	var order []*keyRun
	byKey := map[string]*keyRun{}
	refused := map[int]error{}
	for i := range d.evs {
		ev := &d.evs[i]
		k := byKey[ev.BizNo]
		if k == nil {
			k = &keyRun{}
			byKey[ev.BizNo] = k
			order = append(order, k)
		}
		if err := refusal(ev); err != nil {
			refused[i] = err
			k.segs = append(k.segs, []int{i}) // fails alone, at its turn
			continue
		}
		if n := len(k.segs); n > 0 {
			last := k.segs[n-1]
			if _, bad := refused[last[0]]; !bad && d.evs[last[0]].Topic == ev.Topic {
				k.segs[n-1] = append(last, i)
				continue
			}
		}
		k.segs = append(k.segs, []int{i})
	}

	down := map[string]error{} // topics a send found unavailable, with its error
	for {
		var (
			at   []int
			step []*keyRun
		)
		for _, k := range order {
			if k.stop != nil || k.next == len(k.segs) {
				continue
			}
			seg := k.segs[k.next]
			topic := d.evs[seg[0]].Topic
			switch {
			case ctx.Err() != nil:
				for ; k.next < len(k.segs); k.next++ {
					for _, i := range k.segs[k.next] {
						d.errs[i] = errNotSent
					}
				}
				k.stop = errNotSent
			case refused[seg[0]] != nil:
				d.errs[seg[0]] = refused[seg[0]]
				k.next++
				k.stopAt = d.evs[seg[0]].EventID
				d.stopKey(k, refused[seg[0]], nil)
			case down[topic] != nil:
				cause := notSent(down[topic])
				d.stopKey(k, cause, cause)
			default:
				at = append(at, seg...)
				step = append(step, k)
			}
		}
		if len(at) == 0 {
			return
		}
		sendAt(ctx, d.s, d.evs, at, true, d.errs)
		for _, k := range step {
			seg := k.segs[k.next]
			k.next++
			for _, i := range seg {
				err := d.errs[i]
				if stored(err) {
					continue
				}
				if k.stop == nil {
					k.stop, k.stopAt = err, d.evs[i].EventID
				}
				if isOutage(err) && !errors.Is(err, ErrNotSent) && down[d.evs[i].Topic] == nil {
					down[d.evs[i].Topic] = err
				}
			}
			if k.stop != nil {
				d.stopKey(k, k.stop, nil)
			}
		}
	}
}

// stopKey ends k's part of the dispatch at its first failure, cause: the events of its
// segments not yet sent get an error wrapping [ErrNotSent] (now, if not nil, for the
// segment at k.next, the one that was to go now; a [keyNotSentError] for the later ones).
func (d *keyDispatch) stopKey(k *keyRun, cause, now error) {
	if k.stop == nil {
		k.stop = cause
	}
	if now != nil && k.next < len(k.segs) {
		for _, i := range k.segs[k.next] {
			d.errs[i] = now
		}
		k.next++
	}
	for ; k.next < len(k.segs); k.next++ {
		for _, i := range k.segs[k.next] {
			d.errs[i] = &keyNotSentError{bizNo: d.evs[i].BizNo, failed: k.stopAt, cause: k.stop}
		}
	}
}

// keyNotSentError is the error of an event not sent because an earlier event of its biz no
// failed (in key order). It is [ErrNotSent] to the publisher, and names, but does not wrap,
// the failure: the event is not charged with it.
type keyNotSentError struct {
	bizNo  string
	failed string // the event id of the one that failed, if known
	cause  error
}

func (e *keyNotSentError) Error() string {
	if e.failed == "" {
		return "not sent: an earlier event of biz no " + e.bizNo + " failed: " + e.cause.Error()
	}
	return "not sent: an earlier event of biz no " + e.bizNo + ", " + e.failed + ", failed: " + e.cause.Error()
}

func (e *keyNotSentError) Is(target error) bool { return target == ErrNotSent }

// notSentError is the error of an event never tried because an earlier send found its
// topic unavailable. It is [ErrNotSent] to the publisher, and wraps the unavailable error.
type notSentError struct{ cause error }

func notSent(cause error) error { return &notSentError{cause: cause} }

func (e *notSentError) Error() string {
	return "not sent: an earlier send found the broker unavailable: " + e.cause.Error()
}

func (e *notSentError) Is(target error) bool { return target == errNotSent || target == ErrNotSent }
func (e *notSentError) Unwrap() error        { return e.cause }
