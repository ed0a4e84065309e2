package outbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox/internal/storename"
)

// The defaults, as the design article sets them, and for the batch claim.
const (
	batchSizePerRowDefault   = 20   // per-row claims, as the article
	batchSizeDefault         = 1000 // batch claims
	pollIntervalDefault      = 5 * time.Second
	reclaimIntervalDefault   = 5 * time.Second
	leaseDefault             = 15 * time.Second
	maxAttemptsDefault       = 4 // the article's three retries
	maxBackoffDefault        = time.Hour
	maxReclaimsDefault       = 3
	maxClaimBytesDefault     = 16 << 20
	maxProbeDelayDefault     = 15 * time.Second
	coalesceDelayDefault     = 7 * time.Millisecond
	sendTimeoutDefault       = 3 * time.Second
	storeTimeoutDefault      = 5 * time.Second
	retentionIntervalDefault = 10 * time.Minute
	statsIntervalDefault     = 15 * time.Second

	// minSendTimeout is the shortest send timeout a publisher or a RocketMQ sender accepts.
	minSendTimeout = 10 * time.Millisecond

	// maxCoalesceDelay bounds CoalesceDelay.
	maxCoalesceDelay = time.Second

	// maxBackoffLimit bounds MaxBackoff: a retry time must stay a valid DATETIME.
	maxBackoffLimit = 366 * 24 * time.Hour
	// firstProbeDelay is the pause before the first probe of an unavailable broker; it
	// doubles up to MaxProbeDelay.
	firstProbeDelay = 500 * time.Millisecond
	// partialOutageDelay is how long, in key order, the events of a queue whose broker is
	// away wait before they are tried again while other queues answer.
	partialOutageDelay = time.Second

	// maxInstanceIDLen is the width of the claim_owner column, in characters.
	maxInstanceIDLen = 64
)

// RetryForever, as [Config.MaxAttempts], never dead-letters an event for failed sends, and
// as [Tuning.MaxReclaims], never for reclaims.
const RetryForever = math.MaxInt32

