package inbox

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

//go:embed schema.sql
var schemaSQL string

// Message is one delivery of an event, as the handler sees it.
type Message struct {
	// EventID is the event's id (the eventId property): a UUIDv7, the same for every
	// delivery and every resend of the event. The inbox deduplicates on it.
	EventID   string
	EventType string // the eventType property (the message's tag)
	BizNo     string // the bizNo property (the message's key)
	Body      []byte
	// Properties are all of the message's properties, the three above and the trace
	// context included.
	Properties map[string]string

	Topic string
	// MsgID is the broker's id of this message; a resend of the event has another.
	MsgID string
	// Deliveries is how many times this message has been delivered, this one included.
	Deliveries int
	// BornAt is when the producer sent the message (the publisher's clock).
	BornAt time.Time
}

// Handler does a message's effect in tx, the transaction in which the inbox has already
// recorded the message's event id. Return nil to commit both; any error rolls both back.
// An error marked with [outbox.Permanent] says the message can never be processed: it is
// recorded as rejected and acknowledged. Any other error is retried: the message is
// delivered again (by RocketMQ, with its backoff) until [Config.MaxDeliveries].
//
// The handler must not commit or roll back tx, must do its effect through tx alone (an
// effect outside it, an HTTP call or a write on another connection, is not undone when the
// transaction rolls back, nor deduplicated), and must return every statement's error: after
// a deadlock InnoDB has rolled the whole transaction back, the inbox record with it, and a
// handler that went on would write the rest of its effect outside any transaction.
type Handler func(ctx context.Context, tx *sql.Tx, msg *Message) error

// Outcome is what became of one delivery.
type Outcome int

