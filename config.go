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
)

// ClaimMode says how a publisher claims events. Both give the same guarantees: an event is
// sent only by the instance whose claim changed its row, and every outcome is written under
// that claim.
type ClaimMode int

const (
	// ClaimBatch claims up to BatchSize due events in one short transaction (SELECT ... FOR
	// UPDATE SKIP LOCKED, then one UPDATE), sends them (in batches, when the Sender is a
	// [BatchSender]), and records every success with one UPDATE. Instances skip each other's
	// rows instead of contending for them. The default.
	ClaimBatch ClaimMode = iota
	// ClaimPerRow is the design article's loop: a lock-free SELECT of candidates, then one
	// conditional UPDATE per candidate whose affected-row count decides ownership, and one
	// UPDATE per outcome.
	ClaimPerRow
)

func (m ClaimMode) String() string {
	switch m {
	case ClaimBatch:
		return "batch"
	case ClaimPerRow:
		return "per-row"
	}
	return "ClaimMode(" + strconv.Itoa(int(m)) + ")"
}

// Defaults, as the design article sets them, and for the batch claim.
const (
	BatchSizeDefault       = 20   // per-row mode, as the article
	BatchSizeBatchDefault  = 1000 // batch mode
	PollIntervalDefault    = 5 * time.Second
	ReclaimIntervalDefault = 60 * time.Second
	LeaseDefault           = 10 * time.Minute
	MaxRetryDefault        = 3
	MaxBackoffDefault      = time.Hour
	MaxReclaimsDefault     = 3
	MaxClaimBytesDefault   = 16 << 20
	MaxProbeDelayDefault   = 15 * time.Second
	CoalesceDelayDefault   = 7 * time.Millisecond
	SendTimeoutDefault     = 3 * time.Second
	StoreTimeoutDefault    = 5 * time.Second

	// MinSendTimeout is the shortest SendTimeout a publisher or a RocketMQ sender accepts.
	MinSendTimeout = 10 * time.Millisecond

	// NoRetries, as [Config.MaxRetry], dead-letters an event at its first failed send.
	NoRetries = -1
	// NoCoalescing, as [Config.CoalesceDelay], starts a round at every wake-up at once.
	NoCoalescing = -1

	// RetryForever, as [Config.MaxRetry], never dead-letters an event for failed sends, and
	// as [Config.MaxReclaims], never for reclaims.
	RetryForever = math.MaxInt32

	// maxCoalesceDelay bounds CoalesceDelay.
	maxCoalesceDelay = time.Second

	// maxBackoffLimit bounds MaxBackoff: a retry time must stay a valid DATETIME.
	maxBackoffLimit = 366 * 24 * time.Hour
	// firstProbeDelay is the pause before the first probe of an unavailable broker; it
	// doubles up to MaxProbeDelay.
	firstProbeDelay = 500 * time.Millisecond

	// maxInstanceIDLen is the width of the claim_owner column, in characters.
	maxInstanceIDLen = 64
)

