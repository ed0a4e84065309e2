package main

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/go-outbox/outbox/inbox"
)

// Fault kinds.
const (
	faultKill         = "kill"          // SIGKILL a publisher process, start a new one
	faultKillConsumer = "kill-consumer" // SIGKILL an inbox consumer process, start a new one
	faultBroker       = "broker"        // stop a broker, start it again
	faultDB           = "db"            // stop the database server, start it again
	faultDBCrash      = "db-crash"      // SIGKILL the database server, start it again
	faultKillLeader   = "kill-leader"   // relay mode: SIGKILL the process whose relay leads, start a new one
	faultPurge        = "purge"         // relay mode: purge the binary logs while the relay leader is down
)

// faultKinds are the kinds of fault, in the order the reports list them.
var faultKinds = []string{faultKill, faultKillLeader, faultKillConsumer, faultBroker, faultDB, faultDBCrash, faultPurge}

// The default faults of each mode.
var (
	pollingFaults = []string{faultKill, faultKillConsumer, faultBroker, faultDB}
	relayFaults   = []string{faultKillLeader, faultKillConsumer, faultBroker, faultDB, faultDBCrash, faultPurge}
)

// fault is one fault the run injected.
type fault struct {
	Kind   string
	Target string    // the publisher or consumer instance, the broker's name, "database"
	Start  time.Time // the kill, or the stop command started
	// End is when the fault was over: the new publisher or consumer started, or the
	// service answered again (its start command returned).
	End         time.Time
	Replacement string // kill, kill-consumer, kill-leader, purge: the new process's instance id
	Note        string // what the fault found (the leader it killed, the binary logs it purged)
	Err         string // the restart failed
}

// row is one row of the outbox table at the end of the run.
type row struct {
	ID        int64
	EventID   string
	BizNo     string
	Status    string
	Retries   int
	Owner     string
	LastError string
}

// analysisInput is everything the report is computed from.
type analysisInput struct {
	Writers    writerResults
	Rows       []row
	Deliveries []delivery
	Records    []record
	BadLines   int                  // outcome-log lines that did not parse
	Killed     map[string]time.Time // publisher instance -> when it was SIGKILLed
	Lease      time.Duration
	Begin      time.Time // when the writes began: fault times are printed from here
	Faults     []fault
	// SendingAfterStop is the rows still SENDING once every publisher was stopped cleanly.
	SendingAfterStop int

	// CheckEffects: inbox consumers ran, and the effects below are to be checked.
	CheckEffects bool
	Effects      []effect // the effects table
	InboxRecords []record // the consumers' records (kindHandle, kindInboxPrefix + outcome)
	// InboxRejected is the rows of the inbox's rejected table.
	InboxRejected int

	// Relay: relay mode (the records hold the relays' sends and terms, see kindLead);
	// Checkpoint is the relays' checkpoint row at the end, before the publishers stopped.
	Relay      bool
	Checkpoint checkpointRow
	// FaultKinds are the kinds of fault the run was to inject (-faults), for the summary.
	FaultKinds []string
}

// claimTolerance absorbs the gap between a database write and the log line written after it
// returns, when claims are compared in time.
const claimTolerance = 2 * time.Second

// duplicate is an event stored by the broker more than once.
type duplicate struct {
	BizNo   string
	ID      int64
	Copies  int
	Causes  []string // why, one entry per extra copy found
	Records []record // its outcome-log records, in time order
}

func (d duplicate) explained() bool { return len(d.Causes) >= d.Copies-1 }

// overlap is a claim taken while another instance's claim on the row was still live.
type overlap struct {
	ID          int64
	BizNo       string
	First, Then record
}

// faultResult is a fault with its recovery figures; a negative duration is "not seen".
type faultResult struct {
	fault
	FirstSend     time.Duration // from End to the first confirmed send (kill: by the new publisher)
	FirstDelivery time.Duration // from End to the first delivery of a message born after End
	FirstCommit   time.Duration // db: from End to the writers' first commit
	InFlight      int           // kill: rows the killed publisher held with no outcome recorded
	InFlightDone  time.Duration // kill: from the kill until every one of them was acknowledged by another
	FirstEffect   time.Duration // from End to the first effect (committed) of a message born after End
	// kill-consumer: the first effect of the new consumer; the handlers the killed one was
	// in (begun, no outcome, no effect of its own); from the kill until each of their events
	// had its effect from another consumer.
	NewFirstEffect time.Duration
	InHandler      int
	InHandlerDone  time.Duration
	InboxFailed    int // db: deliveries the inbox counted failed from the stop until 5 s after the start
	// Relay mode: the first term a relay began after the fault began and before the next
	// one (kill-leader, purge: another relay than the killed leader), how long after
	// termReference, and the handovers (binlog not followable: the table swept) from the
	// fault's start until the next fault's.
	NewLeader      string
	NewEpoch       int64
	NewLeaderAfter time.Duration
	Handovers      int64
}

