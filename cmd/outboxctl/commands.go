package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/go-outbox/outbox"
)

// ---- stats

func (a *app) stats(ctx context.Context, args []string) error {
	fs := a.newFlags("stats", "stats [--lease 15s] [--count-success] [--json]",
		"Counts events by status, and reports the due backlog, the oldest due event's age (the\n"+
			"publish lag), SENDING events past half their lease, and dead letters by event type.\n"+
			"Counting SUCCESS rows reads their whole index range, so it is left out unless asked.")
	lease := fs.Duration("lease", 15*time.Second, "the publishers' Config.Tuning.Lease, to judge SENDING rows by")
	countSuccess := fs.Bool("count-success", false, "also count SUCCESS rows (slow on a large table)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *lease <= 0 {
		return usagef("--lease must be positive, got %s", *lease)
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	st, err := a.store.Stats(ctx, outbox.StatsOptions{Lease: *lease, CountSucceeded: *countSuccess})
	if err != nil {
		return err
	}
	if *asJSON {
		out := map[string]any{
			"wait": st.Wait, "sending": st.Sending, "fail": st.Fail, "due": st.Due,
			"oldest_due_age_seconds":   st.OldestDueAge.Seconds(),
			"oldest_claim_age_seconds": st.OldestClaimAge.Seconds(),
			"sending_past_half_lease":  st.SendingPastHalfLease,
			"fail_by_type":             nonNil(st.FailByType),
		}
		if st.Success >= 0 {
			out["success"] = st.Success
			out["skipped"] = st.Skipped
		}
		return writeJSON(a.stdout, out)
	}
	tw := table(a.stdout)
	fmt.Fprintln(tw, "STATUS\tROWS")
	fmt.Fprintf(tw, "WAIT\t%d\n", st.Wait)
	fmt.Fprintf(tw, "SENDING\t%d\n", st.Sending)
	fmt.Fprintf(tw, "FAIL\t%d\n", st.Fail)
	if st.Success >= 0 {
		fmt.Fprintf(tw, "SUCCESS\t%d\n", st.Success)
		fmt.Fprintf(tw, "SKIPPED\t%d\n", st.Skipped)
	} else {
		fmt.Fprintln(tw, "SUCCESS\t- (--count-success)")
		fmt.Fprintln(tw, "SKIPPED\t- (--count-success)")
	}
	fmt.Fprintln(tw, "\t")
	fmt.Fprintf(tw, "due now\t%d\n", st.Due)
	fmt.Fprintf(tw, "oldest due age\t%s\n", roundDur(st.OldestDueAge))
	fmt.Fprintf(tw, "oldest claim age\t%s\n", roundDur(st.OldestClaimAge))
	fmt.Fprintf(tw, "sending past half lease (%s)\t%d\n", *lease/2, st.SendingPastHalfLease)
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.FailByType) > 0 {
		fmt.Fprintln(a.stdout)
		tw = table(a.stdout)
		fmt.Fprintln(tw, "FAIL BY EVENT TYPE\tROWS")
		for _, typ := range slices.Sorted(maps.Keys(st.FailByType)) {
			fmt.Fprintf(tw, "%s\t%d\n", typ, st.FailByType[typ])
		}
		return tw.Flush()
	}
	return nil
}

func nonNil(m map[string]int64) map[string]int64 {
	if m == nil {
		return map[string]int64{}
	}
	return m
}

func roundDur(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// ---- list

// filterFlags are the flags that select rows, shared by list and requeue.
type filterFlags struct {
	status, eventType, bizNo, since, until string
	minID, maxID                           int64
	limit                                  int
	topics                                 topicList
}

// topicList is the --topic flag: given more than once, or as a comma-separated list, it
// keeps the events of any of the topics.
type topicList []string

func (l *topicList) String() string { return strings.Join(*l, ",") }

func (l *topicList) Set(v string) error {
	for t := range strings.SplitSeq(v, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			return usagef("--topic %q: an empty topic name", v)
		}
		*l = append(*l, t)
	}
	return nil
}

