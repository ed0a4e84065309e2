package outboxtest

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/eventrules"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// MemoryStore is an [outbox.Store] that keeps its events in memory, for a service's unit
// tests: a real [outbox.Publisher] runs over it in milliseconds, with no database and no
// broker (pair it with a [MemorySender]). The business code's transaction is not the real
// one: the test writes the events with [MemoryStore.Insert], which checks them as
// [outbox.Tx.InsertEvent] does and writes them all or none. It keeps the whole Store
// contract, as [RunStoreTests] holds it, in each [outbox.Ordering]: the claims, the leases
// and their reclaims, key order, the failure history, the wake-up after an insert, the
// retention's purge and the gauges' stats; what it cannot show is the database's part
// (locks, a commit's outcome lost, the SQL of other writers).
//
// Every time it writes or compares is by its own clock ([MemoryStoreOptions.Now]), except
// [outbox.EventRead.At], which the contract dates by the process's clock. It starts no
// goroutine and holds nothing to close. It is safe for concurrent use: each method is
// atomic, as one statement of a database is.
type MemoryStore struct {
	ordering outbox.Ordering
	routes   outbox.Routes
	topics   []string // every topic, the default first
	known    map[string]bool
	clock    func() time.Time

	mu     sync.Mutex
	rows   map[int64]*outbox.Event
	byKey  map[string][]int64 // each biz no's ids, ascending
	nextID int64
	subs   map[int]chan struct{}
	subSeq int
	purge  sync.Mutex // held by an Exclusive purge
}

// MemoryStoreOptions configures a [MemoryStore]. The zero value is an unordered store
// whose events all go to "ORDER_EVENT_TOPIC", by the process's clock.
type MemoryStoreOptions struct {
	// Ordering is the order the store claims in, as [outbox.MySQLConfig.Ordering] says.
	// Defaults to [outbox.Unordered].
	Ordering outbox.Ordering
	// Topic is the default topic: where an event goes that names none, as
	// [outbox.Routes.Topic]. Defaults to "ORDER_EVENT_TOPIC", as the MySQL store's.
	Topic string
	// Topics are the other topics an event may name ([outbox.EventInput.Topic]), as
	// [outbox.Routes.Topics]: Insert refuses any topic outside Topic and these.
	Topics []string
	// Now is the store's clock, which every time it writes and every due time and lease it
	// judges is read from; a test that moves it moves the store's time without waiting.
	// Defaults to time.Now.
	Now func() time.Time
}

// NewMemoryStore returns an empty MemoryStore. It panics on options no store could serve
// (an unknown Ordering, a topic name the broker refuses, a topic named twice), as a test's
// mistake, not a condition to handle.
func NewMemoryStore(opts MemoryStoreOptions) *MemoryStore {
	switch opts.Ordering {
	case outbox.Unordered, outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters:
	default:
		panic(fmt.Sprintf("outboxtest: NewMemoryStore: unknown ordering %v", opts.Ordering))
	}
	def := cmp.Or(opts.Topic, outbox.Routes{}.TopicOf(outbox.Event{})) // the MySQL store's default
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &MemoryStore{
		ordering: opts.Ordering,
		routes:   outbox.Routes{Topic: def},
		topics:   []string{def},
		known:    map[string]bool{},
		clock:    opts.Now,
		rows:     map[int64]*outbox.Event{},
		byKey:    map[string][]int64{},
		subs:     map[int]chan struct{}{},
	}
	s.topics = append(s.topics, opts.Topics...)
	for _, t := range s.topics {
		if err := eventrules.TopicName(t); err != nil {
			panic("outboxtest: NewMemoryStore: topic " + err.Error())
		}
		if s.known[t] {
			panic(fmt.Sprintf("outboxtest: NewMemoryStore: topic %q is named twice", t))
		}
		s.known[t] = true
	}
	return s
}

// now reads the store's clock, in UTC and whole milliseconds as the MySQL store's times
// are (UTC_TIMESTAMP(3)).
func (s *MemoryStore) now() time.Time { return s.clock().UTC().Truncate(time.Millisecond) }

