package relay

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
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
	maxIdleConns              = 4
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
	// must differ from the server's own @@server_id, from every replica's, and from the ids
	// of the relays of other tables (the relays of one table may share one: only the leader
	// streams); Start refuses one that clashes (a replica's only when the account may list
	// the replicas). Defaults to a number derived from InstanceID in [2^30, 2^31).
	ServerID uint32

	// Ordering must be the outbox store's ([outbox.MySQLConfig].Ordering). In key order
	// the relay sends a biz no's events in commit order, never two at once, and a dead
	// letter blocks its key under [outbox.KeyOrder] until a person requeues or skips it.
	Ordering outbox.Ordering

	// Routes must be the outbox store's ([outbox.MySQLConfig].Routes): the relay sends each
	// event to the topic its row names, and an event whose row names none (a plain SQL
	// INSERT's) to the topic these routes give it, which it then writes on the row; an event
	// naming a topic outside them is dead-lettered. Defaults to every event to
	// "ORDER_EVENT_TOPIC".
	Routes outbox.Routes

	// MaxAttempts, Backoff, MaxBackoff and OnDeadLetter mean what they mean for a publisher
	// (see [outbox.Config] and [outbox.Tuning]), and the relay follows the publisher's rule
	// ([outbox.RetryPolicy]); retries are written to the row by the database clock. A send
	// that fails because the broker is unavailable is retried without counting.
	MaxAttempts int
	Backoff     func(n int) time.Duration
	MaxBackoff  time.Duration
	//
	// OnDeadLetter is called once for each event the relay dead-letters, after its row is
	// FAIL, with the row's failure history in [outbox.Event.Failures] (the relay's failures:
	// "retryable" and "permanent", this one last; an unavailable broker writes no row and
	// no entry), on a goroutine of the relay's: its calls never overlap, and come in the order the
	// dead letters were recorded; the relay does not wait for them to go on sending. Its ctx
	// carries no cancellation of the relay's. Stop and Close wait for the calls of the dead
	// letters recorded before they return, except when called from inside OnDeadLetter. A
	// panic in it is logged at error, and the next call runs.
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

	// StopTimeout bounds Close's wait for the relay to stop (see [Relay.Stop]): the send in
	// flight, the last marks, the checkpoint, the hand-back and the OnDeadLetter calls.
	// Defaults to SendTimeout plus 10 s.
	StopTimeout time.Duration

	// Logger receives the relay's logs. Defaults to slog.Default().
	Logger *slog.Logger

	// MeterProvider, if set, receives the relay's metrics: outbox.events.sent, .retried and
	// .dead_lettered, as a publisher counts them, and the relay's own outbox.relay.* (see
	// docs/relay.md). None records nothing; the global provider is never used.
	MeterProvider metric.MeterProvider
}