// report is the outcome of a run.
type report struct {
	Committed          int // Commit returned nil, plus unknown outcomes found in the table
	CommittedNil       int
	UnknownFound       int // Commit errors whose event is in the table (committed after all)
	UnknownMissing     int // Commit errors whose event is not in the table (rolled back)
	AbortedPresent     int // transactions that failed before Commit, yet their row exists
	MissingRows        int // Commit returned nil, but no row has the biz no
	StrangerRows       int // rows no writer wrote
	Rows               int
	Delivered          int // committed events delivered at least once
	Lost               int // committed events never delivered
	LostByState        map[string]int
	LostSample         []string
	Messages           int // deliveries received in all
	Redeliveries       int // the same stored message delivered again (the consumer's doing)
	DuplicateEvents    int // events stored more than once
	DuplicateCopies    int // the extra copies
	Causes             map[string]int
	Unexplained        []duplicate
	Overlaps           []overlap
	DeadLetters        int
	DeadReasons        map[string]int
	Sending            int // rows SENDING when the run ended, publishers still running
	SendingAfterStop   int
	Waiting            int
	Foreign            int // deliveries of no row of this run
	EventIDMismatch    int // events whose copies carry different eventIds, or eventIds shared by events
	BodyMismatch       int
	BadLines           int
	Sends              map[string]int // send outcomes by kind
	UnknownSendReasons map[string]int
	Faults             []faultResult
	Begin              time.Time

	// The inbox consumers' effects, over every committed event.
	CheckEffects     bool
	EffectRows       int            // rows in the effects table
	EffectsOnce      int            // committed events with exactly one effect row
	EffectsLost      int            // committed events with none
	EffectsDoubled   int            // committed events with more than one
	EffectsStray     int            // effect rows of no committed event, or naming another biz no than its event's
	EffectsByWorker  map[string]int // effect rows by consumer
	EffectsLostEx    []string
	EffectsDoubledEx []string
	InboxOutcomes    map[string]int // deliveries of this run's events by the inbox's outcome
	InboxForeign     int            // deliveries (outcome records) of no row of this run
	HandlersBegun    int            // handler calls for this run's events
	InboxRejected    int            // rows in the rejected table

	// Relay mode.
	FaultKinds     []string
	Relay          bool
	SentByRelay    map[string]int // SUCCESS rows by the relay that marked them (claim_owner)
	SentByPollers  map[string]int // SUCCESS rows by the publisher that acknowledged them
	RelayTerms     map[string]int // terms of leadership by relay
	RelayHandovers int64          // the binlog could not be followed, the table was swept
	RelayResent    int            // extra copies a relay resent after a failover
	RelayResentEv  int            // events with such a copy
	Checkpoint     checkpointRow
}

// failed lists what makes the run fail; empty means it passed.
func (r *report) failed() []string {
	var f []string
	add := func(cond bool, format string, args ...any) {
		if cond {
			f = append(f, fmt.Sprintf(format, args...))
		}
	}
	add(r.Lost > 0, "%d events lost", r.Lost)
	add(r.DeadLetters > 0, "%d dead letters", r.DeadLetters)
	add(r.Sending > 0, "%d rows left SENDING", r.Sending)
	add(r.SendingAfterStop > 0, "%d rows SENDING after the publishers stopped", r.SendingAfterStop)
	add(len(r.Unexplained) > 0, "%d unexplained duplicates", len(r.Unexplained))
	add(len(r.Overlaps) > 0, "%d claims taken while another was live", len(r.Overlaps))
	add(r.EventIDMismatch > 0, "%d events with inconsistent eventIds", r.EventIDMismatch)
	add(r.BodyMismatch > 0, "%d messages whose body does not match their bizNo", r.BodyMismatch)
	if r.CheckEffects {
		add(r.EffectsLost > 0, "%d committed events without an effect", r.EffectsLost)
		add(r.EffectsDoubled > 0, "%d committed events whose effect happened more than once", r.EffectsDoubled)
		add(r.EffectsStray > 0, "%d effect rows of no committed event", r.EffectsStray)
		add(r.InboxRejected > 0 || r.InboxOutcomes[inbox.Rejected.String()] > 0, "%d messages rejected by the inbox (%d rejections counted)",
			r.InboxRejected, r.InboxOutcomes[inbox.Rejected.String()])
	}
	return f
}