// lock takes the store's lock for one of its methods, unless ctx is done, and returns the
// store's now; the method unlocks s.mu.
func (s *MemoryStore) lock(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	s.mu.Lock()
	return s.now(), nil
}

// Insert writes evs as WAIT events, all or none, as a business transaction that calls
// [outbox.Tx.InsertEvent] for each and commits, and returns them as written (row id, event
// id, topic, times), in the order of evs. Each event is checked as InsertEvent checks it: a
// biz no and an event type of 1 to 64 printable characters without spaces (and no event
// type "*" or one with "||", which no RocketMQ subscription can name), a payload of 1 byte
// to 4 MiB, a Delay that is not negative or a NotBefore (not both), and a topic of the
// store's or none; an invalid event is refused with an error wrapping
// [outbox.ErrInvalidEvent], and nothing is written. Each event gets a new UUIDv7 as its
// event id, the W3C trace context of the span in ctx if there is one, and its due time by
// the store's clock. The insert wakes the store's subscribers (the publishers over it) when
// an event is due at once; a delayed event is found by their next poll.
func (s *MemoryStore) Insert(ctx context.Context, evs ...outbox.EventInput) ([]outbox.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i, ev := range evs {
		if err := s.validate(ev); err != nil {
			return nil, fmt.Errorf("outboxtest: insert event %d: %w", i, err)
		}
	}
	eventIDs := make([]string, len(evs))
	for i := range evs {
		u, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("outboxtest: insert event: generate the event id: %w", err)
		}
		eventIDs[i] = u.String()
	}
	parent, state := traceContext(ctx)

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	out := make([]outbox.Event, len(evs))
	due := false
	for i, in := range evs {
		s.nextID++
		ev := &outbox.Event{
			ID: s.nextID, EventID: eventIDs[i], BizNo: in.BizNo, EventType: in.EventType,
			Payload: bytes.Clone(in.Payload), Status: outbox.StatusWait,
			NextRetryTime: dueTime(now, in), CreateTime: now, UpdateTime: now,
			TraceParent: parent, TraceState: state,
			Topic: s.routes.TopicOf(outbox.Event{Topic: in.Topic, EventType: in.EventType}),
		}
		s.rows[ev.ID] = ev
		s.byKey[ev.BizNo] = append(s.byKey[ev.BizNo], ev.ID)
		out[i] = copyEvent(*ev)
		due = due || !ev.NextRetryTime.After(now)
	}
	if due {
		s.notifyLocked()
	}
	return out, nil
}

// validate checks an event as [outbox.Tx.InsertEvent] does, by the same rules, and that
// its topic is one of the store's.
func (s *MemoryStore) validate(ev outbox.EventInput) error {
	if err := eventrules.Check(ev.BizNo, ev.EventType, ev.Delay, ev.NotBefore); err != nil {
		return err
	}
	if ev.Topic != "" && !s.known[ev.Topic] {
		return fmt.Errorf("%w: topic %.140q is not one of the store's topics (%s)", outbox.ErrInvalidEvent, ev.Topic, strings.Join(s.topics, ", "))
	}
	return eventrules.Payload(len(ev.Payload), defaultMaxMessageBytes)
}

// dueTime is when an event inserted at now is due: at once, after its Delay, or at its
// NotBefore if that has not passed (either rounded up to the millisecond).
func dueTime(now time.Time, in outbox.EventInput) time.Time {
	switch {
	case in.Delay > 0:
		return eventrules.CeilMilli(now.Add(in.Delay))
	case !in.NotBefore.IsZero():
		if at := eventrules.CeilMilli(in.NotBefore.UTC()); at.After(now) {
			return at
		}
	}
	return now
}

// traceContext returns the W3C trace context of the span in ctx, as InsertEvent stores it.
func traceContext(ctx context.Context) (parent, state string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, c)
	return c.Get("traceparent"), c.Get("tracestate")
}

