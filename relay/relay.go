package relay

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
)

// Defaults of [Config].
const (
	DefaultCheckpointTable    = "t_outbox_relay"
	defaultTable              = "t_event_record"
	defaultBatchSize          = 256
	defaultCheckpointInterval = time.Second
	defaultFallbackAfter      = 30 * time.Second
	defaultSendTimeout        = 10 * time.Second
	defaultMaxAttempts        = 4 // the publisher's
	defaultStandbyRetry       = time.Second
)

// Config configures a [Relay]. Only ServerID has no default worth keeping in production:
// set it to an id no server or replica of the replication topology uses.
type Config struct {
	// Table is the outbox table the relay publishes. Defaults to "t_event_record".
	Table string

	// CheckpointTable holds one row per relayed outbox table: the leader's fencing epoch,
	// its binlog position (GTID) and its heartbeat; polling publishers whose
	// [outbox.MySQLConfig].RelayTable names it stand by while a relay leads. Defaults to
	// "t_outbox_relay". [CreateSchema] creates it.
	CheckpointTable string

	// InstanceID names this relay in the checkpoint row, in claim_owner of the rows it
	// sends and in its logs: unique among the relays and publishers of the table. At most 64
	// characters. Defaults to [outbox.DefaultInstanceID]().
	InstanceID string

	// ServerID is the replica server id the relay's binlog connection registers with. It
	// must differ from the server's own @@server_id and from every replica's; Run refuses
	// one that clashes. Defaults to a number derived from InstanceID in [2^30, 2^31).
	ServerID uint32

	// Ordering must be the outbox store's ([outbox.MySQLConfig].Ordering). In key order
	// the relay sends a biz no's events in commit order, never two at once, and a dead
	// letter blocks its key under [outbox.KeyOrder] until a person requeues or skips it.
	Ordering outbox.Ordering

	// MaxAttempts, Backoff and OnDeadLetter mean what they mean for a publisher (see
	// [outbox.Config]); retries are written to the row by the database clock. A send that
	// fails because the broker is unavailable is retried without counting.
	MaxAttempts  int
	Backoff      outbox.Backoff
	OnDeadLetter func(ctx context.Context, ev outbox.Event, cause error)

	// BatchSize is the most events one Send carries. Defaults to 256.
	BatchSize int

	// CheckpointInterval is how often the leader records its position and heartbeat (at a
	// commit boundary whose events are all sent and marked). After a failover, the new
	// leader resends what the old one sent since its last checkpoint: at most this much of
	// traffic. Defaults to 1 s; at least 100 ms.
	CheckpointInterval time.Duration

	// FallbackAfter is how old the leader's heartbeat must be before polling publishers
	// take the table over (a relay that died with no standby). Defaults to 30 s; at least
	// three CheckpointIntervals.
	FallbackAfter time.Duration

	// SendTimeout bounds each Send when the sender does not bound its sends itself
	// ([outbox.SenderInfo].SendTimeout). Defaults to 10 s.
	SendTimeout time.Duration

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// MeterProvider, if set, receives the relay's metrics: outbox.events.sent, .retried and
	// .dead_lettered, as a publisher counts them, and the relay's own outbox.relay.* (see
	// docs/relay.md). None records nothing; the global provider is never used.
	MeterProvider metric.MeterProvider
}

var tableName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

