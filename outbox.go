package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-outbox/outbox/internal/eventrules"
)

// Status is the state of an event row.
type Status string

const (
	// StatusWait: waiting to be claimed, once next_retry_time has passed.
	StatusWait Status = "WAIT"
	// StatusSending: claimed by claim_owner at claimed_at and being sent.
	StatusSending Status = "SENDING"
	// StatusSuccess: sent; final.
	StatusSuccess Status = "SUCCESS"
	// StatusFail: dead letter after the last retry, or an error no retry can fix. Automatic
	// sending has stopped; a person decides (see [Admin.Requeue] and [Admin.Skip]).
	StatusFail Status = "FAIL"
)

// Event is one row of the outbox table.
type Event struct {
	// ID is the row's AUTO_INCREMENT key: unique in its table only.
	ID int64
	// EventID identifies the event for consumers: a UUIDv7 generated once at insert and
	// stored in the row, so every send of the event carries the same id, and unique across
	// tables, services and restored backups. Consumers deduplicate on it. A row that another
	// program wrote with a plain SQL INSERT has the column's default instead, a version-1
	// UUID from the database's UUID(), as unique and as stable (docs/other-writers.md).
	EventID   string
	BizNo     string
	EventType string
	Payload   []byte
	Status    Status
	// RetryCount is the number of failed send attempts so far.
	RetryCount int
	// ReclaimCount is how many times the event's lease expired with no outcome recorded.
	ReclaimCount int
	// NextRetryTime is when the event becomes due, by the database clock (UTC).
	NextRetryTime time.Time
	// ClaimOwner and ClaimedAt describe the lease: who claimed the event and when. They are
	// empty and zero while the event waits; after SUCCESS or FAIL they keep the last claim.
	ClaimOwner string
	ClaimedAt  time.Time
	// LastError is the reason of the last failed attempt, if any.
	LastError  string
	CreateTime time.Time
	UpdateTime time.Time
	// TraceParent and TraceState are the W3C trace context of the span that was in the
	// context given to InsertEvent (see [PropertyTraceParent]), empty if there was none. The
	// sender sends them with the event so that its consumer continues that trace.
	TraceParent string
	TraceState  string
	// Topic is the event's destination, as its store resolved it by its [Routes] and wrote
	// it on the row: at insert ([EventInput.Topic], else its type's route, else the default
	// topic), or, for a row a plain SQL INSERT wrote without one, at its claim. The sender
	// sends the event there.
	Topic string
	// Failures are the event's latest failed attempts, oldest first (at most ten): when,
	// on which instance, of what class and why (see [Failure]). Empty for an event that
	// never failed. [Admin] fills it, and the dead-letter callback's event has it, the
	// failure that dead-lettered it last; the events a [Sender] is given do not (the claims
	// do not read it). A requeue ([Admin.Requeue]) keeps it: the next failures follow.
	Failures []Failure
	// Read dates the claim's read of the event, for the publisher's commit-to-send latency
	// (metrics) and its coalescing window, by the store's clock, so that those figures need
	// no agreement between the clocks. A store that cannot date its reads leaves it zero:
	// the publisher then dates the event from CreateTime by this machine's clock. [MySQLStore]
	// sets it on every event it claims.
	Read EventRead
}

// EventRead dates a store's read of an event ([Event.Read]).
type EventRead struct {
	// At is when the store read the event, by this process's clock; zero if it did not
	// date the read.
	At time.Time
	// Age is the event's age at that read, since its commit, by the store's clock.
	Age time.Duration
	// Deferred is how long after its commit the event was due, as written
	// ([EventInput.Delay] or [EventInput.NotBefore]), by the store's clock, when the store
	// read it before anything else touched the row; zero otherwise. The commit-to-send
	// latency counts from the due time instead of the commit for such an event.
	Deferred time.Duration
}