// Get returns a copy of the event whose row id is id, as it stands, or ok false if there
// is none (it was never written, or was purged).
func (s *MemoryStore) Get(id int64) (ev outbox.Event, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.rows[id]
	if !ok {
		return outbox.Event{}, false
	}
	return copyEvent(*r), true
}

// Events returns a copy of every event the store holds, in id order (the order of their
// inserts).
func (s *MemoryStore) Events() []outbox.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]outbox.Event, 0, len(s.rows))
	for _, id := range slices.Sorted(maps.Keys(s.rows)) {
		out = append(out, copyEvent(*s.rows[id]))
	}
	return out
}

// Check implements [outbox.Store]: the store's ordering and its topics, the default first.
func (s *MemoryStore) Check(ctx context.Context) (outbox.StoreInfo, error) {
	return outbox.StoreInfo{Ordering: s.ordering, Topics: slices.Clone(s.topics)}, ctx.Err()
}

// done reports whether an event no longer holds its key's later events back: SUCCESS,
// SKIPPED and, in KeyOrderSkipDeadLetters, FAIL.
func (s *MemoryStore) done(ev *outbox.Event) bool {
	switch ev.Status {
	case outbox.StatusSuccess, outbox.StatusSkipped:
		return true
	case outbox.StatusFail:
		return s.ordering == outbox.KeyOrderSkipDeadLetters
	}
	return false
}

// dueLocked reports whether ev is WAIT and due at now.
func dueLocked(ev *outbox.Event, now time.Time) bool {
	return ev.Status == outbox.StatusWait && !ev.NextRetryTime.After(now)
}

// freeLocked reports whether, in key order, every earlier event of ev's biz no is done
// (always true unordered).
func (s *MemoryStore) freeLocked(ev *outbox.Event) bool {
	if s.ordering == outbox.Unordered {
		return true
	}
	for _, id := range s.byKey[ev.BizNo] {
		if id >= ev.ID {
			return true
		}
		if !s.done(s.rows[id]) {
			return false
		}
	}
	return true
}