func (ff *filterFlags) register(fs *flag.FlagSet, withStatus bool, limitHelp string) {
	if withStatus {
		fs.StringVar(&ff.status, "status", "", "WAIT, SENDING, SUCCESS, FAIL or SKIPPED")
	}
	fs.StringVar(&ff.eventType, "type", "", "event type, exactly")
	fs.StringVar(&ff.bizNo, "biz-no", "", "business key, exactly")
	fs.Var(&ff.topics, "topic", "topic, exactly; repeat it or separate topics by commas for any of them (a row written without one by the topic -route gives its type, else -default-topic)")
	fs.Int64Var(&ff.minID, "min-id", 0, "smallest id (the row's, not the event_id), inclusive")
	fs.Int64Var(&ff.maxID, "max-id", 0, "largest id, inclusive")
	fs.StringVar(&ff.since, "since", "", "created at or after: RFC 3339 or YYYY-MM-DD[ HH:MM:SS] in UTC, or a duration ago (24h)")
	fs.StringVar(&ff.until, "until", "", "created before: as --since")
	fs.IntVar(&ff.limit, "limit", 0, limitHelp)
}

// set reports whether any selecting flag was given.
func (ff *filterFlags) set() bool {
	return ff.status != "" || ff.eventType != "" || ff.bizNo != "" || ff.since != "" || ff.until != "" ||
		ff.minID != 0 || ff.maxID != 0 || len(ff.topics) > 0
}

func (ff *filterFlags) filter(now time.Time) (outbox.Filter, error) {
	f := outbox.Filter{Status: outbox.Status(strings.ToUpper(ff.status)), EventType: ff.eventType, BizNo: ff.bizNo,
		Topics: ff.topics, MinID: ff.minID, MaxID: ff.maxID, Limit: ff.limit}
	var err error
	if f.CreatedSince, err = parseWhen("--since", ff.since, now); err != nil {
		return f, err
	}
	if f.CreatedUntil, err = parseWhen("--until", ff.until, now); err != nil {
		return f, err
	}
	return f, nil
}

// parseWhen reads a point in time: RFC 3339, a UTC date and time, or a duration before now.
func parseWhen(flagName, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, usagef("%s %q: a duration ago must be positive", flagName, s)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, usagef("%s %q is neither a time (2026-01-02T15:04:05Z, 2026-01-02) nor a duration (24h)", flagName, s)
}

// listed is a row as list and show print it in JSON.
type listed struct {
	ID              int64      `json:"id"`
	EventID         string     `json:"event_id"`
	BizNo           string     `json:"biz_no"`
	EventType       string     `json:"event_type"`
	Topic           string     `json:"topic"`
	Status          string     `json:"status"`
	RetryCount      int        `json:"retry_count"`
	ReclaimCount    int        `json:"reclaim_count"`
	NextRetryTime   time.Time  `json:"next_retry_time"`
	DueTime         *time.Time `json:"due_time,omitempty"` // a WAIT event's: not claimed before
	ClaimOwner      string     `json:"claim_owner"`
	ClaimedAt       *time.Time `json:"claimed_at"`
	LastError       string     `json:"last_error"`
	CreateTime      time.Time  `json:"create_time"`
	UpdateTime      time.Time  `json:"update_time"`
	PayloadSize     int        `json:"payload_size"`
	Payload         *string    `json:"payload,omitempty"`
	PayloadEncoding string     `json:"payload_encoding,omitempty"`
	// Failures is the failure history, oldest first (an empty list for none).
	Failures []failure `json:"failures"`
}

// failure is an entry of the failure history as list and show print it in JSON.
type failure struct {
	At       *time.Time `json:"at"` // null for an entry whose time could not be read
	Instance string     `json:"instance"`
	Class    string     `json:"class"`
	Message  string     `json:"message"`
}

func toListed(ev outbox.Event, size int) listed {
	l := listed{ID: ev.ID, EventID: ev.EventID, BizNo: ev.BizNo, EventType: ev.EventType, Topic: ev.Topic, Status: string(ev.Status),
		RetryCount: ev.RetryCount, ReclaimCount: ev.ReclaimCount, NextRetryTime: ev.NextRetryTime.UTC(),
		ClaimOwner: ev.ClaimOwner, LastError: ev.LastError, CreateTime: ev.CreateTime.UTC(), UpdateTime: ev.UpdateTime.UTC(),
		PayloadSize: size, Failures: []failure{}}
	for _, f := range ev.Failures {
		e := failure{Instance: f.Instance, Class: f.Class, Message: f.Message}
		if !f.At.IsZero() {
			t := f.At.UTC()
			e.At = &t
		}
		l.Failures = append(l.Failures, e)
	}
	if !ev.ClaimedAt.IsZero() {
		t := ev.ClaimedAt.UTC()
		l.ClaimedAt = &t
	}
	if ev.Status == outbox.StatusWait {
		t := ev.NextRetryTime.UTC()
		l.DueTime = &t
	}
	return l
}