// EventInput is what a service writes inside its business transaction.
type EventInput struct {
	// BizNo is the business key, e.g. the order number. Required; at most 64 characters.
	BizNo string
	// EventType names the event, e.g. ORDER_CREATED. Required; at most 64 characters.
	EventType string
	// Payload is the message body. Required (RocketMQ takes no message without a body); at
	// most [MySQLConfig.MaxPayloadBytes].
	Payload []byte
	// Delay makes the event due that long after the insert, by the database clock
	// (UTC_TIMESTAMP(3)), rounded up to the millisecond: no publisher claims it before.
	// Zero (the default): due at once. It must not be negative, nor given with NotBefore.
	// See docs/delayed-events.md.
	Delay time.Duration
	// NotBefore makes the event due at that instant (converted to UTC and rounded up to
	// the millisecond), compared with the database clock: a time the database clock has
	// passed is due at once. At most 9999-12-31 23:59:59.999 UTC, the latest time the
	// table's DATETIME(3) holds. The zero time (the default): due at once. Not with Delay.
	NotBefore time.Time
	// Topic names the event's destination, one of the store's topics ([Routes.Topic] or one
	// of [Routes.Topics], in [MySQLConfig.Routes]); InsertEvent refuses any other. "" (the
	// default) leaves it to the routes: the topic of the event type ([Routes.ByType]), else
	// the default topic.
	Topic string
}

// Failure is one failed attempt of an event, as [Event.Failures] keeps it. The store
// records it in the statement that records the failure (schema.sql, the failures column):
// a retry, a dead letter, a reclaim, or a release after the broker was unavailable. An
// event sent at its first attempt has none, and costs nothing for it.
//
// Class is one of:
//   - "retryable": a send failed with an error the publisher retries (the last of
//     [Config.MaxAttempts] dead-letters the event: its Status says so);
//   - "permanent": a send failed with an error marked [Permanent]; dead-lettered at once;
//   - "unavailable": the broker was unavailable ([Unavailable]); no attempt counted;
//   - "reclaimed": the lease expired with no outcome recorded (Instance is the owner that
//     lost it), counted in [Event.ReclaimCount]; past [Tuning.MaxReclaims], the dead letter.
//
// A release of an event never tried ([ErrNotSent], a publisher stopping) is no failure. A
// history entry that cannot be read (the column written by hand) comes back with its text as
// Message and the rest empty; nothing fails to read for it.
type Failure struct {
	At       time.Time // when it failed, by the database clock (UTC)
	Instance string    // the instance that tried (claim_owner); for a reclaim, the one that lost the lease
	Class    string    // what kind of failure: "retryable", "permanent", "unavailable" or "reclaimed"
	Message  string    // why: the error, its first 512 characters
}