// Config configures a [Publisher]. A zero field takes its default; a negative one is an
// error. The settings most services never change are in [Tuning].
type Config struct {
	// InstanceID is written to claim_owner to say which instance holds a lease. It must be
	// unique among the publishers of a table running at once (and should differ across
	// restarts, so a restarted instance never mistakes an old lease for its own): two
	// publishers of one table with one id take each other's claims for their own, and
	// events are sent twice (see [Publisher.Start]). At most 64 characters. Defaults to
	// [DefaultInstanceID](), a new id for each publisher.
	InstanceID string

	// StoreName names the publisher's store, for a service that publishes several databases
	// (shards, a database per tenant; see docs/many-databases.md): every log record of the
	// publisher carries it (attribute "store"), every one of its metrics too (attribute
	// "store"), and every send span (outbox.store); its [Health] says it. It is a metric label, so it must be bounded: a name
	// the service configures, such as "shard-03" or "tenant-eu", never a DSN or a value from
	// a request. 1 to 64 ASCII letters, digits, '_', '-' or '.', beginning with a letter or a
	// digit. One name is one store: the publishers of two stores under one name share their
	// series and log attribute. Required with SharedSender. Defaults to "": no store
	// attribute, as a service with one database needs.
	StoreName string

	// SharedSender says that other publishers send through the same sender (one RocketMQ
	// producer for the publishers of several databases): [Publisher.Close] then leaves the
	// sender open, and whoever made the sender closes it once, after the last of its
	// publishers has closed. Every publisher of one sender sets it: the Close of one that
	// owns it closes it under the others, whose sends then fail with [ErrClosed], as in a
	// broker outage. Defaults to false: the publisher owns its sender, and Close closes it.
	SharedSender bool

	// PollInterval is the pause between the end of one round and the start of the next
	// (fixed delay, not fixed rate, so slow rounds never pile up). A round that claimed all it
	// could and sent everything is followed at once by the next, to drain a backlog; a
	// commit through this process's store ([Tx.Commit], [MySQLStore.Notify]) ends the pause
	// early. Defaults to 5 seconds.
	PollInterval time.Duration

	// MaxAttempts is how many times an event is tried before it is dead-lettered: 1 sends
	// once and dead-letters at the first failure, [RetryForever] never dead-letters. Only
	// failures that belong to the message count: a send that failed because the broker was
	// unavailable (see [Sender]) counts nothing. Defaults to 4 (the design article's three
	// retries).
	MaxAttempts int

	// Backoff returns how long to wait before retry n, where n is 1 for the first retry: a
	// delay added to the database's clock, not the application's. A negative result is
	// taken as zero, and one over [Tuning.MaxBackoff] as MaxBackoff. Defaults to
	// [DefaultBackoff]: n² × 5 s, i.e. 5 s, 20 s, 45 s.
	Backoff func(n int) time.Duration

	// OnDeadLetter, if set, is called once for each event the publisher dead-letters, with
	// the event as it now stands (status FAIL) and the error of its last attempt, its
	// [Event.Failures] the failure history with that attempt last (read back from the row
	// once the dead letter is recorded). Use it to alert a person. Its calls never overlap: they run one at a time, in the order the
	// events were dead-lettered (by a send or by a reclaim, in a started publisher or in a
	// PublishPending or Reclaim call), on a goroutine of the publisher's own, after the
	// dead letter is recorded and outside the publisher's locks, so a slow callback holds up
	// no send; the calls it delays wait in a queue (not bounded: each entry is one event
	// already FAIL, and a bound would drop an alert or stall the sends). Its ctx carries the
	// values of the round's context, not its cancellation. A panic in it is logged. Stop and
	// Close wait for the calls already queued; PublishPending and Reclaim return once their
	// own have returned. Stop or Close called from inside it returns at once (the stop then
	// ends after the callback has returned).
	OnDeadLetter func(ctx context.Context, ev Event, cause error)

	// StopTimeout bounds [Publisher.Close]: how long it waits for the publisher to stop
	// (its send in flight finished and recorded, its claims released, its OnDeadLetter calls
	// returned) before it returns an error that says what was left. Defaults to
	// Tuning.SendTimeout plus twice Tuning.StoreTimeout (13 s with their defaults): a send
	// and the writes that record it. (Left zero, it stays zero in the Config and is worked
	// out from those two when Close runs.)
	StopTimeout time.Duration

	// Retention, when positive, turns on retention: beside its scan and reclaim loops the
	// publisher deletes the SUCCESS (and SKIPPED) events last updated more than Retention
	// ago, in small batches (see [Tuning.RetentionInterval] and [Store.Purge]). WAIT,
	// SENDING and FAIL events are never deleted. Every instance may turn it on: one purges
	// at a time, and the others skip their turn. Zero (the default) keeps every row; the
	// table then grows by one row per event for ever.
	Retention time.Duration

	// Logger receives the publisher's logs: debug for a claim lost to another instance, info
	// for a send, warn for a retry or a reclaim, error for a dead letter, a store error or an
	// unavailable broker. Defaults to the process's slog.Default() at warn and above (the
	// logger slog.Default() returns when each line is logged), so that dead letters and
	// errors go where the service's logs go while routine lines stay out; pass
	// slog.New(slog.DiscardHandler) to silence the publisher.
	Logger *slog.Logger

	// MeterProvider, if set, receives the publisher's metrics (see docs/operations.md for
	// every instrument). Nil records nothing, at no cost; the package never uses the global
	// provider.
	MeterProvider metric.MeterProvider

	// TracerProvider, if set, makes every send a producer span, linked to the trace context
	// each event was inserted with (see docs/tracing.md). The publisher uses it alone, never
	// the global provider. Defaults to nil: no spans. Events carry their trace context to
	// the broker either way.
	TracerProvider trace.TracerProvider

	// Tuning holds the settings most services never change.
	Tuning Tuning
}