// due is when a WAIT event is due (its next_retry_time: written with a delay, or a retry's
// backoff), by the database clock; "-" for an event that is not waiting.
func due(ev outbox.Event) string {
	if ev.Status != outbox.StatusWait {
		return "-"
	}
	return stamp(ev.NextRetryTime)
}

func (a *app) list(ctx context.Context, args []string) error {
	fs := a.newFlags("list", "list [--status S] [--type T] [--biz-no B] [--topic T,...] [--min-id N] [--max-id N] [--since T] [--until T] [--limit N] [--json]",
		"Lists events, newest id first, without their payloads (see show). None matching is no\n"+
			"failure: it says so (--json: []) and exits 0.")
	var ff filterFlags
	ff.register(fs, true, "most rows to print (default 100, at most 10000)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	f, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	evs, err := a.admin.List(ctx, f)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make([]listed, len(evs))
		for i, ev := range evs {
			out[i] = toListed(ev.Event, ev.PayloadSize)
		}
		if err := writeJSON(a.stdout, out); err != nil {
			return err
		}
	} else if len(evs) > 0 {
		tw := table(a.stdout)
		fmt.Fprintln(tw, "ID\tSTATUS\tEVENT_TYPE\tBIZ_NO\tTOPIC\tRETRIES\tRECLAIMS\tBYTES\tCREATED (UTC)\tUPDATED (UTC)\tDUE (UTC)\tEVENT_ID\tLAST_ERROR")
		for _, ev := range evs {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", ev.ID, ev.Status, cell(ev.EventType, 40),
				cell(ev.BizNo, 40), ev.Topic, ev.RetryCount, ev.ReclaimCount, ev.PayloadSize, stamp(ev.CreateTime), stamp(ev.UpdateTime),
				due(ev.Event), ev.EventID, cell(ev.LastError, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(evs) == 0 && !*asJSON {
		fmt.Fprintln(a.stdout, "no events match the filter")
	}
	return nil
}

// ---- show

func (a *app) show(ctx context.Context, args []string) error {
	fs := a.newFlags("show", "show ID|EVENT_ID [--json]",
		"Prints one event whole, named by its id (the row's) or its event_id (the UUID consumers see).\n"+
			"The payload is printed as text when it is valid UTF-8, else in hex. Exits 3 when no event has it.\n"+
			"Its failure history (the latest ten failed attempts: time, instance, class, message) is printed\n"+
			"as a table, each message cut to 200 characters (--json: whole).")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("show takes exactly one id or event_id, got %d arguments", len(pos))
	}
	if err := a.perTable(); err != nil {
		return err
	}
	r, err := parseRef(pos[0])
	if err != nil {
		return err
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	var ev outbox.Event
	if r.eventID != "" {
		ev, err = a.admin.GetByEventID(ctx, pos[0])
	} else {
		ev, err = a.admin.Get(ctx, r.id)
	}
	if err != nil {
		return err
	}
	payload, encoding := string(ev.Payload), "text"
	if !utf8.Valid(ev.Payload) {
		payload, encoding = hex.EncodeToString(ev.Payload), "hex"
	}
	if *asJSON {
		l := toListed(ev, len(ev.Payload))
		l.Payload, l.PayloadEncoding = &payload, encoding
		return writeJSON(a.stdout, l)
	}
	claimed := "-"
	if !ev.ClaimedAt.IsZero() {
		claimed = stamp(ev.ClaimedAt)
	}
	tw := table(a.stdout)
	for _, kv := range [][2]string{
		{"id", strconv.FormatInt(ev.ID, 10)},
		{"event_id", ev.EventID},
		{"status", string(ev.Status)},
		{"due (UTC)", due(ev)},
		{"event_type", ev.EventType},
		{"biz_no", ev.BizNo},
		{"topic", ev.Topic},
		{"retry_count", strconv.Itoa(ev.RetryCount)},
		{"reclaim_count", strconv.Itoa(ev.ReclaimCount)},
		{"next_retry_time (UTC)", stamp(ev.NextRetryTime)},
		{"claim_owner", cmpOr(ev.ClaimOwner, "-")},
		{"claimed_at (UTC)", claimed},
		{"create_time (UTC)", stamp(ev.CreateTime)},
		{"update_time (UTC)", stamp(ev.UpdateTime)},
		{"last_error", cmpOr(ev.LastError, "-")},
		{"payload_size", strconv.Itoa(len(ev.Payload))},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], oneLine(kv[1]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := printFailures(a.stdout, ev.Failures); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "payload (%s):\n%s\n", encoding, payload)
	return nil
}

// printFailures prints the failure history as a small table, oldest first, or says there is
// none.
func printFailures(w io.Writer, fs []outbox.Failure) error {
	if len(fs) == 0 {
		_, err := fmt.Fprintln(w, "failures: none")
		return err
	}
	fmt.Fprintf(w, "failures (%d, oldest first):\n", len(fs))
	tw := table(w)
	fmt.Fprintln(tw, "  TIME (UTC)\tINSTANCE\tCLASS\tMESSAGE")
	for _, f := range fs {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", stamp(f.At), cell(f.Instance, 64), cell(f.Class, 16), cell(f.Message, 200))
	}
	return tw.Flush()
}

// ref is an event as a command's argument names it: by id, or by event_id.
type ref struct {
	id      int64
	eventID string // canonical, as the table holds it
}

// parseRef reads an argument that names an event: a UUID is an event_id, a positive
// integer an id.
func parseRef(s string) (ref, error) {
	if u, err := uuid.Parse(s); err == nil {
		return ref{eventID: u.String()}, nil
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return ref{}, usagef("%q is neither an id (a positive integer) nor an event_id (a UUID)", s)
	}
	return ref{id: id}, nil
}

func parseRefs(args []string) ([]ref, error) {
	refs := make([]ref, len(args))
	for i, s := range args {
		var err error
		if refs[i], err = parseRef(s); err != nil {
			return nil, err
		}
	}
	return refs, nil
}

// resolve returns the id of each event refs name, finding event_ids through Admin (the
// table's index on event_id); an event_id no row has is an error wrapping ErrNotFound.
func (a *app) resolve(ctx context.Context, refs []ref) ([]int64, error) {
	var eventIDs []string
	for _, r := range refs {
		if r.eventID != "" {
			eventIDs = append(eventIDs, r.eventID)
		}
	}
	byEventID := map[string]int64{}
	if len(eventIDs) > 0 {
		evs, err := a.admin.List(ctx, outbox.Filter{EventIDs: eventIDs, Limit: 10000})
		if err != nil {
			return nil, fmt.Errorf("look up event_ids: %w", err)
		}
		for _, ev := range evs {
			key := ev.EventID
			if u, err := uuid.Parse(key); err == nil {
				key = u.String() // as parseRef writes it: a row may hold it in upper case
			}
			if other, ok := byEventID[key]; ok {
				return nil, usagef("event_id %s is held by rows %d and %d: name the event by its id", key, other, ev.ID)
			}
			byEventID[key] = ev.ID
		}
	}
	ids := make([]int64, len(refs))
	var missing []string
	for i, r := range refs {
		if r.eventID == "" {
			ids[i] = r.id
			continue
		}
		id, ok := byEventID[r.eventID]
		if !ok {
			missing = append(missing, r.eventID)
		}
		ids[i] = id
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: no event has event_id %s; nothing changed", outbox.ErrNotFound, strings.Join(missing, ", "))
	}
	return ids, nil
}

// ---- requeue

func (a *app) requeue(ctx context.Context, args []string) error {
	fs := a.newFlags("requeue", "requeue ID|EVENT_ID... | requeue [filter flags] (--yes | dry run) [--to-topic TOPIC] [--batch N] [--json]",
		"Returns dead letters (FAIL) to WAIT: retry and reclaim counts reset, due now, claim cleared.\n"+
			"With --to-topic they go to that topic (one of the stores' topics: -default-topic, -topics) instead of their own.\n"+
			"By id or event_id: every one must be a FAIL event, or nothing changes. By filter (at least one filter\n"+
			"flag, or --all): prints how many FAIL events match, and requeues them only with --yes,\n"+
			"in batches, each logged. Only FAIL rows are ever changed. A filter that matches no FAIL event\n"+
			"says so and exits 0; an id or event_id that does not exist exits 3, one that is not FAIL 4.")
	var ff filterFlags
	ff.register(fs, false, "requeue at most this many (default: all that match)")
	all := fs.Bool("all", false, "select every FAIL event (instead of a filter)")
	yes := fs.Bool("yes", false, "requeue; without it, a filter only reports what it would change")
	batch := fs.Int("batch", 500, "rows per statement")
	toTopic := fs.String("to-topic", "", "send them to this `TOPIC`, one of the stores' topics (-default-topic, -topics), instead of their own")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if *batch < 1 || *batch > 10000 {
		return usagef("--batch must be between 1 and 10000, got %d", *batch)
	}
	f, err := ff.filter(time.Now())
	if err != nil {
		return err
	}
	byID := len(pos) > 0
	switch {
	case byID && (ff.set() || *all):
		return usagef("give ids (or event_ids) or a filter, not both")
	case !byID && !ff.set() && !*all:
		return usagef("say which events: ids, a filter (--type, --biz-no, --min-id, --max-id, --since, --until) or --all")
	case byID:
		if err := a.perTable(); err != nil {
			return err
		}
	}
	refs, err := parseRefs(pos)
	if err != nil {
		return err
	}
	if len(refs) > 10000 {
		return usagef("at most 10000 ids at once, got %d", len(refs))
	}
	f.Status = outbox.StatusFail
	if err := a.open(ctx); err != nil {
		return err
	}
	opts := outbox.RequeueOptions{BatchRows: *batch, Topic: *toTopic}
	if byID {
		if f.IDs, err = a.resolve(ctx, refs); err != nil {
			return err
		}
		if err := a.checkFailed(ctx, f.IDs, "requeued"); err != nil {
			return err
		}
	}
	opts.DryRun = true
	n, err := a.admin.RequeueFailed(ctx, f, opts)
	if err != nil {
		return err
	}
	if n == 0 {
		if *asJSON {
			return writeJSON(a.stdout, map[string]any{"matched": 0, "requeued": 0, "dry_run": !byID && !*yes})
		}
		fmt.Fprintln(a.stdout, "no FAIL events match the filter: nothing to requeue")
		return nil
	}
	if !byID && !*yes {
		if *asJSON {
			return writeJSON(a.stdout, map[string]any{"matched": n, "requeued": 0, "dry_run": true})
		}
		fmt.Fprintf(a.stdout, "%d FAIL events match; nothing changed. Run again with --yes to requeue them.\n", n)
		return nil
	}
	batches := 0
	opts.DryRun = false
	opts.OnBatch = func(ids []int64, requeued int64) {
		batches++
		fmt.Fprintf(a.stderr, "%s requeue batch %d: ids %d..%d, %d given, %d requeued\n",
			time.Now().UTC().Format(time.RFC3339), batches, ids[0], ids[len(ids)-1], len(ids), requeued)
	}
	total, err := a.admin.RequeueFailed(ctx, f, opts)
	if err != nil {
		err = fmt.Errorf("after %d requeued in %d whole batches: %w", total, batches, err)
		if batches > 0 {
			err = partial(err)
		}
		return err
	}
	if *asJSON {
		return writeJSON(a.stdout, map[string]any{"matched": n, "requeued": total, "batches": batches, "dry_run": false})
	}
	if *toTopic != "" {
		fmt.Fprintf(a.stdout, "requeued %d of %d matching FAIL events to topic %s in %d batches\n", total, n, *toTopic, batches)
		return nil
	}
	fmt.Fprintf(a.stdout, "requeued %d of %d matching FAIL events in %d batches\n", total, n, batches)
	return nil
}

// checkFailed makes sure every id is a FAIL event, so that a requeue or skip by id changes
// all of them or none; verb names what would have happened, for the error.
func (a *app) checkFailed(ctx context.Context, ids []int64, verb string) error {
	evs, err := a.admin.List(ctx, outbox.Filter{IDs: ids, Limit: 10000})
	if err != nil {
		return err
	}
	status := map[int64]outbox.Status{}
	for _, ev := range evs {
		status[ev.ID] = ev.Status
	}
	var bad []string
	code := exitRefused
	for _, id := range ids {
		switch st, ok := status[id]; {
		case !ok:
			bad = append(bad, fmt.Sprintf("id %d does not exist", id))
			code = exitNotFound
		case st != outbox.StatusFail:
			bad = append(bad, fmt.Sprintf("id %d is %s, not FAIL", id, st))
		}
	}
	if len(bad) > 0 {
		// A missing event is the status: it is the likelier typo, and the others need it fixed first.
		return exitError{code: code, err: fmt.Errorf("nothing %s: %s", verb, strings.Join(bad, "; "))}
	}
	return nil
}

// ---- purge

func (a *app) purge(ctx context.Context, args []string) error {
	fs := a.newFlags("purge", "purge --older-than 720h [--batch 500] [--pause 100ms] [--limit N] (--yes | dry run) [--json]",
		"Deletes SUCCESS (then SKIPPED) events last updated more than --older-than ago, --batch rows per DELETE\n"+
			"with --pause between, each batch logged. WAIT, SENDING and FAIL events are never deleted.\n"+
			"Without --yes it only reports how many it would delete. It refuses to run beside another\n"+
			"purge of the table (a publisher's retention, say). On a table partitioned by RANGE (id)\n"+
			"(MySQLConfig.PartitionIDs) it drops each old partition whose rows are all SUCCESS or SKIPPED\n"+
			"instead, and adds partitions ahead of the ids (docs/retention.md).")
	olderThan := fs.String("older-than", "", "age, e.g. 720h (required)")
	batch := fs.Int("batch", 500, "rows per DELETE, at most 10000")
	pause := fs.Duration("pause", 100*time.Millisecond, "pause between DELETEs")
	limit := fs.Int64("limit", 0, "delete at most this many rows (0: all)")
	yes := fs.Bool("yes", false, "delete; without it, only report how many would go")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if err := noArgs(pos); err != nil {
		return err
	}
	if *olderThan == "" {
		return usagef("--older-than is required, e.g. --older-than 720h")
	}
	age, err := time.ParseDuration(*olderThan)
	if err != nil || age <= 0 {
		return usagef("--older-than %q is not a positive duration (e.g. 720h, 90m)", *olderThan)
	}
	if *batch < 1 || *batch > 10000 {
		return usagef("--batch must be between 1 and 10000, got %d", *batch)
	}
	if *pause < 0 || *limit < 0 {
		return usagef("--pause and --limit must not be negative")
	}
	if err := a.open(ctx); err != nil {
		return err
	}
	opts := outbox.PurgeOptions{BatchRows: *batch, Pause: *pause, Limit: *limit, DryRun: true}
	n, err := a.store.Purge(ctx, age, opts)
	if err != nil {
		return err
	}
	if !*yes {
		if *asJSON {
			return writeJSON(a.stdout, map[string]any{"matched": n, "deleted": 0, "dry_run": true})
		}
		fmt.Fprintf(a.stdout, "%d SUCCESS or SKIPPED events are older than %s; nothing deleted. Run again with --yes to delete them.\n", n, age)
		return nil
	}
	batches := 0
	opts.DryRun, opts.Exclusive = false, true
	opts.OnBatch = func(d int64) {
		batches++
		fmt.Fprintf(a.stderr, "%s purge batch %d: %d deleted\n", time.Now().UTC().Format(time.RFC3339), batches, d)
	}
	deleted, err := a.store.Purge(ctx, age, opts)
	if err != nil {
		return partial(fmt.Errorf("after %d deleted in %d batches: %w", deleted, batches, err))
	}
	if *asJSON {
		return writeJSON(a.stdout, map[string]any{"matched": n, "deleted": deleted, "batches": batches, "dry_run": false})
	}
	fmt.Fprintf(a.stdout, "deleted %d SUCCESS or SKIPPED events older than %s in %d batches\n", deleted, age, batches)
	return nil
}

// ---- output

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

// cell makes s fit one table cell: one line, at most n characters.
func cell(s string, n int) string {
	s = oneLine(s)
	if s == "" {
		return "-"
	}
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
}