const (
	// Handled: the handler ran and its transaction committed with the inbox record.
	Handled Outcome = iota + 1
	// Duplicate: the group had handled the event already; the handler did not run.
	Duplicate
	// Rejected: the message can never be processed; it was recorded in the rejected table.
	Rejected
	// Failed: the handler or the database failed; nothing was committed, and the message
	// is to be delivered again.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Handled:
		return "handled"
	case Duplicate:
		return "duplicate"
	case Rejected:
		return "rejected"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Why a message was rejected: the reason_class column, and the metric's reason.
const (
	reasonNoEventID      = "no_event_id"
	reasonInvalidEventID = "invalid_event_id"
	reasonPermanent      = "permanent"
	reasonDeliveries     = "max_deliveries"
)

// Defaults.
const (
	tableDefault         = "t_inbox"
	maxDeliveriesDefault = 5
	retentionBatch       = 500
)

// Config configures an [Inbox]. A zero field takes its default.
type Config struct {
	// Group is the consumer group: the RocketMQ consumer group the messages are consumed
	// in, and the scope of deduplication (each group has its own effects, so an event
	// handled by one group is new to another). Required.
	Group string

	// Table is the inbox table; the rejected messages go to Table + "_rejected". ASCII
	// letters, digits and underscores (it may begin with a digit or be a reserved word:
	// every statement quotes it), at most 55, so that the rejected table's name is at most
	// 64. Defaults to "t_inbox".
	Table string

	// MaxDeliveries is how many deliveries of a message may fail (the handler or the
	// database returning an error that is not Permanent) before the message is rejected
	// rather than delivered again: a poison message stops costing a redelivery. A failure
	// that is the infrastructure's (the database unreachable or its connection lost, a
	// deadlock, a lock wait timeout, an error the handler marked [outbox.Unavailable]) is
	// delivered again whatever the count: a fault alone never rejects a message. Defaults
	// to 5. [outbox.RetryForever] never rejects a message for its failures.
	MaxDeliveries int

	// TxOptions are the options of the transaction the handler runs in. Defaults to nil:
	// the session's isolation level (the server's, REPEATABLE READ unless the DSN or the
	// server sets another), as the service's other transactions have. The inbox needs no
	// particular level: its record is an INSERT on a primary key. An isolation level here
	// costs a statement per message: the driver sends SET TRANSACTION ISOLATION LEVEL
	// before each BEGIN. To have another level at no cost, set it for the whole pool in the
	// DSN (transaction_isolation, or tx_isolation on MariaDB before 11.1).
	TxOptions *sql.TxOptions

	// Logger receives the inbox's logs: info for a duplicate suppressed, warn for a failed
	// delivery, error for a rejected message. Defaults to slog.Default() at warn and above.
	Logger *slog.Logger

	// MeterProvider, if set, receives the inbox's metrics (see docs/inbox.md). Nil records
	// nothing; the global provider is never used.
	MeterProvider metric.MeterProvider

	// TracerProvider, if set, makes every delivery a consumer span that continues the trace
	// the message carries (traceparent, tracestate). Nil makes no spans.
	TracerProvider trace.TracerProvider

	// Retention, when positive, makes every Consumer of the inbox delete, every
	// RetentionInterval, the inbox rows recorded more than Retention ago ([Inbox.Purge]:
	// in batches, one purge of the table at a time across instances). It must be longer
	// than a duplicate can come late (see Purge); days are a safe choice. Zero (the
	// default) keeps every row.
	Retention time.Duration

	// RetentionInterval is the pause between two retention runs. Defaults to 10 minutes.
	RetentionInterval time.Duration
}

var (
	// groupRE is RocketMQ's rule for consumer group names.
	groupRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,255}$`)
)

// Inbox records, per consumer group, the events whose effect has happened, in the same
// transaction as the effect, so that each event's effect happens once however often it is
// delivered. One Inbox may serve any number of goroutines and consumers of its group.
type Inbox struct {
	db       *sql.DB
	cfg      Config
	table    string
	rejected string
	log      *slog.Logger
	m        *metrics
	tracer   trace.Tracer
	q        queries
}

// New returns an inbox for cfg.Group in db. It does not create the tables; see
// [Inbox.CreateSchema]. db should be opened with parseTime=true.
func New(db *sql.DB, cfg Config) (*Inbox, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", outbox.ErrInvalidConfig)
	}
	if cfg.Group == "" {
		return nil, fmt.Errorf("%w: Group is empty: the inbox deduplicates per consumer group", outbox.ErrInvalidConfig)
	}
	if !groupRE.MatchString(cfg.Group) {
		return nil, fmt.Errorf("%w: Group %q must be 1 to 255 letters, digits, '_', '-', '%%' or '|', as RocketMQ's consumer groups", outbox.ErrInvalidConfig, cfg.Group)
	}
	cfg.Table = cmp.Or(cfg.Table, tableDefault)
	if err := mysqldialect.CheckTable(cfg.Table); err != nil {
		return nil, fmt.Errorf("%w: inbox: Table: %w", outbox.ErrInvalidConfig, err)
	}
	if err := mysqldialect.CheckTable(cfg.Table + "_rejected"); err != nil {
		return nil, fmt.Errorf("%w: inbox: Table %q is over 55 characters: the rejected messages' table: %w", outbox.ErrInvalidConfig, cfg.Table, err)
	}
	cfg.MaxDeliveries = cmp.Or(cfg.MaxDeliveries, maxDeliveriesDefault)
	if cfg.MaxDeliveries < 0 {
		return nil, fmt.Errorf("%w: MaxDeliveries must be positive, got %d", outbox.ErrInvalidConfig, cfg.MaxDeliveries)
	}
	cfg.RetentionInterval = cmp.Or(cfg.RetentionInterval, 10*time.Minute)
	if cfg.Retention < 0 || cfg.RetentionInterval < 0 {
		return nil, fmt.Errorf("%w: Retention and RetentionInterval must not be negative, got %s and %s",
			outbox.ErrInvalidConfig, cfg.Retention, cfg.RetentionInterval)
	}
	in := &Inbox{db: db, cfg: cfg, table: cfg.Table, rejected: cfg.Table + "_rejected"}
	in.log = cfg.Logger
	if in.log == nil {
		in.log = slog.New(warnHandler{})
	}
	in.log = in.log.With(slog.String("group", cfg.Group))
	var err error
	if in.m, err = newMetrics(cfg.MeterProvider); err != nil {
		return nil, fmt.Errorf("%w: inbox: make the instruments of MeterProvider: %w", outbox.ErrInvalidConfig, err)
	}
	if cfg.TracerProvider != nil {
		in.tracer = cfg.TracerProvider.Tracer("github.com/go-outbox/outbox/inbox")
	}
	in.q = newQueries(in.table, in.rejected, cfg.Group)
	return in, nil
}

// Group is the inbox's consumer group.
func (in *Inbox) Group() string { return in.cfg.Group }

// CreateSchema creates the inbox and rejected tables (schema.sql) if they are missing. A
// table that exists but lacks a column the inbox needs is reported with the ALTER TABLE
// that adds it.
func (in *Inbox) CreateSchema(ctx context.Context) error {
	for _, stmt := range strings.Split(in.q.schema, ";\n") {
		if !strings.Contains(stmt, "CREATE TABLE") {
			continue // the comments after the last statement
		}
		if _, err := in.db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("inbox: could not create the tables: %w", err)
		}
	}
	return in.checkSchema(ctx)
}

// columns are the columns each table must have, with the ALTER that adds the ones a table
// made by hand may lack.
var columns = map[string][]string{
	"inbox":    {"consumer_group", "event_id", "consumed_at"},
	"rejected": {"consumer_group", "msg_key", "event_id", "msg_id", "topic", "reason_class", "reason", "properties", "body", "deliveries", "first_rejected", "last_rejected"},
}

// checkSchema reports a table without a column the inbox writes.
func (in *Inbox) checkSchema(ctx context.Context) error {
	for kind, table := range map[string]string{"inbox": in.table, "rejected": in.rejected} {
		rows, err := in.db.QueryContext(ctx, `SELECT COLUMN_NAME FROM information_schema.COLUMNS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`, table)
		if err != nil {
			return fmt.Errorf("inbox: check table %s: %w", table, err)
		}
		have := map[string]bool{}
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				rows.Close()
				return fmt.Errorf("inbox: check table %s: %w", table, err)
			}
			have[strings.ToLower(c)] = true
		}
		rows.Close()
		if len(have) == 0 {
			return fmt.Errorf("%w: inbox table %s does not exist: create it with Inbox.CreateSchema or inbox/schema.sql", outbox.ErrInvalidConfig, table)
		}
		var missing []string
		for _, c := range columns[kind] {
			if !have[c] {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("%w: inbox table %s has no %s column: add it as inbox/schema.sql defines it",
				outbox.ErrInvalidConfig, table, strings.Join(missing, ", "))
		}
	}
	return nil
}

// Handle runs h for msg at most once per event id in the inbox's group, and reports what
// became of the delivery. It begins a transaction, records msg.EventID in the inbox table
// in it (the one statement the inbox adds; its primary key is the duplicate check), runs
// h in it, and commits. A duplicate is reported without running h; a message without a
// valid event id, one h refuses with an [outbox.Permanent] error, and one whose delivery
// fails for the [Config.MaxDeliveries]th time are recorded as rejected. Those three
// outcomes return a nil error: the delivery is to be acknowledged. A non-nil error
// (Outcome Failed) means nothing was committed and the message is to be delivered again;
// it is also returned when the commit's outcome is unknown (the connection lost during
// COMMIT): the next delivery then finds the event recorded, or handles it.
func (in *Inbox) Handle(ctx context.Context, msg *Message, h Handler) (Outcome, error) {
	if h == nil {
		return Failed, fmt.Errorf("%w: the handler is nil", outbox.ErrInvalidConfig)
	}
	if msg == nil {
		return Failed, fmt.Errorf("%w: the message is nil", outbox.ErrInvalidInput)
	}
	ctx, end := in.startSpan(ctx, msg)
	start := time.Now()
	o, err := in.handle(ctx, msg, h)
	in.m.delivered(ctx, msg, o, start)
	end(o, err)
	return o, err
}

func (in *Inbox) handle(ctx context.Context, msg *Message, h Handler) (Outcome, error) {
	switch {
	case msg.EventID == "":
		return in.reject(ctx, msg, reasonNoEventID, "no eventId property: the message cannot be deduplicated")
	case !validEventID(msg.EventID):
		return in.reject(ctx, msg, reasonInvalidEventID, fmt.Sprintf("eventId %.64q is not a UUID", msg.EventID))
	}
	tx, err := in.db.BeginTx(ctx, in.cfg.TxOptions)
	if err != nil {
		return in.failed(ctx, msg, fmt.Errorf("inbox: begin: %w", err))
	}
	defer func() { _ = tx.Rollback() }() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, in.q.record(msg.EventID)); err != nil {
		// The connection goes back to the pool before anything else is written: a
		// rejection takes a connection of its own, which a full pool would never give.
		_ = tx.Rollback()
		if isDuplicate(err) {
			in.log.InfoContext(ctx, "inbox: duplicate delivery suppressed",
				slog.String("event_id", msg.EventID), slog.String("msg_id", msg.MsgID))
			return Duplicate, nil
		}
		return in.failed(ctx, msg, fmt.Errorf("inbox: record event %s: %w", msg.EventID, schemaError(in.table, err)))
	}
	if err := callHandler(ctx, h, tx, msg); err != nil {
		_ = tx.Rollback()
		if outbox.IsPermanent(err) {
			return in.reject(ctx, msg, reasonPermanent, err.Error())
		}
		return in.failed(ctx, msg, err)
	}
	if err := tx.Commit(); err != nil {
		return in.failed(ctx, msg, fmt.Errorf("inbox: commit: %w", err))
	}
	return Handled, nil
}

// callHandler runs h, a panic turned into an error.
func callHandler(ctx context.Context, h Handler, tx *sql.Tx, msg *Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = fmt.Errorf("inbox: handler panicked: %w\n%s", e, debug.Stack())
			} else {
				err = fmt.Errorf("inbox: handler panicked: %v\n%s", r, debug.Stack())
			}
		}
	}()
	return h(ctx, tx, msg)
}

// failed answers a delivery that failed: to be delivered again, unless it was the last one
// allowed, when it is rejected instead.
func (in *Inbox) failed(ctx context.Context, msg *Message, cause error) (Outcome, error) {
	if in.cfg.MaxDeliveries != outbox.RetryForever && msg.Deliveries >= in.cfg.MaxDeliveries && ctx.Err() == nil && !isFault(cause) {
		o, err := in.reject(ctx, msg, reasonDeliveries,
			fmt.Sprintf("delivery %d of %d failed: %v", msg.Deliveries, in.cfg.MaxDeliveries, cause))
		if err != nil {
			return o, fmt.Errorf("%w; recording it as rejected failed too: %w", cause, err)
		}
		return o, nil
	}
	in.log.WarnContext(ctx, "inbox: delivery failed; the message will be delivered again",
		slog.String("event_id", msg.EventID), slog.String("msg_id", msg.MsgID),
		slog.Int("deliveries", msg.Deliveries), slog.Any("error", cause))
	return Failed, cause
}

// reject records msg as one that can never be processed. If the record cannot be written,
// the delivery failed: the message comes again.
func (in *Inbox) reject(ctx context.Context, msg *Message, class, reason string) (Outcome, error) {
	key := msg.EventID
	if !validEventID(key) {
		key = "msgId:" + msg.MsgID
	}
	eventID := ""
	if validEventID(msg.EventID) {
		eventID = msg.EventID
	}
	_, err := in.db.ExecContext(ctx, in.q.reject, key, eventID, truncate(msg.MsgID, 128), truncate(msg.Topic, 255),
		class, truncate(reason, 1024), encodeProperties(msg.Properties), nonNil(msg.Body), msg.Deliveries)
	if err != nil {
		in.log.ErrorContext(ctx, "inbox: could not record a rejected message; it will be delivered again",
			slog.String("event_id", msg.EventID), slog.String("msg_id", msg.MsgID), slog.Any("error", err))
		return Failed, fmt.Errorf("inbox: record rejected message %s: %w", key, schemaError(in.rejected, err))
	}
	in.m.rejectedOne(ctx, class)
	in.log.ErrorContext(ctx, "inbox: message rejected; it needs a person",
		slog.String("event_id", msg.EventID), slog.String("msg_id", msg.MsgID), slog.String("reason", class),
		slog.String("error", reason))
	return Rejected, nil
}

// validEventID reports a UUID in its canonical text form, as the outbox writes event ids.
func validEventID(s string) bool {
	if len(s) != 36 {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}

// eventTime is when the event was written: the time in its UUIDv7 id (the inserting
// process's clock), or zero for another kind of id.
func eventTime(eventID string) time.Time {
	u, err := uuid.Parse(eventID)
	if err != nil || u.Version() != 7 {
		return time.Time{}
	}
	sec, nsec := u.Time().UnixTime()
	return time.Unix(sec, nsec)
}

// schemaError is err, from a statement of the inbox's on table, with the fix added when it
// says that the table is missing (1146) or lacks a column (1054): such an error wraps
// [outbox.ErrInvalidConfig].
func schemaError(table string, err error) error {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return err
	}
	switch me.Number {
	case mysqldialect.ErrNoSuchTable:
		return fmt.Errorf("%w: table %s does not exist: create it with Inbox.CreateSchema or inbox/schema.sql: %w",
			outbox.ErrInvalidConfig, table, err)
	case mysqldialect.ErrBadField:
		return fmt.Errorf("%w: table %s lacks a column the inbox writes (Inbox.CreateSchema names it, inbox/schema.sql defines it): %w",
			outbox.ErrInvalidConfig, table, err)
	}
	return err
}

// isFault reports a failure that is the infrastructure's, not the message's: the database
// unreachable or its connection lost, a deadlock or a lock wait timeout, a context that
// ended, or an error the handler marked [outbox.Unavailable]. Such a failure never counts
// towards MaxDeliveries: a fault alone never rejects a message.
func isFault(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case mysqldialect.ErrLockWaitTimeout, mysqldialect.ErrLockDeadlock,
			mysqldialect.ErrConCount, mysqldialect.ErrServerShutdown, mysqldialect.ErrAbortingConnection,
			mysqldialect.ErrNetReadError, mysqldialect.ErrNetReadInterrupted, mysqldialect.ErrNetErrorOnWrite,
			mysqldialect.ErrNetWriteInterrupted, mysqldialect.ErrConnectionKilled,
			mysqldialect.ErrOptionPrevents, mysqldialect.ErrReadOnlyMode: // read-only: a failover in progress
			return true
		}
		return false
	}
	var ne net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.As(err, &ne) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sql.ErrConnDone) ||
		outbox.IsUnavailable(err)
}

func isDuplicate(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == mysqldialect.ErrDupEntry
}

func truncate(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-3]) + "..."
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// warnHandler is the inbox's logger when Config.Logger is nil: slog.Default()'s handler as
// it is when a line is logged, for warnings and above.
type warnHandler struct{ attrs []slog.Attr }

func (h warnHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn && slog.Default().Handler().Enabled(ctx, l)
}

func (h warnHandler) Handle(ctx context.Context, r slog.Record) error {
	return slog.Default().Handler().WithAttrs(h.attrs).Handle(ctx, r)
}

func (h warnHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return warnHandler{attrs: append(append([]slog.Attr(nil), h.attrs...), attrs...)}
}

func (h warnHandler) WithGroup(string) slog.Handler { return h }