// claimableLocked returns the due WAIT events a claim may take now, oldest next retry time
// first (then by id): in key order, only each key's first event not done.
func (s *MemoryStore) claimableLocked(now time.Time) []*outbox.Event {
	var out []*outbox.Event
	for _, ev := range s.rows {
		if dueLocked(ev, now) && s.freeLocked(ev) {
			out = append(out, ev)
		}
	}
	slices.SortFunc(out, func(a, b *outbox.Event) int {
		if c := a.NextRetryTime.Compare(b.NextRetryTime); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out
}

// read returns a copy of ev as a claim hands it out, its read dated.
func read(ev *outbox.Event, now time.Time) outbox.Event {
	c := copyEvent(*ev)
	c.Failures = nil // the claims do not read the history
	c.Read = outbox.EventRead{At: time.Now(), Age: now.Sub(ev.CreateTime)}
	if ev.UpdateTime.Equal(ev.CreateTime) {
		c.Read.Deferred = max(0, ev.NextRetryTime.Sub(ev.CreateTime))
	}
	return c
}

// Candidates implements [outbox.Store]: up to limit due WAIT events, oldest next retry time
// first; in key order, only each key's first event not done.
func (s *MemoryStore) Candidates(ctx context.Context, limit int) ([]outbox.Event, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	evs := s.claimableLocked(now)
	n := min(max(limit, 0), len(evs))
	out := make([]outbox.Event, 0, n)
	for _, ev := range evs[:n] {
		out = append(out, read(ev, now))
	}
	return out, nil
}

// claimLocked makes owner the holder of ev's lease at now.
func claimLocked(ev *outbox.Event, owner string, now time.Time) {
	ev.Status, ev.ClaimOwner, ev.ClaimedAt, ev.UpdateTime = outbox.StatusSending, owner, now, now
}

// Claim implements [outbox.Store]: it takes ev's lease for owner if the event is still WAIT,
// due and at ev.RetryCount, and, in key order, every earlier event of its biz no is done.
func (s *MemoryStore) Claim(ctx context.Context, ev outbox.Event, owner string) (bool, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	r, ok := s.rows[ev.ID]
	if !ok || !dueLocked(r, now) || r.RetryCount != ev.RetryCount || !s.freeLocked(r) {
		return false, nil
	}
	claimLocked(r, owner, now)
	return true, nil
}

// ClaimDue implements [outbox.Store]. It records req.Succeeded first, then takes the due
// events oldest first, up to req.Limit and req.MaxBytes (the first always), stopping before
// a reclaimed event, which it takes alone when it comes first. In key order it takes each
// key's first event not done and the key's due WAIT events right behind it, in id order.
func (s *MemoryStore) ClaimDue(ctx context.Context, req outbox.ClaimRequest) (outbox.ClaimResult, error) {
	if req.Limit <= 0 || req.MaxBytes <= 0 {
		return outbox.ClaimResult{}, fmt.Errorf("outboxtest: claim due events: Limit (%d) and MaxBytes (%d) must be positive", req.Limit, req.MaxBytes)
	}
	now, err := s.lock(ctx)
	if err != nil {
		return outbox.ClaimResult{}, err
	}
	defer s.mu.Unlock()
	var res outbox.ClaimResult
	res.Succeeded = s.markSuccessLocked(req.Succeeded, req.Owner, now)

	var (
		taken []*outbox.Event
		total int
	)
	// add takes ev if the claim may; it reports false when the claim stops there.
	add := func(ev *outbox.Event) bool {
		if len(taken) == req.Limit || len(taken) > 0 && (ev.ReclaimCount > 0 || total+len(ev.Payload) > req.MaxBytes) {
			res.More = true
			return false
		}
		taken = append(taken, ev)
		total += len(ev.Payload)
		if ev.ReclaimCount > 0 {
			res.More = true // a reclaimed event goes alone
			return false
		}
		return true
	}
heads:
	for _, head := range s.claimableLocked(now) {
		if !add(head) {
			break
		}
		if s.ordering == outbox.Unordered {
			continue
		}
		ids := s.byKey[head.BizNo]
		at, _ := slices.BinarySearch(ids, head.ID)
		for _, id := range ids[at+1:] {
			ev := s.rows[id]
			if s.done(ev) {
				continue
			}
			if !dueLocked(ev, now) || ev.ReclaimCount > 0 {
				break // the run ends here; a reclaimed event waits to be taken alone
			}
			if !add(ev) {
				break heads
			}
		}
	}
	for _, ev := range taken {
		r := read(ev, now) // before the claim touches the row (Read.Deferred)
		claimLocked(ev, req.Owner, now)
		r.Status, r.ClaimOwner, r.ClaimedAt, r.UpdateTime = ev.Status, ev.ClaimOwner, ev.ClaimedAt, ev.UpdateTime
		res.Events = append(res.Events, r)
	}
	return res, nil
}

// markSuccessLocked marks SUCCESS the events of ids that owner holds, or that are SUCCESS
// under its claim already, and returns how many.
func (s *MemoryStore) markSuccessLocked(ids []int64, owner string, now time.Time) int64 {
	var n int64
	seen := make(map[int64]bool, len(ids))
	for _, id := range ids {
		ev, ok := s.rows[id]
		if !ok || seen[id] || ev.ClaimOwner != owner || (ev.Status != outbox.StatusSending && ev.Status != outbox.StatusSuccess) {
			continue
		}
		seen[id] = true
		ev.Status, ev.UpdateTime = outbox.StatusSuccess, now
		n++
	}
	return n
}

// MarkSuccess implements [outbox.Store].
func (s *MemoryStore) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return s.markSuccessLocked(ids, owner, now), nil
}

// heldLocked returns the event if owner holds its lease (SENDING under owner), else nil.
func (s *MemoryStore) heldLocked(id int64, owner string) *outbox.Event {
	ev, ok := s.rows[id]
	if !ok || ev.Status != outbox.StatusSending || ev.ClaimOwner != owner {
		return nil
	}
	return ev
}

// recordFailureLocked appends a failure to ev's history, keeping the latest ten.
func recordFailureLocked(ev *outbox.Event, at time.Time, instance, class, message string) {
	if n := utf8.RuneCountInString(message); n > mysqldialect.MaxFailureMessage {
		message = string([]rune(message)[:mysqldialect.MaxFailureMessage])
	}
	ev.Failures = append(ev.Failures, outbox.Failure{At: at, Instance: instance, Class: class, Message: message})
	if over := len(ev.Failures) - mysqldialect.MaxFailures; over > 0 {
		ev.Failures = slices.Clone(ev.Failures[over:])
	}
}

// maxReasonLen is the most characters of an event's LastError, as the MySQL store keeps.
const maxReasonLen = 1024

// truncateReason cuts a reason to maxReasonLen characters of valid UTF-8.
func truncateReason(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if utf8.RuneCountInString(s) <= maxReasonLen {
		return s
	}
	return string([]rune(s)[:maxReasonLen-3]) + "..."
}

// waitLocked returns ev to WAIT, due at due, with nobody holding its lease.
func waitLocked(ev *outbox.Event, due, now time.Time) {
	ev.Status, ev.ClaimOwner, ev.ClaimedAt, ev.NextRetryTime, ev.UpdateTime = outbox.StatusWait, "", time.Time{}, due, now
}

// ReleaseForRetry implements [outbox.Store].
func (s *MemoryStore) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, class, reason string) (bool, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	ev := s.heldLocked(id, owner)
	if ev == nil {
		return false, nil
	}
	if class != "" {
		recordFailureLocked(ev, now, owner, class, reason)
	}
	waitLocked(ev, now.Add(delay), now)
	ev.RetryCount, ev.LastError = retryCount, truncateReason(reason)
	return true, nil
}