// Config configures a [Publisher]. A zero field takes its default; a negative one is an error.
type Config struct {
	// InstanceID is written to claim_owner to say which instance holds a lease. It must be
	// unique among the instances running at once (and should differ across restarts, so a
	// restarted instance never mistakes an old lease for its own). At most 64 characters;
	// ASCII ids, like the default, fill claim_owner exactly, so a claim rewrites the row in
	// place (see schema.sql).
	// Defaults to [DefaultInstanceID]().
	InstanceID string

	// ClaimMode is how events are claimed. Defaults to ClaimBatch.
	ClaimMode ClaimMode

	// BatchSize is how many events one round claims at most: the candidates the SELECT reads
	// in per-row mode, the rows one claim takes in batch mode (where the publisher claims
	// fewer when a batch took more than half of SendTimeout to send, so that it never claims
	// more than it can send in time). Defaults to 20 in per-row mode, 1000 in batch mode.
	BatchSize int

	// PollInterval is the pause between the end of one round and the start of the next
	// (fixed delay, not fixed rate, so slow rounds never pile up). A round that claimed all it
	// could and sent everything is followed at once by the next, to drain a backlog; a
	// commit through this process's store (Tx.Commit) ends the pause early. Defaults to 5
	// seconds.
	PollInterval time.Duration

	// CoalesceDelay trades a few milliseconds of latency for rounds that carry many events,
	// so that publishing at a steady commit rate costs the database little. When commits
	// come often enough that a short wait gathers more of them (more than one event per
	// window, by the rate this publisher claims), a commit's wake-up waits before its round:
	// a window that each round adjusts so that the events it sends have taken about
	// CoalesceDelay on average from their insert to their send (their age by the database's
	// clock when the claim read them, and by this process's since). The window grows while
	// they take less, shrinks when more, and closes when they take longer than CoalesceDelay
	// without waiting (rounds that long carry many events anyway); it is at most 20 times
	// CoalesceDelay and never longer than PollInterval. A backlog is drained without waiting, and at a low rate
	// nothing waits. [NoCoalescing] claims at every wake-up at once. At most 1 s. Defaults
	// to 7 ms (see the README's steady-state figures).
	CoalesceDelay time.Duration

	// Ordering, when not Unordered, publishes the events of one biz no in id order (see
	// [KeyOrder] and the README's "Per-key ordering"): the store must be a [KeyOrderer] whose
	// table has the index ordered claims need (Run checks it at start), and a [BatchSender]
	// must keep a key's events in order (a [RocketMQSender] does with
	// [RocketMQConfig.KeyOrder]). Defaults to Unordered.
	Ordering Ordering

	// ReclaimInterval is the pause between reclaim runs. Defaults to 60 seconds.
	ReclaimInterval time.Duration

	// Lease is how long a claim may stay SENDING before another instance may reclaim it. It
	// must be far longer than the slowest send. Defaults to 10 minutes.
	Lease time.Duration

	// MaxRetry is how many times a failed send is retried before the event is dead-lettered:
	// an event is tried at most MaxRetry+1 times. [NoRetries] dead-letters at the first
	// failure, [RetryForever] never. Only failures that belong to the message count: a send
	// that failed because the broker was unavailable (see [Sender]) spends no retry.
	// Defaults to 3.
	MaxRetry int

	// Backoff gives the delay before retry n (1-based). Defaults to [DefaultBackoff]:
	// n² × 5 s, i.e. 5 s, 20 s, 45 s.
	Backoff Backoff

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

	// SendTimeout bounds one call to [Sender.Send], the client's own retries included. It
	// must be at least [MinSendTimeout] and at most a tenth of Lease, so that a send never outlives its lease in practice.
	// A sender that bounds its sends itself says so with a method SendTimeout() time.Duration
	// ([RocketMQSender] has one, from [RocketMQConfig.SendTimeout]): left zero, SendTimeout is
	// the sender's, so the value is set in one place; set to anything else, NewPublisher
	// refuses it (shorter, the publisher would cut off the client's own retries to other
	// brokers; longer, it would size batch claims for time the sender never gives them).
	// Defaults to the sender's, or else to 3 seconds.
	SendTimeout time.Duration

	// StoreTimeout bounds each store call. Defaults to 5 seconds.
	StoreTimeout time.Duration

	// Logger receives the publisher's logs: debug for a claim lost to another instance, info
	// for a send, warn for a retry or a reclaim, error for a dead letter, a store error or an
	// unavailable broker. Defaults to the process's slog.Default() at warn and above (the
	// logger slog.Default() returns when each line is logged), so that dead letters and
	// errors go where the service's logs go while routine lines stay out; pass
	// slog.New(slog.DiscardHandler) to silence the publisher.
	Logger *slog.Logger

	// Retention, when positive, turns on retention: beside its scan and reclaim loops the
	// publisher deletes the SUCCESS (and SKIPPED) events last updated more than Retention ago, every
	// RetentionInterval, in batches of RetentionBatch rows with RetentionPause between them
	// (see [MySQLStore.Purge]). WAIT, SENDING and FAIL events are never deleted. Every
	// instance may turn it on: a named lock per table lets one purge at a time, and the
	// others skip their turn. The store must be a [Purger]. Zero (the default) keeps every
	// row; the table then grows by one row per event for ever.
	Retention time.Duration

	// RetentionInterval is the pause between retention runs. Defaults to 10 minutes.
	RetentionInterval time.Duration

	// RetentionBatch is how many rows one retention DELETE removes at most. Defaults to
	// 500.
	RetentionBatch int

	// RetentionPause is the pause between two retention DELETEs. Defaults to
	// 100 ms.
	RetentionPause time.Duration

	// OnDeadLetter, if set, is called once for each event the publisher dead-letters, with the
	// event as it now stands (status FAIL) and the error of its last attempt. Use it to alert a
	// person. It runs on the publishing goroutine: keep it quick.
	OnDeadLetter func(ctx context.Context, ev Event, cause error)

	// TracerProvider, if set, makes every send a producer span, linked to the trace context
	// each event was inserted with (see the README's "Tracing"). The publisher uses it
	// alone, never the global provider. Defaults to nil: no spans. Events carry their trace
	// context to the broker either way.
	TracerProvider trace.TracerProvider

	// MeterProvider, if set, receives the publisher's metrics (see the README's "Metrics and
	// health" for every instrument). Nil records nothing, at no cost; the package never
	// uses the global provider.
	MeterProvider metric.MeterProvider

	// StatsInterval is how often, at most, the table gauges read the table's statistics
	// ([StatsReader]): one indexed statement per interval for this publisher, however often
	// the gauges are collected; a collection between two reads reports the last one. Only
	// with a MeterProvider, and only while Run runs. Defaults to 15 seconds.
	StatsInterval time.Duration
}