// analyze computes the report. It is pure: everything comes from in.
func analyze(in analysisInput) *report {
	r := &report{
		LostByState: map[string]int{}, Causes: map[string]int{}, DeadReasons: map[string]int{},
		Sends: map[string]int{}, UnknownSendReasons: map[string]int{},
		BadLines: in.BadLines, SendingAfterStop: in.SendingAfterStop, Rows: len(in.Rows), Begin: in.Begin,
		FaultKinds: in.FaultKinds,
	}

	rowByBiz := make(map[string]row, len(in.Rows))
	bizByID := make(map[int64]string, len(in.Rows))
	if in.Relay {
		r.Relay, r.Checkpoint = true, in.Checkpoint
		r.SentByRelay, r.SentByPollers = map[string]int{}, map[string]int{}
	}
	for _, rw := range in.Rows {
		if in.Relay && rw.Status == "SUCCESS" {
			if isRelayInstance(rw.Owner) {
				r.SentByRelay[rw.Owner]++
			} else {
				r.SentByPollers[rw.Owner]++
			}
		}
		rowByBiz[rw.BizNo] = rw
		bizByID[rw.ID] = rw.BizNo
		switch rw.Status {
		case "FAIL":
			r.DeadLetters++
			r.DeadReasons[reasonKey(rw.LastError)]++
		case "SENDING":
			r.Sending++
		case "WAIT":
			r.Waiting++
		}
	}

	// What was committed: Commit returned nil, or returned an error and the row exists.
	committed := map[string]bool{}
	written := map[string]bool{}
	for _, c := range in.Writers.Committed {
		committed[c.BizNo] = true
		written[c.BizNo] = true
		if _, ok := rowByBiz[c.BizNo]; !ok {
			r.MissingRows++
		}
	}
	r.CommittedNil = len(in.Writers.Committed)
	for _, b := range in.Writers.Unknown {
		written[b] = true
		if _, ok := rowByBiz[b]; ok {
			committed[b] = true
			r.UnknownFound++
		} else {
			r.UnknownMissing++
		}
	}
	for _, b := range in.Writers.Aborted {
		written[b] = true
		if _, ok := rowByBiz[b]; ok {
			r.AbortedPresent++
		}
	}
	for b := range rowByBiz {
		if !written[b] {
			r.StrangerRows++
		}
	}
	r.Committed = len(committed)

	// Deliveries, grouped by event and by stored message.
	r.Messages = len(in.Deliveries)
	type copies struct {
		stores   map[string]int // stored message -> deliveries
		uniq     map[string]map[string]bool
		eventIDs map[string]bool
	}
	byBiz := map[string]*copies{}
	eventOwner := map[string]string{}
	for _, d := range in.Deliveries {
		if _, ok := rowByBiz[d.BizNo]; !ok {
			r.Foreign++
			continue
		}
		if !d.BodyOK {
			r.BodyMismatch++
		}
		c := byBiz[d.BizNo]
		if c == nil {
			c = &copies{stores: map[string]int{}, uniq: map[string]map[string]bool{}, eventIDs: map[string]bool{}}
			byBiz[d.BizNo] = c
		}
		c.stores[d.Store]++
		if d.UniqKey != "" {
			if c.uniq[d.UniqKey] == nil {
				c.uniq[d.UniqKey] = map[string]bool{}
			}
			c.uniq[d.UniqKey][d.Store] = true
		}
		c.eventIDs[d.EventID] = true
		if o, ok := eventOwner[d.EventID]; ok && o != d.BizNo {
			r.EventIDMismatch++
		}
		eventOwner[d.EventID] = d.BizNo
	}
	for b := range committed {
		if c := byBiz[b]; c != nil {
			r.Delivered++
			continue
		}
		r.Lost++
		state := "no row"
		if rw, ok := rowByBiz[b]; ok {
			state = rw.Status
		}
		r.LostByState[state]++
		if len(r.LostSample) < 10 {
			r.LostSample = append(r.LostSample, b)
		}
	}
	slices.Sort(r.LostSample)

	// The outcome logs, per row, in time order.
	recs := slices.Clone(in.Records)
	slices.SortStableFunc(recs, func(a, b record) int { return a.At.Compare(b.At) })
	byID := map[int64][]record{}
	for _, rec := range recs {
		byID[rec.ID] = append(byID[rec.ID], rec)
		if rec.isSend() {
			r.Sends[rec.Kind]++
			if rec.Kind == kindUnknown {
				r.UnknownSendReasons[reasonKey(rec.Detail)]++
			}
		}
	}

	terms := relayTerms(recs)
	if in.Relay {
		r.RelayTerms = map[string]int{}
		for inst, ts := range terms {
			r.RelayTerms[inst] = len(ts)
			r.RelayHandovers += ts[len(ts)-1].Handovers
		}
	}

	// Duplicates: an event stored more than once, and why.
	for _, b := range slices.Sorted(maps.Keys(byBiz)) {
		c := byBiz[b]
		if len(c.eventIDs) > 1 {
			r.EventIDMismatch++
		}
		n := 0
		for _, k := range c.stores {
			n++
			r.Redeliveries += k - 1
		}
		if n < 2 {
			continue
		}
		d := duplicate{BizNo: b, ID: rowByBiz[b].ID, Copies: n, Records: byID[rowByBiz[b].ID]}
		d.Causes = explain(d.Records, c.uniq, in.Killed, in.Lease)
		d.Causes = append(d.Causes, explainRelay(d.Records, terms)...)
		r.DuplicateEvents++
		r.DuplicateCopies += n - 1
		if !d.explained() {
			r.Unexplained = append(r.Unexplained, d)
			continue
		}
		seen := map[string]bool{}
		if k := countOf(d.Causes, causeRelayResend); k > 0 {
			r.RelayResent += min(k, n-1)
			r.RelayResentEv++
		}
		for _, cause := range d.Causes {
			if !seen[cause] {
				seen[cause] = true
				r.Causes[cause]++
			}
		}
	}

	// Two live claims on one row, duplicate or not.
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		for _, o := range overlaps(byID[id], in.Lease) {
			o.BizNo = bizByID[id]
			r.Overlaps = append(r.Overlaps, o)
		}
	}

	if in.CheckEffects {
		analyzeEffects(r, in, rowByBiz, committed)
	}
	r.Faults = recoveries(in, recs, terms)
	return r
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

// analyzeEffects counts each committed event's effect rows (exactly one each, or the run
// fails) and the inbox's outcomes.
func analyzeEffects(r *report, in analysisInput, rowByBiz map[string]row, committed map[string]bool) {
	r.CheckEffects = true
	r.InboxRejected = in.InboxRejected
	r.EffectRows = len(in.Effects)
	r.EffectsByWorker = map[string]int{}
	r.InboxOutcomes = map[string]int{}
	rowByEvent := make(map[string]row, len(rowByBiz))
	for _, rw := range rowByBiz {
		rowByEvent[rw.EventID] = rw
	}
	perEvent := map[string]int{}
	for _, e := range in.Effects {
		r.EffectsByWorker[e.Consumer]++
		rw, ok := rowByEvent[e.EventID]
		if !ok || rw.BizNo != e.BizNo || !committed[rw.BizNo] {
			r.EffectsStray++
			continue
		}
		perEvent[e.EventID]++
	}
	for _, b := range slices.Sorted(maps.Keys(committed)) {
		n := 0
		if rw, ok := rowByBiz[b]; ok {
			n = perEvent[rw.EventID]
		}
		switch {
		case n == 1:
			r.EffectsOnce++
		case n == 0:
			r.EffectsLost++
			if len(r.EffectsLostEx) < 10 {
				r.EffectsLostEx = append(r.EffectsLostEx, b)
			}
		default:
			r.EffectsDoubled++
			if len(r.EffectsDoubledEx) < 10 {
				r.EffectsDoubledEx = append(r.EffectsDoubledEx, fmt.Sprintf("%s (%d)", b, n))
			}
		}
	}
	for _, rec := range in.InboxRecords {
		if _, ok := rowByBiz[rec.BizNo]; !ok && rec.BizNo != "" {
			r.InboxForeign++
			continue
		}
		if rec.Kind == kindHandle {
			r.HandlersBegun++
		} else if o, ok := strings.CutPrefix(rec.Kind, kindInboxPrefix); ok {
			r.InboxOutcomes[o]++
		}
	}
}