// MarkFail implements [outbox.Store]. The dead letter keeps its last claim's owner and time.
func (s *MemoryStore) MarkFail(ctx context.Context, id int64, owner string, retryCount int, class, reason string) ([]outbox.Failure, bool, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return nil, false, err
	}
	defer s.mu.Unlock()
	ev := s.heldLocked(id, owner)
	if ev == nil {
		return nil, false, nil
	}
	recordFailureLocked(ev, now, owner, class, reason)
	ev.Status, ev.RetryCount, ev.LastError, ev.UpdateTime = outbox.StatusFail, retryCount, truncateReason(reason), now
	return slices.Clone(ev.Failures), true, nil
}

// reclaimMessage is a reclaim's message in the history, as the MySQL store writes it.
const reclaimMessage = "the lease expired with no outcome recorded: the instance died, stalled or lost the database before recording the send"

// ReclaimExpired implements [outbox.Store], judging each lease by its claim time only.
func (s *MemoryStore) ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (int64, []outbox.Event, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return 0, nil, err
	}
	defer s.mu.Unlock()
	cutoff := now.Add(-lease)
	var (
		requeued int64
		dead     []outbox.Event
	)
	for _, id := range slices.Sorted(maps.Keys(s.rows)) {
		ev := s.rows[id]
		if ev.Status != outbox.StatusSending || !ev.ClaimedAt.Before(cutoff) {
			continue
		}
		ev.ReclaimCount++
		if maxReclaims != outbox.RetryForever && ev.ReclaimCount >= maxReclaims {
			reason := fmt.Sprintf("reclaimed %d times: each instance that claimed it died or stalled before recording an outcome (a poison event?)", maxReclaims)
			recordFailureLocked(ev, now, ev.ClaimOwner, mysqldialect.ClassReclaimed, reason)
			ev.Status, ev.LastError, ev.UpdateTime = outbox.StatusFail, reason, now
			dead = append(dead, copyEvent(*ev))
			continue
		}
		recordFailureLocked(ev, now, ev.ClaimOwner, mysqldialect.ClassReclaimed, reclaimMessage)
		waitLocked(ev, ev.NextRetryTime, now) // its due time stays: it is due at once
		requeued++
	}
	return requeued, dead, nil
}