// withDefaults fills the zero fields and validates the result.
func (c Config) withDefaults() (Config, error) {
	if c.ClaimMode == ClaimPerRow {
		c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	} else {
		c.BatchSize = cmp.Or(c.BatchSize, BatchSizeBatchDefault)
	}
	c.PollInterval = cmp.Or(c.PollInterval, PollIntervalDefault)
	c.ReclaimInterval = cmp.Or(c.ReclaimInterval, ReclaimIntervalDefault)
	c.Lease = cmp.Or(c.Lease, LeaseDefault)
	c.MaxRetry = cmp.Or(c.MaxRetry, MaxRetryDefault)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, MaxBackoffDefault)
	c.MaxReclaims = cmp.Or(c.MaxReclaims, MaxReclaimsDefault)
	c.MaxClaimBytes = cmp.Or(c.MaxClaimBytes, MaxClaimBytesDefault)
	c.MaxProbeDelay = cmp.Or(c.MaxProbeDelay, MaxProbeDelayDefault)
	c.SendTimeout = cmp.Or(c.SendTimeout, SendTimeoutDefault)
	c.StoreTimeout = cmp.Or(c.StoreTimeout, StoreTimeoutDefault)
	c.RetentionInterval = cmp.Or(c.RetentionInterval, RetentionIntervalDefault)
	c.RetentionBatch = cmp.Or(c.RetentionBatch, purgeBatchDefault)
	c.RetentionPause = cmp.Or(c.RetentionPause, purgePauseDefault)
	c.StatsInterval = cmp.Or(c.StatsInterval, StatsIntervalDefault)
	c.CoalesceDelay = cmp.Or(c.CoalesceDelay, CoalesceDelayDefault)
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