// Causes of a duplicate.
const (
	causeKill        = "reclaim after a kill"
	causeUnknownSend = "unknown send outcome"
	causeAck         = "acknowledgement failed"
	causeClientRetry = "client retry within one send"
	causeRelayResend = "relay resend after a failover"
)

// explain finds the causes of an event's extra copies in its records (in time order), the
// client message ids of its copies, and the publishers killed:
//   - copies that share a client message id came from one SendSync call that the client
//     retried internally after a try whose outcome it did not know;
//   - a send whose outcome was unknown, after which the event was sent again;
//   - a publisher killed while holding the event's claim, after a send that may have reached
//     the broker (sent, unknown, or no outcome logged) and before its acknowledgement: the
//     row was reclaimed after the lease and sent again;
//   - a confirmed send whose acknowledgement failed (the row stayed SENDING and was reclaimed
//     after the lease), or came after the lease had ended and found the row reclaimed.
//
// An acknowledgement that found its lease gone before the lease ended explains nothing:
// that is another instance claiming a live claim. One cause per extra copy: a duplicate
// with fewer causes than extra copies is unexplained.
func explain(recs []record, uniq map[string]map[string]bool, killed map[string]time.Time, lease time.Duration) []string {
	var causes []string
	for _, stores := range uniq {
		for range len(stores) - 1 {
			causes = append(causes, causeClientRetry)
		}
	}
	// Walk each instance's claims of the row: a claim, a send outcome, then a write under the
	// claim (an acknowledgement, a release, a dead letter), which closes it. A claim still
	// open at the end is one its instance never wrote an outcome for: killed while holding it.
	type claimState struct {
		open bool
		at   time.Time // when the claim was taken
		send string    // the send outcome under the claim, if one was logged
	}
	states := map[string]*claimState{}
	closeClaim := func(st *claimState, write record, killed bool) {
		if !st.open {
			return
		}
		st.open = false
		expired := !write.At.Before(st.at.Add(lease - claimTolerance))
		switch {
		case st.send == kindUnknown || st.send == kindSentRetried:
			causes = append(causes, causeUnknownSend)
		case st.send != kindSent:
		case write.Kind == kindAckError:
			causes = append(causes, causeAck)
		case (write.Kind == kindAckLost || write.Kind == kindAckPartial) && expired:
			causes = append(causes, causeAck)
		}
		if write.Kind == "" && killed && (st.send == "" || st.send == kindSent) {
			causes = append(causes, causeKill)
		}
	}
	for _, rec := range recs {
		st := states[rec.Instance]
		if st == nil {
			st = &claimState{}
			states[rec.Instance] = st
		}
		switch {
		case rec.Kind == kindClaim:
			closeClaim(st, record{At: rec.At}, false)
			*st = claimState{open: true, at: rec.At}
		case rec.isSend():
			if st.send == "" || st.send == kindFailed {
				st.send = rec.Kind
			}
		default:
			closeClaim(st, rec, false)
		}
	}
	for _, inst := range slices.Sorted(maps.Keys(states)) {
		_, wasKilled := killed[inst]
		closeClaim(states[inst], record{}, wasKilled)
	}
	return causes
}

// termStart is a term of a relay's leadership, as its kindLead record announced it.
type termStart struct {
	At        time.Time
	Instance  string
	Epoch     int64
	Handovers int64 // the relay process's handovers so far: a term after a handover has one more
}

// relayTerms are the relays' terms, by relay, in time order, from the records (in time
// order).
func relayTerms(recs []record) map[string][]termStart {
	out := map[string][]termStart{}
	for _, rec := range recs {
		if rec.Kind != kindLead {
			continue
		}
		if e, h, ok := parseTerm(rec.Detail); ok {
			out[rec.Instance] = append(out[rec.Instance], termStart{At: rec.At, Instance: rec.Instance, Epoch: e, Handovers: h})
		}
	}
	return out
}

// termAt is the term of relay inst at time t: the last one announced at or before t.
func termAt(terms map[string][]termStart, inst string, t time.Time) (termStart, bool) {
	ts := terms[inst]
	i, _ := slices.BinarySearchFunc(ts, t, func(s termStart, t time.Time) int {
		if s.At.After(t) {
			return 1
		}
		return -1
	})
	if i == 0 {
		return termStart{}, false
	}
	return ts[i-1], true
}

// termReference is when a fault's next term is timed from: a purge's end (the relays were
// paused until then), any other fault's start (a database restart ends the leader's term
// when it stops, and a relay may lead again before the restart command has returned).
func termReference(f fault) time.Time {
	if f.Kind == faultPurge {
		return f.End
	}
	return f.Start
}

// nextTerm is the first term a relay other than except began after t and before until
// (zero: no end).
func nextTerm(terms map[string][]termStart, t, until time.Time, except string) (termStart, bool) {
	var best termStart
	found := false
	for inst, ts := range terms {
		if inst == except {
			continue
		}
		for _, s := range ts {
			if s.At.After(t) {
				if (until.IsZero() || s.At.Before(until)) && (!found || s.At.Before(best.At)) {
					best, found = s, true
				}
				break
			}
		}
	}
	return best, found
}

