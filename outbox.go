package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
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
	// tables, services and restored backups. Consumers deduplicate on it.
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

	// storeAge and readAt date the store's read of the event, for the commit-to-send
	// latency: its age then by the store's clock, and when that was by this process's.
	storeAge time.Duration
	readAt   time.Time
}

// EventInput is what a service writes inside its business transaction.
type EventInput struct {
	// BizNo is the business key, e.g. the order number. Required; at most 64 characters.
	BizNo string
	// EventType names the event, e.g. ORDER_CREATED. Required; at most 64 characters.
	EventType string
	// Payload is the message body, at most [MySQLConfig.MaxPayloadBytes].
	Payload []byte
}

// Store is the outbox table as the [Publisher] sees it. Every method is one short statement
// that holds no lock once it returns; the publisher never keeps a transaction open while it
// sends. [MySQLStore] is the implementation for MySQL and MariaDB; StoreConformance in the
// tests says what any other must do.
//
// All times are the store's own clock.
type Store interface {
	// Candidates returns up to limit WAIT events whose next_retry_time has passed, oldest
	// first. It takes no lock and grants no ownership: other instances may see the same rows.
	Candidates(ctx context.Context, limit int) ([]Event, error)

	// ClaimDue claims up to req.Limit due WAIT events for req.Owner at once, oldest first,
	// whose payloads add up to at most req.MaxBytes (but at least one event), and returns
	// them as claimed. Rows another instance is claiming at the same moment are skipped, not
	// waited for. An event that was reclaimed before (ReclaimCount > 0) is claimed alone, so
	// that if its send kills the instance again, the reclaim counts against it and nothing
	// else. In the same transaction it marks SUCCESS the events of req.Succeeded that
	// req.Owner still holds, as [Store.MarkSuccessBatch] does: the claim and the last
	// round's acknowledgement cost one commit. Used by [ClaimBatch].
	ClaimDue(ctx context.Context, req ClaimRequest) (ClaimResult, error)

	// Claim makes owner the holder of ev's lease, if ev is still WAIT, still due and still at
	// ev.RetryCount. It reports whether the claim changed the row: false means another
	// instance got there first, which is normal.
	Claim(ctx context.Context, ev Event, owner string) (bool, error)

	// MarkSuccess marks the event SUCCESS if owner still holds its lease (or it is SUCCESS
	// under owner's claim already: a success recorded twice). False means the lease was lost
	// (reclaimed) and the row was left as it is.
	MarkSuccess(ctx context.Context, id int64, owner string) (bool, error)

	// MarkSuccessBatch marks SUCCESS every event of ids whose lease owner still holds (or
	// that is SUCCESS under owner's claim already), and reports how many it marked; the
	// others were reclaimed and are left as they are.
	MarkSuccessBatch(ctx context.Context, ids []int64, owner string) (int64, error)

	// ReleaseForRetry returns the event to WAIT with retryCount and a next_retry_time delay
	// from now, recording reason, if owner still holds its lease.
	ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, reason string) (bool, error)

	// MarkFail dead-letters the event with retryCount and reason, if owner still holds its lease.
	MarkFail(ctx context.Context, id int64, owner string, retryCount int, reason string) (bool, error)

	// ReclaimExpired returns to WAIT every SENDING event claimed more than lease ago, counting
	// the reclaim in its ReclaimCount, and reports how many it returned. An event whose
	// reclaims would reach maxReclaims is dead-lettered instead, and returned in dead as it
	// now stands. Judged by claimed_at only.
	ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (requeued int64, dead []Event, err error)

	// ReleaseOwned returns to WAIT, due now and with no retry or reclaim counted, every event
	// SENDING under owner, recording reason; it reports how many. The publisher calls it when
	// it holds nothing in flight: when Run returns, and after a claim whose outcome is
	// unknown (its COMMIT failed), so that no row waits for a whole lease while its owner is
	// alive.
	ReleaseOwned(ctx context.Context, owner, reason string) (int64, error)
}