// RenewLease implements [outbox.Store].
func (s *MemoryStore) RenewLease(ctx context.Context, ids []int64, owner string) (int64, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var n int64
	for _, id := range slices.Compact(slices.Sorted(slices.Values(ids))) {
		if ev := s.heldLocked(id, owner); ev != nil {
			ev.ClaimedAt = now
			n++
		}
	}
	return n, nil
}

// ReleaseOwned implements [outbox.Store].
func (s *MemoryStore) ReleaseOwned(ctx context.Context, owner, reason string) (int64, error) {
	now, err := s.lock(ctx)
	if err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	var n int64
	for _, ev := range s.rows {
		if ev.Status == outbox.StatusSending && ev.ClaimOwner == owner {
			waitLocked(ev, now, now)
			ev.LastError = truncateReason(reason)
			n++
		}
	}
	return n, nil
}

// Subscribe implements [outbox.Store]: the channel receives a signal after each Insert that
// wrote an event due at once. Signals do not queue up: one waits at most.
func (s *MemoryStore) Subscribe() (<-chan struct{}, func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subSeq++
	key, ch := s.subSeq, make(chan struct{}, 1)
	s.subs[key] = ch
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs, key)
	}
}

// notifyLocked signals every subscriber.
func (s *MemoryStore) notifyLocked() {
	for _, ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Purge implements [outbox.Store]: it deletes the SUCCESS events, then the SKIPPED ones,
// last updated more than olderThan ago by the store's clock, oldest first, in batches of
// opts.BatchRows with opts.Pause between them, up to opts.Limit. With opts.Exclusive it
// returns an error wrapping [outbox.ErrPurgeBusy] while another exclusive purge of the
// store runs.
func (s *MemoryStore) Purge(ctx context.Context, olderThan time.Duration, opts outbox.PurgeOptions) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("%w: purge age must be positive, got %s", outbox.ErrInvalidInput, olderThan)
	}
	switch batch := cmp.Or(opts.BatchRows, 500); {
	case batch < 0 || batch > 10000:
		return 0, fmt.Errorf("%w: purge batch must be between 1 and 10000 rows, got %d", outbox.ErrInvalidInput, opts.BatchRows)
	case opts.Pause < 0:
		return 0, fmt.Errorf("%w: purge pause must not be negative, got %s", outbox.ErrInvalidInput, opts.Pause)
	case opts.Limit < 0:
		return 0, fmt.Errorf("%w: purge limit must be positive, got %d", outbox.ErrInvalidInput, opts.Limit)
	default:
		opts.BatchRows = batch
	}
	if opts.DryRun {
		s.mu.Lock()
		defer s.mu.Unlock()
		n := int64(len(s.purgeableLocked(olderThan, -1)))
		if opts.Limit > 0 {
			n = min(n, opts.Limit)
		}
		return n, ctx.Err()
	}
	if opts.Exclusive {
		if !s.purge.TryLock() {
			return 0, fmt.Errorf("outboxtest: purge: %w", outbox.ErrPurgeBusy)
		}
		defer s.purge.Unlock()
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		batch := opts.BatchRows
		if opts.Limit > 0 {
			batch = int(min(int64(batch), opts.Limit-total))
		}
		s.mu.Lock()
		ids := s.purgeableLocked(olderThan, batch)
		for _, id := range ids {
			s.deleteLocked(id)
		}
		s.mu.Unlock()
		n := int64(len(ids))
		total += n
		if n > 0 && opts.OnBatch != nil {
			opts.OnBatch(n)
		}
		if n < int64(batch) || opts.Limit > 0 && total >= opts.Limit {
			return total, nil
		}
		if opts.Pause > 0 {
			t := time.NewTimer(opts.Pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return total, ctx.Err()
			case <-t.C:
			}
		}
	}
}