// Tuning holds the publisher's settings that most services leave at their defaults (see
// docs/configuration.md and docs/performance.md for what each trades). A zero field takes
// its default; a negative one is an error.
type Tuning struct {
	// ClaimPerRow claims as the design article does: a lock-free SELECT of candidates, then
	// one conditional UPDATE per candidate whose affected-row count decides ownership, and one
	// UPDATE per outcome. By default a round claims up to BatchSize due events in one short
	// transaction (SELECT ... FOR UPDATE SKIP LOCKED, then one UPDATE), sends them as
	// batches, and records every success with one UPDATE; instances skip each other's rows
	// instead of contending for them. Both give the same guarantees.
	ClaimPerRow bool

	// BatchSize is how many events one round claims at most: the rows one claim takes (the
	// publisher claims fewer when a batch took more than half of the send timeout to send,
	// so that it never claims more than it can send in time), or, with ClaimPerRow, the
	// candidates the SELECT reads. Defaults to 1000, or to 20 with ClaimPerRow.
	BatchSize int

	// CoalesceDelay trades a few milliseconds of latency for rounds that carry many events,
	// so that publishing at a steady commit rate costs the database little. When commits
	// come often enough that a short wait gathers more of them (more than one event per
	// window, by the rate this publisher claims), a commit's wake-up waits before its round:
	// a window that each round adjusts so that the events it sends have taken about
	// CoalesceDelay on average from their insert to their send. The window closes when they
	// take longer than CoalesceDelay without waiting; it is at most 20 times CoalesceDelay
	// and never longer than PollInterval. A backlog is drained without waiting, and at a low
	// rate nothing waits. At most 1 s. Defaults to 7 ms (see docs/performance.md).
	CoalesceDelay time.Duration

	// EagerClaims starts a round at every wake-up at once, with no coalescing window: the
	// lowest latency, at a claim per commit or two.
	EagerClaims bool

	// ReclaimInterval is the pause between reclaim runs: a dead instance's claims are sent
	// again at most Lease plus this after its last renewal. A reclaim that put events back
	// starts a round at once. Defaults to 5 seconds.
	ReclaimInterval time.Duration

	// Lease is how long a claim may stay SENDING without news of its owner before another
	// instance may reclaim it and send it again. While a send is in flight its owner renews
	// the leases of its events every third of Lease (a renewal waits at most that, and
	// StoreTimeout), so a slow but live send keeps them, and an instance that dies leaves
	// its claims to the others after one Lease: with the defaults, they are sent again
	// within 20 seconds. At least 1 second. Defaults to 15 seconds.
	Lease time.Duration

	// MaxBackoff caps the delay Backoff gives, whatever the retry number. At most a year.
	// Defaults to 1 hour.
	MaxBackoff time.Duration

	// MaxReclaims is how many times an event may be reclaimed (its lease expired with no
	// outcome recorded: the instance holding it died or stalled) before it is dead-lettered
	// as a poison event, one whose send kills the process every time. An event reclaimed
	// once is claimed alone from then on, so that the death of an instance sending a whole
	// batch counts only once against each of its events. [RetryForever] never dead-letters
	// for reclaims. Defaults to 3.
	MaxReclaims int

	// MaxClaimBytes bounds the payload bytes one batch claim holds in memory (a claim always
	// takes at least one event). Defaults to 16 MiB.
	MaxClaimBytes int

	// MaxProbeDelay caps the pause between probes while the broker is unavailable. The
	// publisher stops claiming when a round's sends fail as [Unavailable] with none
	// succeeding, and then sends one event at a time, after 0.5 s, 1 s, 2 s and so on up to
	// MaxProbeDelay, until one is accepted; then it resumes at full speed. Defaults to 15
	// seconds.
	MaxProbeDelay time.Duration

	// SendTimeout bounds one call to [Sender.Send], the client's own retries included: at
	// least 10 ms (its leases are renewed while it runs, see Lease). A sender that bounds
	// its sends itself says so in [SenderInfo.SendTimeout]
	// ([RocketMQSender] does, from [RocketMQConfig.SendTimeout]): left zero, SendTimeout is
	// the sender's, so the value is set in one place; set to anything else, NewPublisher
	// refuses it. Defaults to the sender's, or else to 3 seconds.
	SendTimeout time.Duration

	// StoreTimeout bounds each store call. Defaults to 5 seconds.
	StoreTimeout time.Duration

	// RetentionInterval is the pause between retention runs. Defaults to 10 minutes.
	RetentionInterval time.Duration

	// RetentionBatch is how many rows one retention DELETE removes at most (at most 10,000).
	// Defaults to 500.
	RetentionBatch int

	// RetentionPause is the pause between two retention DELETEs. Defaults to 100 ms.
	RetentionPause time.Duration

	// StatsInterval is how often, at most, the table gauges read the table's statistics
	// ([Store.Stats]): one indexed statement per interval for this publisher, however often
	// the gauges are collected; a collection between two reads reports the last one. Only
	// with a MeterProvider, and only while the publisher runs. Defaults to 15 seconds.
	StatsInterval time.Duration
}