// ClaimRequest is what one batch claim ([Store.ClaimDue]) takes, and what it records first.
type ClaimRequest struct {
	Owner    string // the instance that claims
	Limit    int    // the most events to claim; positive
	MaxBytes int    // the most payload bytes to claim (but at least one event); positive
	// Succeeded are events Owner has sent since its last claim and not yet recorded: the
	// claim marks them SUCCESS, if Owner still holds them, before it commits.
	Succeeded []int64
	// Ordering makes the claim keep each biz no's events in order (see [KeyOrder]); the
	// claimed events of one biz no then come in id order.
	Ordering Ordering
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

// Sender publishes one event. It returns nil only once the broker has accepted the event.
//
// The error says whose fault a failure is. An error marked with [Permanent] belongs to the
// message and dead-letters the event at once. An error marked with [Unavailable] (or
// wrapping [ErrSenderClosed]) says the broker, or the way to it, is down: the event goes back
// to WAIT without a retry counted, and the publisher stops claiming and probes until a send
// succeeds. Any other error is retried with backoff and counts against [Config.MaxRetry].
// Send must respect ctx: the publisher bounds it with [Config.SendTimeout].
type Sender interface {
	Send(ctx context.Context, ev Event) error
}

// BatchSender is a [Sender] that can also send many events at once, as a RocketMQ batch does.
// In batch mode the publisher hands it each claimed batch. It returns one error per event,
// in order: nil for each event the broker accepted.
type BatchSender interface {
	Sender
	SendBatch(ctx context.Context, evs []Event) []error
}

// Notifier is implemented by a store that can tell the publishers of this process that
// events were committed, so that they send them at once rather than at the next poll.
// [MySQLStore] is one: its [Tx.Commit] notifies.
type Notifier interface {
	Subscribe() (wake <-chan struct{}, unsubscribe func())
}

// SenderFunc adapts a function to [Sender].
type SenderFunc func(ctx context.Context, ev Event) error

// Send calls f.
func (f SenderFunc) Send(ctx context.Context, ev Event) error { return f(ctx, ev) }

var (
	// ErrInvalidConfig is wrapped by every configuration error.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrInvalidEvent is wrapped by every error for an event that cannot be written.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrPayloadTooLarge is returned for a payload over [MySQLConfig.MaxPayloadBytes].
	ErrPayloadTooLarge = fmt.Errorf("%w: payload too large", ErrInvalidEvent)
	// ErrNotFound is returned when an event does not exist.
	ErrNotFound = errors.New("outbox: event not found")
	// ErrSenderClosed is returned by a sender's Send after its Close: nothing was sent. The
	// publisher returns the event to WAIT without counting a retry.
	ErrSenderClosed = errors.New("outbox: sender closed")
	// ErrAlreadyRunning is returned by [Publisher.Run] when the publisher is already running.
	ErrAlreadyRunning = errors.New("outbox: publisher already running")
)

// PermanentError marks a send error that no retry can fix.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as one that retrying cannot fix (a message the broker will always
// refuse, say), so the publisher dead-letters the event at once instead of retrying it.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// UnavailableError marks a send error that says nothing about the message: the broker, its
// route or the network to it is down, and the same send will work once it is back.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// Unavailable marks err as an infrastructure failure (see [Sender]): the event is returned
// to WAIT without spending a retry, and the publisher pauses its claims until the broker
// answers again. A failure marked Unavailable while other events of the same round were
// sent is the message's own after all, and is retried with backoff like any other.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &UnavailableError{Err: err}
}

// IsUnavailable reports whether err, or any error it wraps, was marked with [Unavailable]
// or is [ErrSenderClosed].
func IsUnavailable(err error) bool {
	var u *UnavailableError
	return errors.As(err, &u) || errors.Is(err, ErrSenderClosed)
}

// IsPermanent reports whether err, or any error it wraps, was marked with [Permanent].
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// Publisher claims due events from a [Store] and sends them through a [Sender]. Run one in
// every instance of the service; they share the work row by row without any other
// coordination.
type Publisher struct {
	store   Store
	sender  Sender
	cfg     Config
	log     *slog.Logger
	running atomic.Bool
	limit   atomic.Int64 // batch mode: how many events the next claim takes
	m       *metrics     // nil without Config.MeterProvider
	health  healthState

	// roundMu serialises rounds (Run's and PublishPending's) and guards what they share.
	roundMu     sync.Mutex
	outage      outage
	pending     []write // outcomes the store failed to record, tried again before the next claim
	unacked     []Event // sent in Run's rounds, SUCCESS not yet recorded: the next claim records it
	gather      *gatherer
	releaseOwed bool // a claim's outcome was unknown: release our rows before the next claim

	tracing *sendTracing // the send spans; nil without Config.TracerProvider
	orderer KeyOrderer   // the store, when Config.Ordering keeps keys in order; else nil
}