func (c Config) withDefaults() (Config, error) {
	c.Table = cmp.Or(c.Table, defaultTable)
	c.CheckpointTable = cmp.Or(c.CheckpointTable, DefaultCheckpointTable)
	for _, t := range []struct{ field, name string }{{"Table", c.Table}, {"CheckpointTable", c.CheckpointTable}} {
		if !tableName.MatchString(t.name) {
			return c, fmt.Errorf("%w: relay: %s %q: use letters, digits and underscores, at most 64", outbox.ErrInvalidConfig, t.field, t.name)
		}
	}
	if c.Table == c.CheckpointTable {
		return c, fmt.Errorf("%w: relay: CheckpointTable must not be the outbox table %q", outbox.ErrInvalidConfig, c.Table)
	}
	c.InstanceID = cmp.Or(c.InstanceID, outbox.DefaultInstanceID())
	if len(c.InstanceID) > 64 {
		return c, fmt.Errorf("%w: relay: InstanceID is %d characters, at most 64", outbox.ErrInvalidConfig, len(c.InstanceID))
	}
	if c.ServerID == 0 {
		h := fnv.New32a()
		h.Write([]byte(c.InstanceID))
		c.ServerID = 1<<30 | h.Sum32()&(1<<30-1)
	}
	if c.Ordering < outbox.Unordered || c.Ordering > outbox.KeyOrderSkipDeadLetters {
		return c, fmt.Errorf("%w: relay: unknown Ordering %d", outbox.ErrInvalidConfig, c.Ordering)
	}
	if c.MaxAttempts < 0 {
		return c, fmt.Errorf("%w: relay: MaxAttempts %d is negative", outbox.ErrInvalidConfig, c.MaxAttempts)
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, defaultMaxAttempts)
	if c.Backoff == nil {
		c.Backoff = outbox.DefaultBackoff
	}
	if c.BatchSize < 0 {
		return c, fmt.Errorf("%w: relay: BatchSize %d is negative", outbox.ErrInvalidConfig, c.BatchSize)
	}
	c.BatchSize = cmp.Or(c.BatchSize, defaultBatchSize)
	c.CheckpointInterval = cmp.Or(c.CheckpointInterval, defaultCheckpointInterval)
	if c.CheckpointInterval < 100*time.Millisecond {
		return c, fmt.Errorf("%w: relay: CheckpointInterval %v is under 100ms", outbox.ErrInvalidConfig, c.CheckpointInterval)
	}
	c.FallbackAfter = cmp.Or(c.FallbackAfter, defaultFallbackAfter)
	if c.FallbackAfter < 3*c.CheckpointInterval {
		return c, fmt.Errorf("%w: relay: FallbackAfter %v is under three CheckpointIntervals (%v)", outbox.ErrInvalidConfig, c.FallbackAfter, 3*c.CheckpointInterval)
	}
	if c.SendTimeout < 0 {
		return c, fmt.Errorf("%w: relay: SendTimeout %v is negative", outbox.ErrInvalidConfig, c.SendTimeout)
	}
	c.SendTimeout = cmp.Or(c.SendTimeout, defaultSendTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Relay publishes an outbox table by reading the binary log. Run it in every instance of
// the service: one is elected leader (GET_LOCK on a connection of its own), the others stand
// by and take over when it dies. See docs/relay.md.
type Relay struct {
	cfg    Config
	sender outbox.Sender
	db     *sql.DB
	conn   *mysql.Config
	q      queries
	m      *metrics

	mu       sync.Mutex
	running  bool
	closed   bool
	cancel   context.CancelFunc
	done     chan struct{}
	health   Health
	counters counters
}

// Health is a snapshot of a relay's state.
type Health struct {
	// InstanceID is the relay's.
	InstanceID string
	// Leader reports whether this relay leads its table now.
	Leader bool
	// Epoch is the fencing epoch of its leadership (0 when it never led).
	Epoch int64
	// Position is the binlog position (a GTID set) up to which everything is sent and
	// marked, as last recorded.
	Position string
	// LastError is the last error that ended a term of leadership or a standby's attempt.
	LastError string
}

// Stats counts what a relay did since it was made.
type Stats struct {
	// Sent counts events the broker accepted. Resent counts the duplicates among them (same
	// eventId) the relay knows of: events it sent and could not mark SUCCESS before its term
	// ended (lost leadership, a handover, marks that kept failing: whoever publishes the
	// table next sends them again, this relay included), and events it found SUCCESS,
	// sent by another publisher, when it marked them. A relay killed outright counts
	// nothing of what it leaves.
	Sent, Resent int64
	// Swept counts events sent from the table rather than the binlog: at a term's start,
	// after a position was lost, or when a key was unblocked.
	Swept int64
	// Retried and DeadLettered count failed sends written as a retry or a dead letter.
	Retried, DeadLettered int64
	// Terms counts terms of leadership; Handovers the times the binlog could not be
	// followed (position purged, DDL, a statement-format change) and the table was swept.
	Terms, Handovers int64
}

type counters struct {
	sent, resent, swept, retried, deadLettered, terms, handovers atomic.Int64
}

// New makes a relay for the outbox table of the database that dsn (a go-sql-driver/mysql
// DSN, with the database name) opens; its binlog connection uses the DSN's address, user,
// password and TLS settings. The account needs SELECT and UPDATE on the outbox table,
// SELECT, INSERT and UPDATE on the checkpoint table, and REPLICATION SLAVE and REPLICATION
// CLIENT (BINLOG MONITOR on MariaDB). New opens no connection; Run checks the server.
func New(dsn string, sender outbox.Sender, cfg Config) (*Relay, error) {
	if sender == nil {
		return nil, fmt.Errorf("%w: relay: the sender is nil", outbox.ErrInvalidConfig)
	}
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: relay: the DSN: %v", outbox.ErrInvalidConfig, err)
	}
	if c.DBName == "" {
		return nil, fmt.Errorf("%w: relay: the DSN names no database", outbox.ErrInvalidConfig)
	}
	if c.Net != "tcp" {
		return nil, fmt.Errorf("%w: relay: the DSN's network is %q: the binlog connection needs tcp(host:port)", outbox.ErrInvalidConfig, c.Net)
	}
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c.ParseTime = true
	c.Loc = time.UTC
	// The relay's statements carry ids and times only: interpolated by the driver, each is
	// one round trip, where a prepared one would be three.
	c.InterpolateParams = true
	connector, err := mysql.NewConnector(c)
	if err != nil {
		return nil, fmt.Errorf("%w: relay: the DSN: %v", outbox.ErrInvalidConfig, err)
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(6)
	db.SetMaxIdleConns(4)
	r := &Relay{cfg: cfg, sender: sender, db: db, conn: c, q: newQueries(cfg.Table, cfg.CheckpointTable)}
	r.health.InstanceID = cfg.InstanceID
	if r.m, err = newMetrics(cfg.MeterProvider, r); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("relay: metrics: %w", err)
	}
	return r, nil
}

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("relay: closed")

// Run relays until ctx is done or Close is called, and returns nil then. It returns an
// error wrapping [outbox.ErrInvalidConfig] at once when the server or the account cannot
// serve a relay (the error names the fix); other failures (the database or the broker down,
// leadership lost) it logs, and goes on: as a standby, it tries to lead again every second.
func (r *Relay) Run(ctx context.Context) error {
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return ErrClosed
	case r.running:
		r.mu.Unlock()
		return errors.New("relay: Run is already running")
	}
	ctx, cancel := context.WithCancel(ctx)
	r.running, r.cancel, r.done = true, cancel, make(chan struct{})
	r.mu.Unlock()
	defer func() {
		cancel()
		close(r.done)
	}()

	info, err := r.check(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	for ctx.Err() == nil {
		err := r.lead(ctx, info)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, outbox.ErrInvalidConfig) {
			return err
		}
		if err != nil && !errors.Is(err, errNotLeader) {
			r.setError(err)
			r.cfg.Logger.WarnContext(ctx, "relay: term ended", slog.Any("error", err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(defaultStandbyRetry):
		}
	}
	return nil
}

// check checks the server and the tables once, when Run starts.
func (r *Relay) check(ctx context.Context) (serverInfo, error) {
	for {
		info, err := checkServer(ctx, r.db, r.cfg.ServerID)
		if err == nil {
			err = r.checkTables(ctx)
		}
		if err == nil && info.replicasUnchecked != "" {
			r.cfg.Logger.WarnContext(ctx, "relay: "+info.replicasUnchecked, slog.Uint64("server_id", uint64(r.cfg.ServerID)))
		}
		if err == nil || errors.Is(err, outbox.ErrInvalidConfig) || ctx.Err() != nil {
			return info, err
		}
		// The server is down: wait for it rather than fail a service's start.
		r.setError(err)
		r.cfg.Logger.WarnContext(ctx, "relay: cannot check the server yet", slog.Any("error", err))
		select {
		case <-ctx.Done():
			return info, ctx.Err()
		case <-time.After(defaultStandbyRetry):
		}
	}
}

// Close stops Run, waits for it to return, and closes the relay's connections (not the
// sender, which the service may share with publishers). A leader that closes hands the
// table to the polling publishers at once, unless a standby takes it first.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	r.m.close()
	return r.db.Close()
}

// Health reports the relay's state.
func (r *Relay) Health() Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.health
}

// Stats reports what the relay did since New.
func (r *Relay) Stats() Stats {
	c := &r.counters
	return Stats{Sent: c.sent.Load(), Resent: c.resent.Load(), Swept: c.swept.Load(), Retried: c.retried.Load(),
		DeadLettered: c.deadLettered.Load(), Terms: c.terms.Load(), Handovers: c.handovers.Load()}
}

func (r *Relay) setError(err error) {
	r.mu.Lock()
	r.health.LastError = err.Error()
	r.mu.Unlock()
}

func (r *Relay) setLeader(epoch int64, leader bool) {
	r.mu.Lock()
	r.health.Leader, r.health.Epoch = leader, epoch
	r.mu.Unlock()
}

func (r *Relay) setPosition(pos string) {
	r.mu.Lock()
	r.health.Position = pos
	r.mu.Unlock()
}