// purgeableLocked returns the ids of up to limit (all, if negative) events a purge deletes:
// SUCCESS, then SKIPPED, last updated before olderThan ago, oldest first.
func (s *MemoryStore) purgeableLocked(olderThan time.Duration, limit int) []int64 {
	cutoff := s.now().Add(-olderThan)
	var old []*outbox.Event
	for _, ev := range s.rows {
		if (ev.Status == outbox.StatusSuccess || ev.Status == outbox.StatusSkipped) && ev.UpdateTime.Before(cutoff) {
			old = append(old, ev)
		}
	}
	slices.SortFunc(old, func(a, b *outbox.Event) int {
		return cmp.Or(
			cmp.Compare(statusRank(a.Status), statusRank(b.Status)),
			a.UpdateTime.Compare(b.UpdateTime),
			cmp.Compare(a.ID, b.ID))
	})
	if limit >= 0 && len(old) > limit {
		old = old[:limit]
	}
	ids := make([]int64, len(old))
	for i, ev := range old {
		ids[i] = ev.ID
	}
	return ids
}

// statusRank puts SUCCESS before SKIPPED, the order the purge takes them in.
func statusRank(st outbox.Status) int {
	if st == outbox.StatusSuccess {
		return 0
	}
	return 1
}

// deleteLocked removes the event from the store.
func (s *MemoryStore) deleteLocked(id int64) {
	ev := s.rows[id]
	delete(s.rows, id)
	ids := s.byKey[ev.BizNo]
	if i, ok := slices.BinarySearch(ids, id); ok {
		ids = slices.Delete(ids, i, i+1)
	}
	if len(ids) == 0 {
		delete(s.byKey, ev.BizNo)
	} else {
		s.byKey[ev.BizNo] = ids
	}
}

// sentMinutes is how many minutes TableStats.SentPerMinute covers.
const sentMinutes = 60

// Stats implements [outbox.Store]: every field of [outbox.TableStats] but the relay's (a
// MemoryStore has no relay), by the store's clock.
func (s *MemoryStore) Stats(ctx context.Context, opts outbox.StatsOptions) (outbox.TableStats, error) {
	if opts.Lease < 0 {
		return outbox.TableStats{}, fmt.Errorf("outboxtest: stats: Lease must not be negative, got %s", opts.Lease)
	}
	st := outbox.TableStats{FailByType: map[string]int64{}}
	if opts.SentPerMinute {
		st.SentPerMinute = make([]int64, sentMinutes)
	}
	now, err := s.lock(ctx)
	if err != nil {
		return outbox.TableStats{}, err
	}
	defer s.mu.Unlock()
	var success, skipped int64
	for _, ev := range s.rows {
		switch ev.Status {
		case outbox.StatusWait:
			st.Wait++
			if !ev.NextRetryTime.After(now) {
				st.Due++
				st.OldestDueAge = max(st.OldestDueAge, now.Sub(ev.NextRetryTime))
			}
		case outbox.StatusSending:
			st.Sending++
			age := now.Sub(ev.ClaimedAt)
			st.OldestClaimAge = max(st.OldestClaimAge, age)
			if opts.Lease > 0 && age > opts.Lease/2 {
				st.SendingPastHalfLease++
			}
		case outbox.StatusFail:
			st.Fail++
			st.FailByType[ev.EventType]++
		case outbox.StatusSuccess:
			success++
			if age := now.Sub(ev.ClaimedAt); opts.SentPerMinute && age >= 0 && age < sentMinutes*time.Minute {
				st.SentPerMinute[sentMinutes-1-int(age/time.Minute)]++
			}
		case outbox.StatusSkipped:
			skipped++
		}
	}
	st.Success, st.Skipped = -1, -1
	if opts.CountSucceeded {
		st.Success = success
	}
	if opts.CountSucceeded || opts.CountSkipped {
		st.Skipped = skipped
	}
	return st, nil
}