// NewPublisher returns a publisher for store and sender. Zero fields of cfg take their
// defaults; an invalid cfg is reported here, never at run time.
func NewPublisher(store Store, sender Sender, cfg Config) (*Publisher, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: store is nil", ErrInvalidConfig)
	}
	if sender == nil {
		return nil, fmt.Errorf("%w: sender is nil", ErrInvalidConfig)
	}
	cfg, err := cfg.withSenderTimeout(sender)
	if err != nil {
		return nil, err
	}
	if cfg, err = cfg.withDefaults(); err != nil {
		return nil, err
	}
	if _, ok := store.(Purger); cfg.Retention > 0 && !ok {
		return nil, fmt.Errorf("%w: Retention is set but the store (%T) cannot purge: it is no Purger", ErrInvalidConfig, store)
	}
	orderer, err := checkOrdering(cfg.Ordering, store, sender)
	if err != nil {
		return nil, err
	}
	p := &Publisher{
		store:   store,
		sender:  sender,
		cfg:     cfg,
		log:     cfg.Logger.With(slog.String("instance", cfg.InstanceID)),
		orderer: orderer,
	}
	if p.m, err = newMetrics(cfg, store, p.log); err != nil {
		return nil, fmt.Errorf("outbox: make the publisher's instruments: %w", err)
	}
	p.limit.Store(int64(min(cfg.BatchSize, initialClaimLimit)))
	p.tracing = newSendTracing(cfg.TracerProvider, sender)
	p.gather = newGatherer(cfg.CoalesceDelay, cfg.PollInterval)
	return p, nil
}

// initialClaimLimit is the first batch claim's size; it doubles up to BatchSize while
// batches send quickly.
const initialClaimLimit = 64

// InstanceID is the owner this publisher writes to claim_owner.
func (p *Publisher) InstanceID() string { return p.cfg.InstanceID }

// Run publishes until ctx is cancelled: a scan loop that runs a round
// ([Publisher.PublishPending]) and then waits [Config.PollInterval] (fixed delay: rounds never
// overlap) or until a commit wakes it and its coalescing window ([Config.CoalesceDelay]) has
// passed, and beside it a reclaim loop that runs [Publisher.Reclaim] at start and then every
// [Config.ReclaimInterval], and, when [Config.Retention] is set, a retention loop that purges
// old SUCCESS events every [Config.RetentionInterval]. In batch mode the successes of one
// round are recorded by the next round's claim, in its transaction, or on their own if no
// round comes within 50 ms.
//
// With [Config.Ordering], Run first checks that the table can serve ordered claims
// ([KeyOrderer]), and returns the error (wrapping [ErrInvalidConfig]) if it cannot; a store
// it cannot reach then is logged, not refused.
//
// When ctx is cancelled, Run stops claiming, lets the send in flight finish (it is bounded by
// [Config.SendTimeout]) and records its outcome, returns to WAIT every event still SENDING
// under its [Config.InstanceID] (claimed and not sent), and returns nil once every
// goroutine it started has ended. Close the sender only after Run has returned. Store
// errors are logged and retried on the next round; they never end Run. An outcome the
// store failed to record is recorded before the next claim.
func (p *Publisher) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer p.running.Store(false)
	defer p.m.observe(p)()

	if p.orderer != nil {
		if err := p.checkOrdering(ctx); err != nil {
			return err
		}
	}
	p.log.InfoContext(ctx, "outbox publisher started",
		slog.Int("batch_size", p.cfg.BatchSize),
		slog.Duration("poll_interval", p.cfg.PollInterval),
		slog.Duration("lease", p.cfg.Lease))
	var wake <-chan struct{}
	if n, ok := p.store.(Notifier); ok {
		ch, unsubscribe := n.Subscribe()
		defer unsubscribe()
		wake = ch
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.scan(ctx, wake) })
	wg.Go(func() {
		loop(ctx, func() time.Duration {
			_, _ = p.Reclaim(ctx)
			return p.cfg.ReclaimInterval
		})
	})
	if p.cfg.Retention > 0 {
		wg.Go(func() {
			loop(ctx, func() time.Duration {
				p.retain(ctx)
				return p.cfg.RetentionInterval
			})
		})
	}
	wg.Wait()
	p.stop(ctx)
	p.log.Info("outbox publisher stopped")
	return nil
}

// loop runs fn, then waits the delay it returned, until ctx is done: a fixed delay, so runs
// never overlap.
func loop(ctx context.Context, fn func() time.Duration) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(fn())
	}
}