// Store is the outbox table as the [Publisher] sees it: what a store for another database
// implements, and what only the publisher calls. Business code never needs these methods: it
// writes events with [MySQLStore.BeginTx] and [Tx.InsertEvent]. Every method is one short
// statement (or one short transaction) that holds no lock once it returns; the publisher
// never keeps a transaction open while it sends. [MySQLStore] is the implementation for
// MySQL and MariaDB; package outboxtest is the suite any other must pass.
//
// All times are the store's own clock.
type Store interface {
	// Check reports the order the store claims in (see [Ordering]) and the topics its
	// events go to, and whether its table can serve them; the publisher calls it in
	// [Publisher.Start], and before the first [Publisher.PublishPending] of a publisher not
	// started. The StoreInfo is the store's even when the table cannot be read. An error
	// wrapping [ErrInvalidConfig] says the table cannot serve the store (and names every
	// fix), and Start (or PublishPending) returns it; any other error is logged and the
	// publisher goes on.
	Check(ctx context.Context) (StoreInfo, error)

	// ClaimDue claims up to req.Limit due WAIT events for req.Owner at once, oldest first,
	// whose payloads add up to at most req.MaxBytes (but at least one event), and returns
	// them as claimed. Rows another instance is claiming at the same moment are skipped, not
	// waited for. In key order (Check's answer) an event is claimed only when every earlier
	// event of its biz no is done, and the claimed events of one biz no come in id order.
	// An event that was reclaimed before (ReclaimCount > 0) is claimed alone, so that if its
	// send kills the instance again, the reclaim counts against it and nothing else. In the
	// same transaction it marks SUCCESS the events of req.Succeeded that req.Owner still
	// holds, as [Store.MarkSuccess] does: the claim and the last round's acknowledgement cost
	// one commit. Used by the default batch claims.
	ClaimDue(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Candidates returns up to limit WAIT events whose next_retry_time has passed, oldest
	// first (in key order, only those whose earlier events of the same biz no are done). It
	// takes no lock and grants no ownership: other instances may see the same rows. Used by
	// the per-row claims ([Tuning.ClaimPerRow]).
	Candidates(ctx context.Context, limit int) ([]Event, error)

	// Claim makes owner the holder of ev's lease, if ev is still WAIT, still due and still at
	// ev.RetryCount (and, in key order, no earlier event of its biz no is open). It reports
	// whether the claim changed the row: false means another instance got there first, which
	// is normal. Used by the per-row claims.
	Claim(ctx context.Context, ev Event, owner string) (bool, error)

	// MarkSuccess marks SUCCESS every event of ids whose lease owner still holds (or that is
	// SUCCESS under owner's claim already: a success recorded twice), and reports how many it
	// marked; the others were reclaimed and are left as they are.
	MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error)

	// ReleaseForRetry returns the event to WAIT with retryCount and a next_retry_time delay
	// from now, recording reason, if owner still holds its lease. A class that is not ""
	// (see [Failure]) says the release follows a failed attempt: the store appends it to the
	// event's failure history, with reason, owner and its own clock's time, in the same
	// write. "" releases an event that was never tried, and adds nothing to the history.
	ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, class, reason string) (bool, error)

	// MarkFail dead-letters the event with retryCount and reason, if owner still holds its
	// lease, appending the failure (class and reason) to its history as ReleaseForRetry
	// does. It returns the history as it now stands, this failure last ([Event.Failures],
	// for the dead-letter callback), and whether it changed the row.
	MarkFail(ctx context.Context, id int64, owner string, retryCount int, class, reason string) ([]Failure, bool, error)

	// ReclaimExpired returns to WAIT every SENDING event claimed more than lease ago, counting
	// the reclaim in its ReclaimCount and in its failure history (class "reclaimed", under
	// the owner that lost the lease), and reports how many it returned. An event whose
	// reclaims would reach maxReclaims is dead-lettered instead, and returned in dead as it
	// now stands, history included. Judged by claimed_at only.
	ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (requeued int64, dead []Event, err error)

	// RenewLease extends the lease of the events of ids that owner still holds (SENDING
	// under owner) to now, by the store's clock, and reports how many it renewed; the
	// others were reclaimed, and are left as they are. The publisher calls it while a send
	// is in flight, every third of [Tuning.Lease], so that a slow but live send is never
	// reclaimed and sent twice, while a dead instance's claims expire after one short lease.
	RenewLease(ctx context.Context, ids []int64, owner string) (int64, error)

	// ReleaseOwned returns to WAIT, due now and with no retry or reclaim counted, every event
	// SENDING under owner, recording reason; it reports how many. The publisher calls it when
	// it holds nothing in flight: when it stops, and after a claim whose outcome is
	// unknown (its COMMIT failed), so that no row waits for a whole lease while its owner is
	// alive.
	ReleaseOwned(ctx context.Context, owner, reason string) (int64, error)

	// Subscribe returns a channel that receives a signal when events were committed through
	// this store in this process, so that the publisher sends them at once rather than at
	// the next poll, and a function that ends the subscription. A store that cannot tell
	// returns a nil channel (the publisher then polls). A publisher subscribes for each run
	// and unsubscribes once the run has stopped and made its last write: a store may then
	// release what it keeps for its runs' claims (the MySQL store closes its claim session
	// when its last subscriber leaves).
	Subscribe() (wake <-chan struct{}, unsubscribe func())

	// Purge deletes SUCCESS and SKIPPED events last updated more than olderThan ago, as
	// [PurgeOptions] says, and reports how many it deleted (or, with DryRun, would delete).
	// The publisher's retention ([Config.Retention]) calls it. A store that cannot purge
	// returns an error wrapping [errors.ErrUnsupported].
	Purge(ctx context.Context, olderThan time.Duration, opts PurgeOptions) (int64, error)

	// Stats reads a snapshot of the table for the publisher's gauges. A store that cannot
	// returns an error wrapping [errors.ErrUnsupported]: the gauges are then left out.
	Stats(ctx context.Context, opts StatsOptions) (TableStats, error)
}

// ClaimRequest is what one batch claim ([Store.ClaimDue]) takes, and what it records first.
type ClaimRequest struct {
	Owner    string // the instance that claims
	Limit    int    // the most events to claim; positive
	MaxBytes int    // the most payload bytes to claim (but at least one event); positive
	// Succeeded are events Owner has sent since its last claim and not yet recorded: the
	// claim marks them SUCCESS, if Owner still holds them, before it commits.
	Succeeded []int64
	// Ahead says that the claim is made while Owner sends the batch it claimed before (in
	// key order, through a backlog): much of the backlog may be of keys in flight, so a claim
	// that finds nothing is no sign that nothing is due, and a store that sizes its claims
	// from what it finds learns nothing from it.
	Ahead bool
}