// handoversBetween counts the handovers the relays' terms announced from from until until
// (zero: no end).
func handoversBetween(terms map[string][]termStart, from, until time.Time) int64 {
	var n int64
	for _, ts := range terms {
		var last int64
		for _, s := range ts {
			if s.At.After(from) && (until.IsZero() || s.At.Before(until)) && s.Handovers > last {
				n += s.Handovers - last
			}
			last = s.Handovers
		}
	}
	return n
}

// explainRelay finds the causes of an event's extra copies in the relays' sends among its
// records (in time order). A relay sends an event that its table row shows WAIT: in the
// binlog's order, from its sweep of the table, or again from its checkpoint after a
// failover (the rows a leader sent and did not mark SUCCESS before it died, lost its lock
// or was deposed). Each copy a relay may have stored (a send sent, sent-retried or
// unknown) that another copy follows explains one extra copy:
//   - an unknown outcome (or a client retry) explains it whoever sent next;
//   - a confirmed send explains it when the next copy came from another term (another
//     relay's, the same relay's after a new epoch or a handover, or a publisher's claim after
//     the publishers took over): resent from the checkpoint or the sweep, same eventId;
//   - a confirmed send followed by a copy from the same term explains nothing: within a
//     term a relay sends each event once.
//
// The publishers' copies are explain's.
func explainRelay(recs []record, terms map[string][]termStart) []string {
	type stored struct {
		kind, session string
		relay         bool
	}
	var copies []stored
	for _, rec := range recs {
		if !rec.isSend() || rec.Kind == kindFailed {
			continue
		}
		c := stored{kind: rec.Kind, session: "claim " + rec.Instance}
		if isRelayInstance(rec.Instance) {
			c.relay = true
			t, _ := termAt(terms, rec.Instance, rec.At)
			c.session = fmt.Sprintf("%s %s", rec.Instance, formatTerm(t.Epoch, t.Handovers))
		}
		copies = append(copies, c)
	}
	var causes []string
	for i := 0; i+1 < len(copies); i++ {
		c := copies[i]
		switch {
		case !c.relay:
		case c.kind != kindSent:
			causes = append(causes, causeUnknownSend)
		case copies[i+1].session != c.session:
			causes = append(causes, causeRelayResend)
		}
	}
	return causes
}