// withDefaults fills the zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	t := &c.Tuning
	if t.ClaimPerRow {
		t.BatchSize = cmp.Or(t.BatchSize, batchSizePerRowDefault)
	} else {
		t.BatchSize = cmp.Or(t.BatchSize, batchSizeDefault)
	}
	c.PollInterval = cmp.Or(c.PollInterval, pollIntervalDefault)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, maxAttemptsDefault)
	t.ReclaimInterval = cmp.Or(t.ReclaimInterval, reclaimIntervalDefault)
	t.Lease = cmp.Or(t.Lease, leaseDefault)
	t.MaxBackoff = cmp.Or(t.MaxBackoff, maxBackoffDefault)
	t.MaxReclaims = cmp.Or(t.MaxReclaims, maxReclaimsDefault)
	t.MaxClaimBytes = cmp.Or(t.MaxClaimBytes, maxClaimBytesDefault)
	t.MaxProbeDelay = cmp.Or(t.MaxProbeDelay, maxProbeDelayDefault)
	t.SendTimeout = cmp.Or(t.SendTimeout, sendTimeoutDefault)
	t.StoreTimeout = cmp.Or(t.StoreTimeout, storeTimeoutDefault)
	t.RetentionInterval = cmp.Or(t.RetentionInterval, retentionIntervalDefault)
	t.RetentionBatch = cmp.Or(t.RetentionBatch, purgeBatchDefault)
	t.RetentionPause = cmp.Or(t.RetentionPause, purgePauseDefault)
	t.StatsInterval = cmp.Or(t.StatsInterval, statsIntervalDefault)
	t.CoalesceDelay = cmp.Or(t.CoalesceDelay, coalesceDelayDefault)
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.New(defaultLogHandler{min: slog.LevelWarn})
	}
	if c.InstanceID == "" {
		c.InstanceID = DefaultInstanceID()
	}
	return c, c.validate()
}

// stopTimeout is StopTimeout, or its default: SendTimeout plus twice StoreTimeout (capped
// where the sum would overflow).
func (c Config) stopTimeout() time.Duration {
	if c.StopTimeout > 0 {
		return c.StopTimeout
	}
	d := c.Tuning.SendTimeout
	for range 2 {
		if d > math.MaxInt64-c.Tuning.StoreTimeout {
			return math.MaxInt64
		}
		d += c.Tuning.StoreTimeout
	}
	return d
}

// retryPolicy is the publisher's rule for failed sends.
func (c Config) retryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: c.MaxAttempts, Backoff: c.Backoff, MaxBackoff: c.Tuning.MaxBackoff}
}

// coalesceTarget is the coalescing window's target: zero, off, with EagerClaims.
func (c Config) coalesceTarget() time.Duration {
	if c.Tuning.EagerClaims {
		return 0
	}
	return c.Tuning.CoalesceDelay
}

func (c Config) validate() error {
	t := c.Tuning
	positive := []struct {
		name string
		v    int64
	}{
		{"PollInterval", int64(c.PollInterval)},
		{"MaxAttempts", int64(c.MaxAttempts)},
		{"Retention", int64(c.Retention)},
		{"StopTimeout", int64(c.StopTimeout)},
		{"Tuning.BatchSize", int64(t.BatchSize)},
		{"Tuning.CoalesceDelay", int64(t.CoalesceDelay)},
		{"Tuning.ReclaimInterval", int64(t.ReclaimInterval)},
		{"Tuning.Lease", int64(t.Lease)},
		{"Tuning.MaxBackoff", int64(t.MaxBackoff)},
		{"Tuning.MaxReclaims", int64(t.MaxReclaims)},
		{"Tuning.MaxClaimBytes", int64(t.MaxClaimBytes)},
		{"Tuning.MaxProbeDelay", int64(t.MaxProbeDelay)},
		{"Tuning.SendTimeout", int64(t.SendTimeout)},
		{"Tuning.StoreTimeout", int64(t.StoreTimeout)},
		{"Tuning.RetentionInterval", int64(t.RetentionInterval)},
		{"Tuning.RetentionBatch", int64(t.RetentionBatch)},
		{"Tuning.RetentionPause", int64(t.RetentionPause)},
		{"Tuning.StatsInterval", int64(t.StatsInterval)},
	}
	for _, f := range positive {
		if f.v < 0 {
			return fmt.Errorf("%w: %s must be positive, got %d", ErrInvalidConfig, f.name, f.v)
		}
	}
	if t.CoalesceDelay > maxCoalesceDelay {
		return fmt.Errorf("%w: Tuning.CoalesceDelay must be at most %s, got %s (Tuning.EagerClaims turns coalescing off)", ErrInvalidConfig, maxCoalesceDelay, t.CoalesceDelay)
	}
	if t.RetentionBatch > maxAdminBatch {
		return fmt.Errorf("%w: Tuning.RetentionBatch must be at most %d, got %d", ErrInvalidConfig, maxAdminBatch, t.RetentionBatch)
	}
	if t.MaxBackoff > maxBackoffLimit {
		return fmt.Errorf("%w: Tuning.MaxBackoff must be at most %s, got %s", ErrInvalidConfig, maxBackoffLimit, t.MaxBackoff)
	}
	if t.Lease < time.Second {
		return fmt.Errorf("%w: Tuning.Lease must be at least 1s, got %s", ErrInvalidConfig, t.Lease)
	}
	if t.SendTimeout < minSendTimeout {
		return fmt.Errorf("%w: Tuning.SendTimeout must be at least %s, got %s: a send that can never finish in time would fail forever",
			ErrInvalidConfig, minSendTimeout, t.SendTimeout)
	}
	if !utf8.ValidString(c.InstanceID) || strings.TrimSpace(c.InstanceID) != c.InstanceID {
		return fmt.Errorf("%w: InstanceID %q must be valid UTF-8 without surrounding spaces", ErrInvalidConfig, c.InstanceID)
	}
	if n := utf8.RuneCountInString(c.InstanceID); n > maxInstanceIDLen {
		return fmt.Errorf("%w: InstanceID is %d characters, at most %d fit in claim_owner",
			ErrInvalidConfig, n, maxInstanceIDLen)
	}
	if c.SharedSender && c.StoreName == "" {
		return fmt.Errorf("%w: SharedSender needs StoreName: the publishers of one sender are told apart by their store's name in logs, metrics and Health",
			ErrInvalidConfig)
	}
	if c.StoreName != "" {
		if err := checkStoreName(c.StoreName); err != nil {
			return fmt.Errorf("%w: StoreName %w", ErrInvalidConfig, err)
		}
	}
	return nil
}