// ClaimResult is what a batch claim did.
type ClaimResult struct {
	Events []Event // the events claimed, SENDING under the request's Owner
	// More reports that due events may be left (the claim took all it was allowed, or
	// stopped short of MaxBytes or of a reclaimed event), so that the next claim need not
	// wait for the poll interval.
	More bool
	// Succeeded is how many of the request's Succeeded the claim marked SUCCESS; the others
	// had been reclaimed, and keep their new owner's state.
	Succeeded int64
}

// Sender publishes events to a broker: the wire. What to send, in which order and after
// what, and what a failure leads to (a retry, a dead letter, a pause) are the library's
// decisions ([Dispatch], the publisher's rounds), the same whatever the sender, so that a
// sender of a test kit and a real one decide alike. [RocketMQSender] is the one for Apache
// RocketMQ; [SenderFunc] makes one of a function that sends one event.
//
// Send returns one error per event of evs, in order: nil for each event the broker
// stored, and only once it has. Each event goes to its [Event.Topic], which the store set.
// The error says whose fault a failure is. An error marked with [Permanent] belongs to the
// message and dead-letters the event at once. An error marked with [Unavailable] (or
// wrapping [ErrClosed]) says the broker, or the way to it, is down: the event goes back to
// WAIT without a retry counted, and the publisher stops claiming and probes until a send
// succeeds. An error wrapping [ErrNotSent] says the sender never tried the event: it goes
// back to WAIT with nothing counted. Any other error is retried with backoff and counts
// against [Config.MaxAttempts].
//
// With keyOrder (the store claims in key order), the events of one biz no in evs are of
// one topic and in id order ([Dispatch] sends a biz no's events of another topic in a
// later call, once these are stored): they must reach the broker in the order given, where
// an orderly consumer receives them in that order, and a biz no whose event fails goes no
// further in this call: its later events get an error wrapping [ErrNotSent].
//
// Check reports whether the sender can send to each of topics, the topics a store's events
// go to ([StoreInfo.Topics]); [Publisher.Start] calls it. An error wrapping
// [ErrInvalidConfig], naming each topic it cannot send to once, refuses the start; any
// other error (the broker cannot be asked) is logged, and the publisher starts.
//
// Send must respect ctx: the publisher bounds it with the send timeout (see [SenderInfo]).
// A wrapper around a sender (for metrics, say) implements every method, passing Check and
// Info on, so nothing the inner sender can do is lost.
type Sender interface {
	Send(ctx context.Context, evs []Event, keyOrder bool) []error
	Check(ctx context.Context, topics []string) error
	// Info describes the sender to the publisher.
	Info() SenderInfo
}

// SenderInfo describes a [Sender] to the publisher that uses it.
type SenderInfo struct {
	// System names the messaging system for the send spans' messaging.system ("" for none).
	System string
	// SendTimeout is how long one Send may take when the sender bounds its sends itself (a
	// RocketMQ client's timeouts are set when it is built). The publisher then bounds each
	// Send by it, and refuses a [Tuning.SendTimeout] that differs. Zero: the publisher's
	// Tuning.SendTimeout bounds the sends.
	SendTimeout time.Duration
}

// SenderFunc adapts a function that sends one event to [Sender]: Send calls it for each
// event in turn. A panic in it fails that event. Once a call fails as [Unavailable] before
// any event was accepted, the rest of the events get the same error without a call (the
// broker is down: each would wait out its own timeout); once ctx is done, the rest get
// [ErrNotSent]. With keyOrder, a biz no whose event failed is not called again in that Send.
type SenderFunc func(ctx context.Context, ev Event) error

// Send calls f for each event of evs in turn (see [SenderFunc]).
func (f SenderFunc) Send(ctx context.Context, evs []Event, keyOrder bool) []error {
	errs := make([]error, len(evs))
	accepted := false
	var failedKeys map[string]error // with keyOrder: the biz nos with a failed send, and its error
	var failedAt map[string]string  // and the event id of the event that failed
	for i, ev := range evs {
		if ctx.Err() != nil {
			errs[i] = errNotSent
			continue
		}
		if cause := failedKeys[ev.BizNo]; cause != nil {
			errs[i] = &keyNotSentError{bizNo: ev.BizNo, failed: failedAt[ev.BizNo], cause: cause}
			continue
		}
		errs[i] = f.call(ctx, ev)
		if !stored(errs[i]) && keyOrder {
			if failedKeys == nil {
				failedKeys, failedAt = map[string]error{}, map[string]string{}
			}
			failedKeys[ev.BizNo], failedAt[ev.BizNo] = errs[i], ev.EventID
		}
		if stored(errs[i]) {
			accepted = true
		} else if !accepted && isOutage(errs[i]) {
			for j := i + 1; j < len(evs); j++ {
				errs[j] = errs[i]
			}
			break
		}
	}
	return errs
}