// overlaps finds claims of a row (its records in time order) taken by one instance while
// another's claim was live: not ended by an outcome written under it, and within the lease
// (a killed publisher's claim stays live until the lease ends). The tolerance allows for the
// log line following its database write.
func overlaps(recs []record, lease time.Duration) []overlap {
	type live struct {
		claim record
		until time.Time
	}
	var out []overlap
	open := map[string]*live{}
	for _, rec := range recs {
		if l := open[rec.Instance]; l != nil && rec.endsClaim() {
			l.until = minTime(l.until, rec.At)
			continue
		}
		if rec.Kind != kindClaim {
			continue
		}
		for _, inst := range slices.Sorted(maps.Keys(open)) {
			l := open[inst]
			if inst != rec.Instance && rec.At.Before(l.until.Add(-claimTolerance)) {
				out = append(out, overlap{ID: rec.ID, First: l.claim, Then: rec})
			}
		}
		open[rec.Instance] = &live{claim: rec, until: rec.At.Add(lease)}
	}
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// recoveries computes each fault's recovery figures from the records (in time order), the
// deliveries and the writers' commits.
func recoveries(in analysisInput, recs []record, terms map[string][]termStart) []faultResult {
	out := make([]faultResult, 0, len(in.Faults))
	inboxRecs := slices.Clone(in.InboxRecords)
	slices.SortStableFunc(inboxRecs, func(a, b record) int { return a.At.Compare(b.At) })
	for _, f := range in.Faults {
		fr := faultResult{fault: f, FirstSend: -1, FirstDelivery: -1, FirstCommit: -1, InFlightDone: -1,
			FirstEffect: -1, NewFirstEffect: -1, InHandlerDone: -1, NewLeaderAfter: -1}
		for _, rec := range recs {
			if rec.At.After(f.End) && rec.isSuccessfulSend() && (f.Kind != faultKill || rec.Instance == f.Replacement) {
				fr.FirstSend = rec.At.Sub(f.End)
				break
			}
		}
		var first time.Time
		for _, d := range in.Deliveries {
			if !d.Born.Before(f.End.Truncate(time.Millisecond)) && (first.IsZero() || d.Received.Before(first)) {
				first = d.Received
			}
		}
		if !first.IsZero() {
			fr.FirstDelivery = first.Sub(f.End)
		}
		if in.Relay {
			except := ""
			if f.Kind == faultKillLeader || f.Kind == faultPurge {
				except = relayInstance(f.Target)
			}
			until := time.Time{}
			if i := slices.IndexFunc(in.Faults, func(g fault) bool { return g.Start.After(f.Start) }); i >= 0 {
				until = in.Faults[i].Start
			}
			if t, ok := nextTerm(terms, f.Start, until, except); ok {
				fr.NewLeader, fr.NewEpoch, fr.NewLeaderAfter = t.Instance, t.Epoch, t.At.Sub(termReference(f))
			}
			fr.Handovers = handoversBetween(terms, f.Start, until)
		}
		if f.Kind == faultDB || f.Kind == faultDBCrash {
			for _, c := range in.Writers.Committed {
				if c.At.After(f.End) && (fr.FirstCommit < 0 || c.At.Sub(f.End) < fr.FirstCommit) {
					fr.FirstCommit = c.At.Sub(f.End)
				}
			}
		}
		if f.Kind == faultKill {
			fr.InFlight, fr.InFlightDone = inFlight(recs, f.Target, f.Start)
		}
		for _, e := range in.Effects {
			if !e.At.After(f.End) {
				continue
			}
			d := e.At.Sub(f.End)
			if !e.Born.Before(f.End.Truncate(time.Millisecond)) && (fr.FirstEffect < 0 || d < fr.FirstEffect) {
				fr.FirstEffect = d
			}
			if f.Kind == faultKillConsumer && e.Consumer == f.Replacement && (fr.NewFirstEffect < 0 || d < fr.NewFirstEffect) {
				fr.NewFirstEffect = d
			}
		}
		if f.Kind == faultKillConsumer {
			fr.InHandler, fr.InHandlerDone = inHandler(inboxRecs, in.Effects, f.Target, f.Start)
		}
		if f.Kind == faultDB || f.Kind == faultDBCrash {
			for _, rec := range inboxRecs {
				if rec.Kind == kindInboxPrefix+inbox.Failed.String() && !rec.At.Before(f.Start) && rec.At.Before(f.End.Add(5*time.Second)) {
					fr.InboxFailed++
				}
			}
		}
		out = append(out, fr)
	}
	return out
}

// inFlight finds the rows the killed instance held when it was killed (claimed, with no
// outcome written under the claim) and how long after the kill the last of them was
// acknowledged by another instance (-1: not all were).
func inFlight(recs []record, inst string, killedAt time.Time) (int, time.Duration) {
	held := map[int64]bool{}
	for _, rec := range recs {
		if rec.Instance != inst || rec.At.After(killedAt) {
			continue
		}
		switch {
		case rec.Kind == kindClaim:
			held[rec.ID] = true
		case rec.endsClaim():
			delete(held, rec.ID)
		}
	}
	if len(held) == 0 {
		return 0, 0
	}
	done := map[int64]time.Time{}
	for _, rec := range recs {
		if held[rec.ID] && rec.Kind == kindAck && rec.Instance != inst && rec.At.After(killedAt) {
			if _, ok := done[rec.ID]; !ok {
				done[rec.ID] = rec.At
			}
		}
	}
	if len(done) < len(held) {
		return len(held), -1
	}
	var last time.Time
	for _, t := range done {
		if t.After(last) {
			last = t
		}
	}
	return len(held), last.Sub(killedAt)
}

// inHandler finds the events the killed consumer was handling when it was killed (the
// handler began, with no outcome counted after it and no effect of the consumer's own: its
// transaction was rolled back by the kill) and how long after the kill the last of them had
// its effect from another consumer (-1: not all did). recs are in time order.
func inHandler(recs []record, effects []effect, inst string, killedAt time.Time) (int, time.Duration) {
	open := map[string]bool{} // event ids
	for _, rec := range recs {
		if rec.Instance != inst || rec.At.After(killedAt) {
			continue
		}
		switch {
		case rec.Kind == kindHandle:
			open[rec.Detail] = true
		case strings.HasPrefix(rec.Kind, kindInboxPrefix):
			delete(open, rec.Detail)
		}
	}
	for _, e := range effects {
		if e.Consumer == inst {
			delete(open, e.EventID) // it committed before the kill, and the kill came before its count
		}
	}
	if len(open) == 0 {
		return 0, 0
	}
	done := map[string]time.Time{}
	for _, e := range effects {
		if open[e.EventID] && e.Consumer != inst {
			if t, ok := done[e.EventID]; !ok || e.At.Before(t) {
				done[e.EventID] = e.At
			}
		}
	}
	if len(done) < len(open) {
		return len(open), -1
	}
	var last time.Time
	for _, t := range done {
		if t.After(last) {
			last = t
		}
	}
	return len(open), last.Sub(killedAt)
}

// reasonKey shortens an error for grouping.
func reasonKey(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	if s == "" {
		return "(no reason recorded)"
	}
	return s
}

// print writes the report.
func (r *report) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(name string, v int, note string) { fmt.Fprintf(tw, "  %s\t%d\t%s\n", name, v, note) }
	must0 := func(v int) string {
		if v == 0 {
			return "must be 0: ok"
		}
		return "must be 0: FAILED"
	}
	line("events committed", r.Committed, fmt.Sprintf("Commit nil %d, Commit error but in the table %d (not in it: %d)",
		r.CommittedNil, r.UnknownFound, r.UnknownMissing))
	line("delivered (distinct)", r.Delivered, fmt.Sprintf("%d messages received in all", r.Messages))
	lostNote := must0(r.Lost)
	if r.Lost > 0 {
		lostNote += "; by row status: " + countList(r.LostByState)
	}
	line("lost", r.Lost, lostNote)
	line("duplicates", r.DuplicateCopies, fmt.Sprintf("extra copies stored, of %d events; causes seen (events with each): %s",
		r.DuplicateEvents, orNone(countList(r.Causes))))
	if r.Relay {
		line("duplicates resent by the relay", r.RelayResent, fmt.Sprintf("of %d events: resent from the checkpoint or the sweep after a relay failover or purge (same eventId)", r.RelayResentEv))
	}
	line("unexplained duplicates", len(r.Unexplained), must0(len(r.Unexplained)))
	line("claims overlapping a live claim", len(r.Overlaps), must0(len(r.Overlaps)))
	deadNote := must0(r.DeadLetters)
	if r.DeadLetters > 0 {
		deadNote += "; reasons: " + countList(r.DeadReasons)
	}
	line("dead letters (FAIL)", r.DeadLetters, deadNote)
	line("rows left SENDING", r.Sending, must0(r.Sending)+fmt.Sprintf("; after the publishers stopped: %d", r.SendingAfterStop))
	line("rows left WAIT", r.Waiting, "")
	line("consumer redeliveries", r.Redeliveries, "the same stored message delivered again: not a second send")
	line("eventId inconsistent", r.EventIDMismatch, must0(r.EventIDMismatch))
	line("bodies not matching bizNo", r.BodyMismatch, must0(r.BodyMismatch))
	line("send outcomes", r.Sends[kindSent]+r.Sends[kindSentRetried]+r.Sends[kindFailed]+r.Sends[kindUnknown], countList(r.Sends))
	if r.Relay {
		line("rows sent by the relay", sum(r.SentByRelay), "SUCCESS rows whose claim_owner is a relay's: "+orNone(countList(r.SentByRelay)))
		line("rows sent by the publishers", sum(r.SentByPollers), "SUCCESS rows a polling publisher acknowledged (they stand by while a relay leads): "+orNone(countList(r.SentByPollers)))
		line("relay leader terms", sum(r.RelayTerms), fmt.Sprintf("by relay: %s; handovers (binlog not followable: the table swept) %d; checkpoint row at the end: %s",
			orNone(countList(r.RelayTerms)), r.RelayHandovers, describeCheckpoint(r.Checkpoint)))
	}
	if r.CheckEffects {
		line("effects (inbox consumers)", r.EffectsOnce, fmt.Sprintf("effects: %d committed, lost %d, doubled %d; %d effect rows, by consumer: %s",
			r.Committed, r.EffectsLost, r.EffectsDoubled, r.EffectRows, orNone(countList(r.EffectsByWorker))))
		line("effects lost (0 rows)", r.EffectsLost, must0(r.EffectsLost))
		line("effects doubled (>1 rows)", r.EffectsDoubled, must0(r.EffectsDoubled))
		line("duplicates suppressed (inbox)", r.InboxOutcomes[inbox.Duplicate.String()],
			"deliveries by the inbox's outcome (inbox.messages): "+orNone(countList(r.InboxOutcomes)))
		line("rejected by the inbox", r.InboxRejected, must0(r.InboxRejected)+" (rows in its rejected table)")
		line("handlers rolled back", r.HandlersBegun-(r.EffectRows-r.EffectsStray),
			fmt.Sprintf("of %d begun: killed mid-handler, or the database failed (each redelivered)", r.HandlersBegun))
		if r.EffectsStray > 0 {
			line("effect rows of no committed event", r.EffectsStray, must0(r.EffectsStray))
		}
	}
	if r.AbortedPresent+r.MissingRows+r.StrangerRows+r.Foreign+r.BadLines+r.InboxForeign > 0 {
		line("rows of failed transactions", r.AbortedPresent, "")
		line("committed rows missing", r.MissingRows, "")
		line("rows no writer wrote", r.StrangerRows, "")
		line("messages of no row", r.Foreign, "")
		line("outcome-log lines unreadable", r.BadLines, "")
		line("inbox deliveries of no row", r.InboxForeign, "")
	}
	_ = tw.Flush()
	if len(r.UnknownSendReasons) > 0 {
		fmt.Fprintf(w, "  unknown send outcomes: %s\n", countList(r.UnknownSendReasons))
	}
	if len(r.LostSample) > 0 {
		fmt.Fprintf(w, "  lost, e.g.: %s\n", strings.Join(r.LostSample, " "))
	}
	if len(r.EffectsLostEx) > 0 {
		fmt.Fprintf(w, "  effects lost, e.g.: %s\n", strings.Join(r.EffectsLostEx, " "))
	}
	if len(r.EffectsDoubledEx) > 0 {
		fmt.Fprintf(w, "  effects doubled (rows), e.g.: %s\n", strings.Join(r.EffectsDoubledEx, " "))
	}
	for i, d := range r.Unexplained {
		if i == 20 {
			fmt.Fprintf(w, "  ... and %d more unexplained duplicates\n", len(r.Unexplained)-i)
			break
		}
		fmt.Fprintf(w, "  unexplained duplicate %s (row %d): %d copies, causes found %v\n", d.BizNo, d.ID, d.Copies, d.Causes)
		for _, rec := range d.Records {
			fmt.Fprintf(w, "      %s %-6s %-13s %s\n", rec.At.Format("15:04:05.000"), rec.Instance, rec.Kind, rec.Detail)
		}
	}
	for i, o := range r.Overlaps {
		if i == 20 {
			fmt.Fprintf(w, "  ... and %d more overlapping claims\n", len(r.Overlaps)-i)
			break
		}
		fmt.Fprintf(w, "  overlapping claim on %s (row %d): %s claimed at %s, %s at %s\n", o.BizNo, o.ID,
			o.First.Instance, o.First.At.Format("15:04:05.000"), o.Then.Instance, o.Then.At.Format("15:04:05.000"))
	}

	if len(r.Faults) == 0 {
		return
	}
	fmt.Fprintln(w, "\nfaults (recovery from the fault's end: the new publisher or consumer started, or the service answered again)")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tat\tfault\tdown\tfirst send\tfirst delivery\tfirst effect\tnotes\t")
	start := r.Begin
	if start.IsZero() {
		start = r.Faults[0].Start
	}
	for i, f := range r.Faults {
		notes := ""
		switch f.Kind {
		case faultKill:
			switch {
			case f.InFlight == 0:
				notes = fmt.Sprintf("new %s; it held no rows", f.Replacement)
			case f.InFlightDone < 0:
				notes = fmt.Sprintf("new %s; it held %d rows, not all sent by another", f.Replacement, f.InFlight)
			default:
				notes = fmt.Sprintf("new %s; it held %d rows, all SUCCESS %s after the kill", f.Replacement, f.InFlight, dur(f.InFlightDone))
			}
		case faultKillConsumer:
			notes = fmt.Sprintf("new %s (its first effect %s); ", f.Replacement, dur(f.NewFirstEffect))
			switch {
			case f.InHandler == 0:
				notes += "it was in no handler"
			case f.InHandlerDone < 0:
				notes += fmt.Sprintf("it was in %d handlers, not all their events done by another", f.InHandler)
			default:
				notes += fmt.Sprintf("it was in %d handlers (rolled back), their effects done by another %s after the kill", f.InHandler, dur(f.InHandlerDone))
			}
		case faultDB, faultDBCrash:
			notes = "writers' first commit " + dur(f.FirstCommit)
			if r.CheckEffects {
				notes += fmt.Sprintf("; %d deliveries failed in the consumers (redelivered)", f.InboxFailed)
			}
		}
		if (f.Kind == faultKillLeader || f.Kind == faultPurge) && f.Replacement != "" {
			notes = "new " + f.Replacement
		}
		if f.Note != "" {
			notes = joinNotes(notes, f.Note)
		}
		if r.Relay {
			from := map[string]string{faultKillLeader: "the kill", faultPurge: "the publishers resumed", faultDB: "the database stopped",
				faultDBCrash: "the crash"}[f.Kind]
			if from == "" {
				from = "the fault began"
			}
			// A fault that ends the leader's term (its process killed, its database connections
			// lost) is followed by a new term before the next fault; the others may be.
			endsTerm := f.Kind == faultKillLeader || f.Kind == faultPurge || f.Kind == faultDB || f.Kind == faultDBCrash
			switch {
			case f.NewLeader != "":
				notes = joinNotes(notes, fmt.Sprintf("%s led (epoch %d) %s after %s", f.NewLeader, f.NewEpoch, dur(f.NewLeaderAfter), from))
			case endsTerm:
				notes = joinNotes(notes, "no relay led after it")
			}
			if f.Handovers > 0 || f.Kind == faultPurge {
				notes = joinNotes(notes, fmt.Sprintf("handovers (table swept) %d", f.Handovers))
			}
		}
		if f.Err != "" {
			notes += "; restart failed: " + firstLine(f.Err)
		}
		fmt.Fprintf(tw, "%d\t+%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", i+1, f.Start.Sub(start).Round(time.Second), describe(f.fault),
			dur(f.End.Sub(f.Start)), dur(f.FirstSend), dur(f.FirstDelivery), effectDur(r.CheckEffects, f.FirstEffect), notes)
	}
	_ = tw.Flush()

	fmt.Fprintln(w, "\ntime to recover, worst of each kind")
	kinds := slices.DeleteFunc(slices.Clone(faultKinds), func(k string) bool {
		return !slices.Contains(r.FaultKinds, k) && !slices.ContainsFunc(r.Faults, func(f faultResult) bool { return f.Kind == k })
	})
	for _, kind := range kinds {
		var n, held, handling int
		var send, deliv, eff, inflight, inhandler time.Duration
		for _, f := range r.Faults {
			if f.Kind != kind {
				continue
			}
			n++
			send, deliv, eff = worst(send, f.FirstSend), worst(deliv, f.FirstDelivery), worst(eff, f.FirstEffect)
			if f.InFlight > 0 {
				held += f.InFlight
				inflight = worst(inflight, f.InFlightDone)
			}
			if f.InHandler > 0 {
				handling += f.InHandler
				inhandler = worst(inhandler, f.InHandlerDone)
			}
		}
		if n == 0 {
			fmt.Fprintf(w, "  %-18s not injected\n", kindName(kind))
			continue
		}
		extra := ""
		if r.CheckEffects {
			extra = ", first effect " + dur(eff)
		}
		switch kind {
		case faultKill:
			if held == 0 {
				extra += "; no kill caught a row in flight"
			} else {
				extra += fmt.Sprintf("; the %d rows held by killed publishers SUCCESS after %s", held, dur(inflight))
			}
		case faultKillConsumer:
			if handling == 0 {
				extra += "; no kill caught a handler"
			} else {
				extra += fmt.Sprintf("; the %d events in handlers of killed consumers done by another after %s", handling, dur(inhandler))
			}
		}
		fmt.Fprintf(w, "  %-18s %d× : first send %s, first delivery %s%s\n", kindName(kind), n, dur(send), dur(deliv), extra)
	}
}