// checkStoreName says what is wrong with a store name (by the rule of package storename),
// or returns nil.
func checkStoreName(name string) error {
	err := storename.Check(name)
	switch {
	case err == nil:
		return nil
	case len(name) > storename.MaxLen:
		return fmt.Errorf("%.20q... %w: it is a metric label, a short name the service configures (shard-03), never a DSN", name, err)
	}
	return fmt.Errorf("%q %w (shard-03, tenant_eu)", name, err)
}

// DefaultInstanceID returns a new instance id of the form host-pid-suffix, e.g.
// order-7d9f-4811-a1b2c3: the host names the machine or pod, the pid the process, and the
// random suffix, new on every call, tells apart two publishers of one process and two runs
// of the same process id.
func DefaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "outbox"
	}
	host = strings.Map(func(r rune) rune {
		if r < 0x20 || r == ' ' {
			return '-'
		}
		return r
	}, host)
	tail := "-" + strconv.Itoa(os.Getpid()) + "-" + randomSuffix()
	if room := maxInstanceIDLen - len(tail); len(host) > room {
		host = strings.ToValidUTF8(host[:room], "")
	}
	return host + tail
}

func randomSuffix() string {
	var b [3]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error
	return hex.EncodeToString(b[:])
}

// withSenderTimeout takes the send timeout from a sender that bounds its sends itself, or
// checks that the two agree (see [Tuning.SendTimeout]). It runs before the defaults are
// filled in.
func (c Config) withSenderTimeout(info SenderInfo) (Config, error) {
	own := info.SendTimeout
	switch {
	case own <= 0 || c.Tuning.SendTimeout < 0:
	case c.Tuning.SendTimeout == 0:
		c.Tuning.SendTimeout = own
	case c.Tuning.SendTimeout != own:
		return c, fmt.Errorf("%w: Tuning.SendTimeout (%s) differs from the sender's own (%s): leave it zero and the publisher uses the sender's",
			ErrInvalidConfig, c.Tuning.SendTimeout, own)
	}
	return c, nil
}

// defaultLogHandler is the publisher's logger when [Config.Logger] is nil: the handler of
// slog.Default() as it is when a line is logged (so a service that sets its default logger
// after making the publisher still gets the lines), for records at min and above.
type defaultLogHandler struct {
	min slog.Level
	// with re-applies the attributes and groups given to the logger to the default's handler.
	with func(slog.Handler) slog.Handler
}

func (h defaultLogHandler) handler() slog.Handler {
	d := slog.Default().Handler()
	if h.with != nil {
		d = h.with(d)
	}
	return d
}

func (h defaultLogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return level >= h.min && slog.Default().Handler().Enabled(ctx, level)
}

func (h defaultLogHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.handler().Handle(ctx, r)
}

func (h defaultLogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return h.chain(func(d slog.Handler) slog.Handler { return d.WithAttrs(attrs) })
}

func (h defaultLogHandler) WithGroup(name string) slog.Handler {
	return h.chain(func(d slog.Handler) slog.Handler { return d.WithGroup(name) })
}

func (h defaultLogHandler) chain(next func(slog.Handler) slog.Handler) slog.Handler {
	prev := h.with
	h.with = func(d slog.Handler) slog.Handler {
		if prev != nil {
			d = prev(d)
		}
		return next(d)
	}
	return h
}