func (f SenderFunc) call(ctx context.Context, ev Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("sender panicked: %v", r)
		}
	}()
	return f(ctx, ev)
}

// Check returns nil: a function may send anywhere.
func (f SenderFunc) Check(context.Context, []string) error { return nil }

// Info returns the zero SenderInfo: a function bounds no send itself.
func (f SenderFunc) Info() SenderInfo { return SenderInfo{} }

var (
	// ErrInvalidConfig is wrapped by every configuration error.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrInvalidEvent is wrapped by every error for an event that cannot be written.
	ErrInvalidEvent = eventrules.ErrInvalidEvent
	// ErrPayloadTooLarge is returned for a payload over [MySQLConfig.MaxPayloadBytes].
	ErrPayloadTooLarge error = eventrules.ErrPayloadTooLarge
	// ErrNoTable is returned by [MySQLStore.Check] (so by [Publisher.Start]) for an outbox
	// table that does not exist: create it ([MySQLStore.CreateSchema], or schema.sql).
	ErrNoTable = errors.New("outbox: no such table")
	// ErrNotFound is returned when an event does not exist.
	ErrNotFound = errors.New("outbox: event not found")
	// ErrClosed is returned by a sender's Send after its Close (nothing was sent: the
	// publisher returns the event to WAIT without counting a retry), and by
	// [Publisher.Start], Run, [Publisher.PublishPending] and [Publisher.Reclaim] after
	// [Publisher.Close].
	ErrClosed = errors.New("outbox: closed")
	// ErrAlreadyRunning is returned by [Publisher.Start] (and Run) when the publisher is
	// already running (or still stopping); the relay and the inbox's consumer return it
	// too.
	ErrAlreadyRunning = errors.New("outbox: already running")
	// ErrUnconfirmed is a sender's answer for an event the broker stored but could not
	// confirm in time as durable (RocketMQ's FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and
	// SLAVE_NOT_AVAILABLE: not flushed to disk, or not copied to a replica, yet). The
	// event is sent: the publisher records it SUCCESS, spends no attempt on it, sends it no
	// second time, counts it in outbox.events.unconfirmed and logs a warning (see
	// docs/rocketmq.md). In key order its biz no goes on.
	ErrUnconfirmed = errors.New("outbox: stored, not confirmed")
	// ErrNotSent is a sender's answer for an event it did not try: the send timeout passed
	// before its turn, or, in key order, an earlier event of the same biz no failed. The
	// publisher returns such an event to WAIT with no attempt counted.
	ErrNotSent = errors.New("outbox: not sent")
)

// stored reports whether a sender's answer for an event says the broker stored it: nil, or
// [ErrUnconfirmed].
func stored(err error) bool { return err == nil || errors.Is(err, ErrUnconfirmed) }

// errNotSent is ErrNotSent for an event whose turn never came before the batch's deadline.
var errNotSent = fmt.Errorf("%w: the batch's send timeout passed before its turn", ErrNotSent)

// permanentError marks a send error that no retry can fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix (a message the broker will always
// refuse, say), so the publisher dead-letters the event at once instead of retrying it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// unavailableError marks a send error that says nothing about the message: the broker, its
// route or the network to it is down, and the same send will work once it is back.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string { return "unavailable: " + e.err.Error() }
func (e *unavailableError) Unwrap() error { return e.err }

// Unavailable marks err as an infrastructure failure (see [Sender]): the event is returned
// to WAIT without spending a retry, and the publisher pauses its claims until the broker
// answers again. A failure marked Unavailable while other events of the same round were
// sent to its topic is the message's own after all, and is retried with backoff like any
// other, except in key order, where a biz no's events can go to its queue only: there it
// goes back to WAIT with no retry counted, tried again a second later, while the other
// events go on.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &unavailableError{err: err}
}

// IsUnavailable reports whether err, or any error it wraps, was marked with [Unavailable].
func IsUnavailable(err error) bool {
	var u *unavailableError
	return errors.As(err, &u)
}