// worst keeps the larger duration, where a negative one (never seen) is the worst of all.
func worst(a, b time.Duration) time.Duration {
	if a < 0 || b < 0 {
		return -1
	}
	return max(a, b)
}

func joinNotes(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func kindName(kind string) string {
	switch kind {
	case faultKillLeader:
		return "kill relay leader"
	case faultDBCrash:
		return "crash database"
	case faultPurge:
		return "purge binlog"
	case faultKill:
		return "kill publisher"
	case faultKillConsumer:
		return "kill consumer"
	case faultBroker:
		return "restart broker"
	case faultDB:
		return "restart database"
	}
	return kind
}

func describe(f fault) string {
	switch f.Kind {
	case faultKillLeader:
		return "kill leader " + f.Target
	case faultDBCrash:
		return "crash database"
	case faultPurge:
		if f.Target != "" {
			return "purge binlog, kill " + f.Target
		}
		return "purge binlog"
	case faultKill, faultKillConsumer:
		return "kill " + f.Target
	case faultBroker:
		return "restart " + f.Target
	case faultDB:
		return "restart database"
	}
	return f.Kind
}

// effectDur is dur, or "-" where no effects were checked.
func effectDur(checked bool, d time.Duration) string {
	if !checked {
		return "-"
	}
	return dur(d)
}

func dur(d time.Duration) string {
	switch {
	case d < 0:
		return "never"
	case d < 10*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func countList(m map[string]int) string {
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if m[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}