func (c Config) withDefaults() (Config, error) {
	c.Table = cmp.Or(c.Table, defaultTable)
	c.CheckpointTable = cmp.Or(c.CheckpointTable, DefaultCheckpointTable)
	for _, t := range []struct{ field, name string }{{"Table", c.Table}, {"CheckpointTable", c.CheckpointTable}} {
		if err := mysqldialect.CheckTable(t.name); err != nil {
			return c, fmt.Errorf("%w: relay: %s: %w", outbox.ErrInvalidConfig, t.field, err)
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
	if c.MaxBackoff < 0 {
		return c, fmt.Errorf("%w: relay: MaxBackoff %s is negative", outbox.ErrInvalidConfig, c.MaxBackoff)
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
	if c.StopTimeout < 0 {
		return c, fmt.Errorf("%w: relay: StopTimeout %v is negative", outbox.ErrInvalidConfig, c.StopTimeout)
	}
	c.StopTimeout = cmp.Or(c.StopTimeout, c.SendTimeout+10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Relay publishes an outbox table by reading the binary log. Start it in every instance of
// the service: one is elected leader (GET_LOCK on a connection of its own), the others stand
// by and take over when it dies. Its lifecycle is the publisher's: [Relay.Start] checks and
// runs in the background, [Relay.Run] is Start and a wait, [Relay.Stop] stops it (it may be
// started again), [Relay.Close] stops it for good. See docs/relay.md.
type Relay struct {
	cfg    Config
	sender outbox.Sender
	db     *sql.DB
	conn   *mysql.Config
	q      queries
	// routeArgs are the values of the writes' topic expression (mysqldialect.RouteTopic);
	// info is the store the relay publishes, for outbox.Dispatch.
	routeArgs []any
	info      outbox.StoreInfo
	m         *metrics

	dead *deadLetters // runs OnDeadLetter; nil without it

	mu        sync.Mutex
	closed    bool
	run       *run // the current run; nil before the first and after Stop
	closeOnce sync.Once
	health    Health
	counters  counters
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
	// marked, as last recorded: at a term's start, the position it resumes from ("" until
	// its first checkpoint when it reads on from the server's current position).
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
// CLIENT (BINLOG MONITOR on MariaDB). New opens no connection; Start checks the server.
func New(dsn string, sender outbox.Sender, cfg Config) (*Relay, error) {
	if sender == nil {
		return nil, fmt.Errorf("%w: relay: the sender is nil", outbox.ErrInvalidConfig)
	}
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: relay: the DSN: %w", outbox.ErrInvalidConfig, err)
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
		return nil, fmt.Errorf("%w: relay: the DSN: %w", outbox.ErrInvalidConfig, err)
	}
	db := sql.OpenDB(connector)
	// The store's own check of the routes (it opens no connection).
	if _, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: cfg.Table, Ordering: cfg.Ordering, Routes: cfg.Routes}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("relay: %w", err)
	}
	db.SetMaxOpenConns(6)
	db.SetMaxIdleConns(maxIdleConns)
	routeTopic, routeArgs := mysqldialect.RouteTopic(cfg.Routes.ByType, cfg.Routes.TopicOf(outbox.Event{}))
	r := &Relay{cfg: cfg, sender: sender, db: db, conn: c, q: newQueries(cfg.Table, cfg.CheckpointTable, routeTopic), routeArgs: routeArgs,
		info: outbox.StoreInfo{Ordering: cfg.Ordering, Topics: append([]string{cfg.Routes.TopicOf(outbox.Event{})}, cfg.Routes.Topics...)}}
	r.health.InstanceID = cfg.InstanceID
	if cfg.OnDeadLetter != nil {
		r.dead = &deadLetters{fn: cfg.OnDeadLetter, log: cfg.Logger}
	}
	if r.m, err = newMetrics(cfg.MeterProvider, r); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("relay: metrics: %w", err)
	}
	return r, nil
}

// Start checks, at once, everything that can be known before the relay runs: the server's
// settings, the account's grants on the binlog and on both tables, the tables, the store's
// ordering, and the ServerID (see docs/relay.md). It returns an error wrapping
// [outbox.ErrInvalidConfig] that names the fix when the server, the account or the tables
// cannot serve the relay; [outbox.ErrClosed] after Close; [outbox.ErrAlreadyRunning] while
// the relay runs (until Stop has returned). Otherwise it relays in the background until ctx
// is done or Stop or Close is called, and returns nil. A server that cannot be reached is
// logged and checked again every second in the background; other failures while it runs
// (the database or the broker down, leadership lost) it logs, and goes on: as a standby, it
// tries to lead again every second. It logs at WARN, and goes on, when the server's
// settings make the binlog less durable than its tables (sync_binlog, and
// innodb_flush_log_at_trx_commit), and when the account may not list the replicas.
func (r *Relay) Start(ctx context.Context) error {
	_, err := r.start(ctx)
	return err
}

// Run is Start, then waits until the run ends. It returns Start's refusal; nil once the
// relay is stopped (by ctx, Stop or Close); or the error that ended the run, which wraps
// [outbox.ErrInvalidConfig]: the relay found, while running, that it cannot serve the table
// (a server checked only once it could be reached, the ServerID taken by another relay's
// binlog stream, the binlog without column names).
func (r *Relay) Run(ctx context.Context) error {
	ru, err := r.start(ctx)
	if err != nil {
		return err
	}
	<-ru.done
	return ru.err
}

// A run is one Start's stretch of relaying, until it stops.
type run struct {
	cancel context.CancelFunc
	done   chan struct{} // closed once the run ended
	err    error         // why it ended: nil when stopped; set before done closes
}

func (ru *run) ended() bool {
	select {
	case <-ru.done:
		return true
	default:
		return false
	}
}

func (r *Relay) start(parent context.Context) (*run, error) {
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return nil, outbox.ErrClosed
	case r.run != nil && !r.run.ended():
		r.mu.Unlock()
		return nil, fmt.Errorf("relay %s: %w", r.cfg.InstanceID, outbox.ErrAlreadyRunning)
	}
	ctx, cancel := context.WithCancel(parent)
	ru := &run{cancel: cancel, done: make(chan struct{})}
	r.run = ru
	r.mu.Unlock()

	info, err := r.preflight(ctx)
	switch {
	case ctx.Err() != nil:
		// Stopped (by ctx, Stop or Close) before it could start: nothing to refuse.
		r.end(ru, nil)
		return ru, nil
	case errors.Is(err, outbox.ErrInvalidConfig):
		r.setError(err)
		r.end(ru, nil)
		// A session keeps the global privileges it had when it connected: the next Start
		// connects anew, to find a grant given since.
		r.db.SetMaxIdleConns(0)
		r.db.SetMaxIdleConns(maxIdleConns)
		return nil, err
	case err != nil:
		// The server cannot be reached: the run waits for it rather than fail a service's start.
		r.setError(err)
		r.cfg.Logger.WarnContext(ctx, "relay: cannot check the server yet; checking again every second", slog.Any("error", err))
	}
	go func() {
		err := r.loop(ctx, info, err != nil)
		if err != nil {
			r.setError(err)
			r.cfg.Logger.ErrorContext(ctx, "relay: stopped: it cannot serve the table", slog.Any("error", err))
		}
		r.end(ru, err)
	}()
	return ru, nil
}

// end records why a run ended and marks it ended.
func (r *Relay) end(ru *run, err error) {
	ru.cancel()
	ru.err = err
	close(ru.done)
}

// loop relays until ctx ends or the relay finds it cannot serve the table (the error
// returned, wrapping ErrInvalidConfig). unchecked says the server is still to be checked.
func (r *Relay) loop(ctx context.Context, info serverInfo, unchecked bool) error {
	if unchecked {
		var err error
		if info, err = r.check(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
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

// check checks the server and the tables until it can, for a run whose Start could not
// reach the server.
func (r *Relay) check(ctx context.Context) (serverInfo, error) {
	for {
		select {
		case <-ctx.Done():
			return serverInfo{}, ctx.Err()
		case <-time.After(defaultStandbyRetry):
		}
		info, err := r.preflight(ctx)
		if err == nil || errors.Is(err, outbox.ErrInvalidConfig) || ctx.Err() != nil {
			return info, err
		}
		r.setError(err)
		r.cfg.Logger.WarnContext(ctx, "relay: cannot check the server yet", slog.Any("error", err))
	}
}

// Stop stops the run and waits, bounded by ctx, until it has ended: the sends in flight
// answered, what was sent marked, the checkpoint recorded and the table handed back to the
// polling publishers (unless a standby takes it first); and until the OnDeadLetter calls of
// the dead letters recorded have returned. If ctx ends first it returns an error wrapping
// ctx.Err() that says what is left: the shutdown goes on in the background, and a later
// Stop waits for it again. It returns nil when the relay does not run, may be called more
// than once and concurrently, and, called from inside OnDeadLetter, does not wait for the
// calls of OnDeadLetter. Once it returned nil, Start may be called again.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	ru := r.run
	r.mu.Unlock()
	if ru != nil {
		ru.cancel()
		select {
		case <-ru.done:
		case <-ctx.Done():
			if r.Health().Leader {
				return fmt.Errorf("relay: stop: %w: the leader is still shutting down in the background "+
					"(events it does not mark are sent again); Stop again waits for it",
					ctx.Err())
			}
			return fmt.Errorf("relay: stop: %w: the relay, not leading, is still stopping in the background (a check of "+
				"the server or a try to lead in progress); Stop again waits for it", ctx.Err())
		}
		r.mu.Lock()
		if r.run == ru {
			r.run = nil
		}
		r.mu.Unlock()
	}
	return r.dead.wait(ctx)
}

// Close stops the relay as Stop does, bounded by Config.StopTimeout, and closes its
// connections (not the sender, which the service may share with publishers). A leader that
// closes hands the table to the polling publishers at once, unless a standby takes it
// first. Close may be called more than once, also from inside OnDeadLetter (it does not
// wait for the calls of OnDeadLetter then); Start and Run return [outbox.ErrClosed] after it.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.StopTimeout)
	err := r.Stop(ctx)
	cancel()
	r.closeOnce.Do(func() {
		r.m.close()
		if cerr := r.db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("relay: close the connections: %w", cerr))
		}
	})
	return err
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

// setTerm records the start of a term of leadership: its epoch and the position it resumes
// from ("" until its first checkpoint when it reads on from the server's current one).
func (r *Relay) setTerm(epoch int64, resume string) {
	r.mu.Lock()
	r.health.Leader, r.health.Epoch, r.health.Position = true, epoch, resume
	r.mu.Unlock()
}

func (r *Relay) setPosition(pos string) {
	r.mu.Lock()
	r.health.Position = pos
	r.mu.Unlock()
}