// isOutage reports whether a send's err leaves the event untried, as in a broker outage: the
// broker or the way to it is down ([IsUnavailable]), or the sender was closed under the
// publisher ([ErrClosed]). Neither counts an attempt.
func isOutage(err error) bool {
	return IsUnavailable(err) || errors.Is(err, ErrClosed)
}

// IsPermanent reports whether err, or any error it wraps, was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Publisher claims due events from a [Store] and sends them through a [Sender]. Run one in
// every instance of the service; they share the work row by row without any other
// coordination.
//
// A publisher is started with [Publisher.Start], which reports at once what keeps it from
// running and then publishes in the background, and ended with [Publisher.Close], which
// stops it, waits (a bounded time, [Config.StopTimeout]) for its last sends to be recorded
// and closes the sender:
//
//	publisher, err := outbox.NewPublisher(store, sender, outbox.Config{})
//	if err != nil {
//		return err
//	}
//	if err := publisher.Start(ctx); err != nil {
//		return err
//	}
//	defer publisher.Close()
//
// [Publisher.Run] is Start and then a wait for the run to end, for an errgroup.
type Publisher struct {
	store   Store
	sender  Sender
	info    SenderInfo
	cfg     Config
	log     *slog.Logger
	running atomic.Bool
	limit   atomic.Int64 // batch mode: how many events the next claim takes
	held    atomic.Int64 // events claimed and SENDING under this instance, outcome not yet recorded (for Stop's error)
	m       *metrics     // nil without Config.MeterProvider
	health  healthState

	// keyOrder is the store's ordering, as Check reported it: the claims keep each biz no's
	// events in order, and the sender is asked to. Start checks; a PublishPending without
	// Start checks before its first round (orderChecked), so that no send ever goes out
	// without the store's order.
	keyOrder     atomic.Bool
	orderChecked atomic.Bool

	// rounds is what the publisher's rounds share, with its invariants (see round.go).
	rounds roundState

	tracing *sendTracing // the send spans; nil without Config.TracerProvider
	topics  *topicNames  // names each event's topic, within the store's set
	// storeInfo is what the store's Check reported (at Start, or before the first
	// PublishPending): how it claims and its topics, for Dispatch.
	storeInfo atomic.Pointer[StoreInfo]

	// life is Start's, Stop's and Close's (see lifecycle.go).
	life lifecycle
	// dead calls OnDeadLetter, one call at a time (see deadletters.go).
	dead deadLetters
}

// NewPublisher returns a publisher for store and sender. Zero fields of cfg take their
// defaults; an invalid cfg is reported here, never at run time. The publisher takes the
// sender over: [Publisher.Close] closes it, so give each publisher a sender of its own, or
// set [Config.SharedSender] on every publisher of one sender and close it yourself after
// them (see docs/many-databases.md). A store may serve any number of publishers and
// business transactions.
func NewPublisher(store Store, sender Sender, cfg Config) (*Publisher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	if sender == nil {
		return nil, fmt.Errorf("%w: sender is nil", ErrInvalidConfig)
	}
	info := sender.Info()
	cfg, err := cfg.withSenderTimeout(info)
	if err != nil {
		return nil, err
	}
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	p := &Publisher{
		store:  store,
		sender: sender,
		info:   info,
		cfg:    cfg,
		log:    cfg.Logger.With(logAttrs(cfg)...),
	}
	p.topics = &topicNames{}
	if p.m, err = newMetrics(cfg, store, p.topics, p.log); err != nil {
		return nil, fmt.Errorf("outbox: make the publisher's instruments: %w", err)
	}
	p.limit.Store(int64(min(cfg.Tuning.BatchSize, initialClaimLimit)))
	p.tracing = newSendTracing(cfg.TracerProvider, info, p.topics, cfg.StoreName)
	p.rounds.gather = newGatherer(cfg.coalesceTarget(), cfg.PollInterval)
	p.life.init()
	p.dead.init(cfg.OnDeadLetter, p.log)
	return p, nil
}

// logAttrs are the attributes of every log record of a publisher of cfg: its instance, and
// its store when it has a name.
func logAttrs(cfg Config) []any {
	attrs := []any{slog.String("instance", cfg.InstanceID)}
	if cfg.StoreName != "" {
		attrs = append(attrs, slog.String("store", cfg.StoreName))
	}
	return attrs
}

// initialClaimLimit is the first batch claim's size; it doubles up to BatchSize while
// batches send quickly.
const initialClaimLimit = 64