func (c Config) validate() error {
	positive := []struct {
		name string
		v    int64
	}{
		{"BatchSize", int64(c.BatchSize)},
		{"PollInterval", int64(c.PollInterval)},
		{"ReclaimInterval", int64(c.ReclaimInterval)},
		{"Lease", int64(c.Lease)},
		{"MaxBackoff", int64(c.MaxBackoff)},
		{"MaxReclaims", int64(c.MaxReclaims)},
		{"MaxClaimBytes", int64(c.MaxClaimBytes)},
		{"MaxProbeDelay", int64(c.MaxProbeDelay)},
		{"SendTimeout", int64(c.SendTimeout)},
		{"StoreTimeout", int64(c.StoreTimeout)},
		{"Retention", int64(c.Retention)},
		{"RetentionInterval", int64(c.RetentionInterval)},
		{"RetentionBatch", int64(c.RetentionBatch)},
		{"RetentionPause", int64(c.RetentionPause)},
		{"StatsInterval", int64(c.StatsInterval)},
	}
	for _, f := range positive {
		if f.v < 0 {
			return fmt.Errorf("%w: %s must be positive, got %d", ErrInvalidConfig, f.name, f.v)
		}
	}
	if c.CoalesceDelay < 0 && c.CoalesceDelay != NoCoalescing || c.CoalesceDelay > maxCoalesceDelay {
		return fmt.Errorf("%w: CoalesceDelay must be between 0 and %s, or NoCoalescing, got %s", ErrInvalidConfig, maxCoalesceDelay, c.CoalesceDelay)
	}
	if c.MaxRetry < NoRetries {
		return fmt.Errorf("%w: MaxRetry must be positive, NoRetries or RetryForever, got %d", ErrInvalidConfig, c.MaxRetry)
	}
	if c.RetentionBatch > maxAdminBatch {
		return fmt.Errorf("%w: RetentionBatch must be at most %d, got %d", ErrInvalidConfig, maxAdminBatch, c.RetentionBatch)
	}
	if c.MaxBackoff > maxBackoffLimit {
		return fmt.Errorf("%w: MaxBackoff must be at most %s, got %s", ErrInvalidConfig, maxBackoffLimit, c.MaxBackoff)
	}
	if c.Ordering < Unordered || c.Ordering > KeyOrderSkipDeadLetters {
		return fmt.Errorf("%w: unknown Ordering %d", ErrInvalidConfig, c.Ordering)
	}
	if c.ClaimMode != ClaimBatch && c.ClaimMode != ClaimPerRow {
		return fmt.Errorf("%w: unknown ClaimMode %d", ErrInvalidConfig, c.ClaimMode)
	}
	if c.Lease < time.Second {
		return fmt.Errorf("%w: Lease must be at least 1s, got %s", ErrInvalidConfig, c.Lease)
	}
	if c.SendTimeout < MinSendTimeout {
		return fmt.Errorf("%w: SendTimeout must be at least %s, got %s: a send that can never finish in time would fail forever",
			ErrInvalidConfig, MinSendTimeout, c.SendTimeout)
	}
	if c.SendTimeout > c.Lease/10 {
		return fmt.Errorf("%w: SendTimeout (%s) must be at most a tenth of Lease (%s), or a slow send outlives its lease and is sent twice",
			ErrInvalidConfig, c.SendTimeout, c.Lease)
	}
	if !utf8.ValidString(c.InstanceID) || strings.TrimSpace(c.InstanceID) != c.InstanceID {
		return fmt.Errorf("%w: InstanceID %q must be valid UTF-8 without surrounding spaces", ErrInvalidConfig, c.InstanceID)
	}
	if n := utf8.RuneCountInString(c.InstanceID); n > maxInstanceIDLen {
		return fmt.Errorf("%w: InstanceID is %d characters, at most %d fit in claim_owner",
			ErrInvalidConfig, n, maxInstanceIDLen)
	}
	return nil
}

// DefaultInstanceID returns an instance id of the form host-pid-suffix, e.g.
// order-7d9f-4811-a1b2c3: the host names the machine or pod, the pid the process, and the
// random suffix tells apart two runs of the same process id.
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

// withSenderTimeout takes SendTimeout from a sender that bounds its sends itself, or checks
// that the two agree (see [Config.SendTimeout]). It runs before the defaults are filled in.
func (c Config) withSenderTimeout(sender Sender) (Config, error) {
	st, ok := sender.(interface{ SendTimeout() time.Duration })
	if !ok || c.SendTimeout < 0 {
		return c, nil
	}
	own := st.SendTimeout()
	switch {
	case own <= 0:
	case c.SendTimeout == 0:
		c.SendTimeout = own
	case c.SendTimeout != own:
		return c, fmt.Errorf("%w: SendTimeout (%s) differs from the sender's own (%s): leave Config.SendTimeout zero and the publisher uses the sender's",
			ErrInvalidConfig, c.SendTimeout, own)
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
