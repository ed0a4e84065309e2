package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox/internal/eventrules"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

const (
	// tableDefault is the outbox table's name unless [MySQLConfig.Table] says otherwise.
	tableDefault = "t_event_record"
	// maxPayloadBytesDefault is RocketMQ's default message size limit.
	maxPayloadBytesDefault = 4 << 20
	// maxPayloadColumn is what a MEDIUMBLOB holds.
	maxPayloadColumn = 1<<24 - 1
	maxKeyLen        = eventrules.MaxKeyLen // biz_no and event_type
	maxReasonLen     = 1024                 // last_error, in characters
	reclaimPage      = 500                  // rows per reclaim statement
	maxLockAttempts  = 5                    // tries of one statement that hits a lock wait timeout (each waited innodb_lock_wait_timeout)
	maxDeadlockTries = 12                   // tries of one statement that hits a deadlock (each fails at once)
)

// MySQLConfig configures a [MySQLStore].
type MySQLConfig struct {
	// Table is the outbox table's name: 1 to 64 ASCII letters, digits and underscores (it
	// may begin with a digit or be a reserved word: every statement quotes it).
	// Defaults to "t_event_record".
	Table string

	// Ordering, when not [Unordered], publishes the events of one biz no in id order (see
	// [KeyOrder] and docs/ordering.md): the one switch for per-key ordering. The store's
	// claims keep each key's events in order, every publisher of the store asks its sender
	// to (a [RocketMQSender] then sends a key's events to one queue), and [MySQLStore.CreateSchema]
	// creates the table with the index ordered claims need: idx_biz_no_status (biz_no,
	// status, id) in place of schema.sql's idx_biz_no (biz_no), so that every "is an
	// earlier event of this biz no still open?" question is one index dive. It costs every
	// write (about 29 % more redo per event), so unordered tables keep idx_biz_no. For a
	// table that exists without it, CreateSchema and [Publisher.Run] return an error that
	// names the ALTER TABLE to run. All publishers of a table must use stores of the same
	// Ordering. Defaults to Unordered.
	Ordering Ordering

	// MaxPayloadBytes is the largest payload InsertEvent accepts, at most 16 MiB - 1 (what the
	// payload column holds). Defaults to 4 MiB, RocketMQ's default message size limit.
	MaxPayloadBytes int

	// RelayTable names the checkpoint table of a binlog relay (module
	// github.com/go-outbox/outbox/relay, docs/relay.md) that publishes this table: while a
	// relay leads, the store's publishers claim nothing and stand by, and they take the
	// table over when the relay's heartbeat is older than its FallbackAfter. Set it on every
	// publisher of a relayed table (the relay's default is "t_outbox_relay"). Empty: no relay.
	RelayTable string

	// PartitionIDs, when positive, partitions the table by RANGE (id), PartitionIDs ids a
	// partition, so that retention drops whole partitions instead of deleting rows one by
	// one (docs/retention.md). [MySQLStore.CreateSchema] then creates the table with three
	// partitions of PartitionIDs ids and a catch-all one (VALUES LESS THAN MAXVALUE), and
	// with a plain index on event_id in place of the unique key uk_event_id, since MySQL and
	// MariaDB require every unique key to contain the partitioning column: the event ids
	// stay unique by construction (each is a UUIDv7 made by InsertEvent), no longer by the
	// table. CreateSchema and [Publisher.Run] refuse a table that is not partitioned so,
	// naming the ALTER TABLE that makes it (docs/upgrading.md). [MySQLStore.Purge] (the
	// publisher's retention, outboxctl purge) keeps two empty partitions above the highest
	// id and drops a partition once every row in it is SUCCESS or SKIPPED and older than
	// the retention. Choose it so that one partition holds an hour to a day of events (at
	// 1,000 events/s, 86,400,000 ids are a day), at least half a Tuning.RetentionInterval's
	// events, and at least 1,000. 0 (the default): the table is not partitioned and
	// retention deletes in batches.
	PartitionIDs int64

	// Routes says which topic each event goes to (see [Routes] and docs/routing.md): the
	// topic it names, else its event type's route, else the default topic. InsertEvent stores
	// the topic it resolves on the row, and refuses a topic outside the set. Defaults to
	// every event to "ORDER_EVENT_TOPIC".
	Routes Routes

	// The settings below are for servers and proxies that need them; most services leave
	// them unset (see docs/configuration.md).

	// ConcurrentClaims lets the batch claims of all instances scan the table at the same
	// time, relying on SKIP LOCKED alone. By default they take turns: each holds a named lock
	// (GET_LOCK, one per database and table) while its SELECT ... FOR UPDATE SKIP LOCKED
	// runs, and releases it before it updates the rows, sends and acknowledges. Concurrent
	// scans all start at the head of the index and walk past the rows the others have
	// locked, so the more instances there are, the more work each claim wastes; taking turns
	// keeps the throughput of many instances at that of a few (see docs/performance.md).
	//
	// The lock orders claims; it does not protect anything. A claim that waits more than a
	// second, or whose GET_LOCK fails or is refused, goes ahead without it (and the store's
	// claims skip the turns for the next ten seconds), and every claim stays correct with
	// or without it. Set ConcurrentClaims where GET_LOCK is unavailable, e.g. behind a
	// proxy that forbids it: such a claim would close its connection every ten seconds.
	// The per-row claims ([Tuning.ClaimPerRow]) never take the lock.
	ConcurrentClaims bool

	// PooledClaims makes every batch claim a transaction of its own on a pooled connection
	// (SET TRANSACTION ISOLATION LEVEL, BEGIN, its statements, COMMIT). By default the store
	// keeps one connection of the pool for its claims, set once to READ COMMITTED with
	// autocommit off, so that a claim costs its statements and a COMMIT; the connection is
	// closed (never returned to the pool, where its settings would reach the service's own
	// statements) after two seconds without a claim, after any error, and when a publisher
	// of the store stops. A pool whose MaxOpenConns is below 4 never lends it. Set
	// PooledClaims behind a proxy that must not pin a client to one server connection.
	PooledClaims bool

	// ScanFromStart makes every batch claim lock the due rows as it reads them from the
	// start of the WAIT range, as a claim in a backlog does. By default, while the claims
	// keep up, a claim reads the due rows' ids first with a plain read, then locks those
	// rows, and starts its read where the last claim's read left nothing due behind it; so
	// that it does not read through (and check for locks) the index entries of the rows
	// earlier claims took, which InnoDB keeps until its purge removes them (see
	// docs/design.md). A row that becomes due behind that point without this store hearing
	// of it (inserted by another program in a transaction longer than 10 ms, say) is found
	// by a claim that reads from the start, which comes at least every 250 ms while claims
	// run.
	ScanFromStart bool
}

// MySQLStore is the outbox table in MySQL 8 or MariaDB. Business code writes events with it
// inside its own transactions ([MySQLStore.BeginTx], [MySQLStore.WrapTx], [Tx.InsertEvent]);
// a [Publisher] claims and sends them through its [Store] methods, which business code
// never calls; operators look at and repair events through [NewAdmin]. One store may serve
// any number of goroutines, transactions and publishers of the process.
//
// The *sql.DB should be opened with parseTime=true and loc=UTC (the driver's default loc),
// though the store reads time columns either way.
type MySQLStore struct {
	db               *sql.DB
	table            string
	maxPayload       int
	concurrentClaims bool
	claimTurnWait    time.Duration
	q                mysqlQueries
	oq               orderQueries
	ordering         Ordering

	// Claims go without turns until turnsPausedUntil, a time since born (monotonic).
	born             time.Time
	turnsPausedUntil atomic.Int64

	// suspectsAhead: the last claim met a reclaimed row, so the next locks only a few rows.
	suspectsAhead atomic.Bool
	// backlog: the last claim took all it was allowed, so the next takes the claim turn.
	backlog atomic.Bool
	// sizing: in key order, what the last batch claim learnt of the keys' runs.
	sizing orderedSizing

	pooledClaims bool
	session      claimSession

	scanFromStart bool
	floor         scanFloor
	wakes         dueWakes // at delayed events' due times

	lockRetries atomic.Int64

	// purgeHook, if set (by tests), is called with true once an exclusive purge holds its
	// lock and with false just before it lets go.
	purgeHook func(holding bool)
	// partitionIDs is MySQLConfig.PartitionIDs; partitionHook, if set (by tests), is called
	// before each partition statement of a purge ("reorganize", "lock", "drop").
	partitionIDs  int64
	partitionHook func(step string)

	subsMu sync.Mutex
	subs   map[chan struct{}]struct{}

	relay *relayGate // nil without MySQLConfig.RelayTable

	// routes are MySQLConfig.Routes; routeArgs the values of the claims' topic expression
	// (mysqldialect.RouteTopic), their first arguments.
	routes    routing
	routeArgs []any
}

// mysqlQueries holds every statement with the configured table name in place.
type mysqlQueries struct {
	schema, insert, insertInline, candidates, claim, markSuccess, release, markFail, get, requeue string
	lockDue, lockDueSteady, claimAndAck, payloads, markSuccessBatch, takeClaimTurn, endClaimTurn  string
	expired, reclaim, reclaimFail, owned, releaseOwned, renewLease                                string
	requeueIDs, purgeCandidates, countPurgeable, purge, takePurgeLock, endPurgeLock               string
	purgeCandidatesIn, countPurgeableIn                                                           string
	// the failure history (schema.sql, failures): the release that records no failure (an
	// event never tried), and the history's read after a dead letter
	releaseQuiet, failuresOf string
	// routeTopic is the row's topic with the routes applied (mysqldialect.RouteTopic), for
	// the claims and the filters.
	routeTopic string
}

// NewMySQLStore returns a store for the outbox table in db. It does not create the table;
// see [MySQLStore.CreateSchema].
func NewMySQLStore(db *sql.DB, cfg MySQLConfig) (*MySQLStore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	}
	table := cmp.Or(cfg.Table, tableDefault)
	if err := mysqldialect.CheckTable(table); err != nil {
		return nil, fmt.Errorf("%w: MySQLConfig.Table: %w", ErrInvalidConfig, err)
	}
	maxPayload := cmp.Or(cfg.MaxPayloadBytes, maxPayloadBytesDefault)
	if maxPayload < 0 || maxPayload > maxPayloadColumn {
		return nil, fmt.Errorf("%w: MaxPayloadBytes must be between 1 and %d (the payload column's size), got %d",
			ErrInvalidConfig, maxPayloadColumn, cfg.MaxPayloadBytes)
	}
	if cfg.Ordering < Unordered || cfg.Ordering > KeyOrderSkipDeadLetters {
		return nil, fmt.Errorf("%w: unknown Ordering %d", ErrInvalidConfig, cfg.Ordering)
	}
	if cfg.RelayTable != "" {
		if err := mysqldialect.CheckTable(cfg.RelayTable); err != nil {
			return nil, fmt.Errorf("%w: MySQLConfig.RelayTable: %w", ErrInvalidConfig, err)
		}
		if cfg.RelayTable == table {
			return nil, fmt.Errorf("%w: MySQLConfig.RelayTable %q must not be the outbox table", ErrInvalidConfig, cfg.RelayTable)
		}
	}
	if cfg.PartitionIDs < 0 || cfg.PartitionIDs > 0 && cfg.PartitionIDs < minPartitionIDs || cfg.PartitionIDs > math.MaxInt64/(4*maxPartitions) {
		return nil, fmt.Errorf("%w: PartitionIDs must be 0 (no partitions) or between %d and %d ids a partition, got %d",
			ErrInvalidConfig, minPartitionIDs, int64(math.MaxInt64/(4*maxPartitions)), cfg.PartitionIDs)
	}
	routes, err := cfg.Routes.routing()
	if err != nil {
		return nil, err
	}
	routeTopic, routeArgs := mysqldialect.RouteTopic(routes.byType, routes.def)
	s := &MySQLStore{db: db, table: table, routes: routes, routeArgs: routeArgs, maxPayload: maxPayload, concurrentClaims: cfg.ConcurrentClaims,
		pooledClaims: cfg.PooledClaims, claimTurnWait: claimTurnWait, q: newMySQLQueries(table, routeTopic), oq: newOrderQueries(table, routeTopic),
		born: time.Now(), ordering: cfg.Ordering, scanFromStart: cfg.ScanFromStart}
	if s.ordering != Unordered {
		s.q.schema = orderedSchema(s.q.schema)
	}
	if cfg.PartitionIDs > 0 {
		s.partitionIDs = cfg.PartitionIDs
		s.q.schema = partitionedSchema(s.q.schema, cfg.PartitionIDs)
	}
	if cfg.RelayTable != "" {
		s.relay = newRelayGate(table, cfg.RelayTable, s.q, s.oq)
	}
	s.backlog.Store(true) // a publisher starting may find one
	return s, nil
}

// CreateSchema creates the outbox table and its indexes (schema.sql, with the index of
// [MySQLConfig.Ordering], and partitioned when [MySQLConfig.PartitionIDs] says so) if the
// table is missing. A table that exists is left as it is, but one that cannot serve the
// store (made by an earlier version, say) is reported as [MySQLStore.Check] reports it,
// with the statements that fix it, so that a service finds out at startup rather than in
// its first business transaction.
func (s *MySQLStore) CreateSchema(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, s.q.schema); err != nil {
		if s.partitionIDs > 0 && isNoPartitioning(err) {
			return fmt.Errorf("%w: could not create table %s partitioned: %s: %w", ErrInvalidConfig, s.table, noPartitionsHint, err)
		}
		return fmt.Errorf("outbox: could not create table %s: %w", s.table, err)
	}
	return s.checkTable(ctx, false) // the relay's table is relay.CreateSchema's
}

// Check implements [Store]: the store's [MySQLConfig.Ordering] and the topics of its
// [MySQLConfig.Routes] (the default first), and whether the table can serve them. A table
// that does not exist is refused with [ErrNoTable]; one that lacks a column or an index
// the statements need (a table made by an earlier version), or, in key order, the index
// and the status value ordered claims need, or that is not partitioned as
// [MySQLConfig.PartitionIDs] says, or whose [MySQLConfig.RelayTable] is missing, with one
// error wrapping [ErrInvalidConfig] that names every problem once and the statements that
// fix them (docs/upgrading.md). A table without the server-side defaults that other
// programs' plain INSERTs need (docs/other-writers.md) is no error here: the store never
// needs them, and a warning in [StoreInfo.Warnings] names them.
func (s *MySQLStore) Check(ctx context.Context) (StoreInfo, error) {
	info := StoreInfo{Ordering: s.ordering, Topics: slices.Clone(s.routes.set)}
	if err := s.checkTable(ctx, true); err != nil {
		return info, err // a table it cannot serve: its defaults are the least of it
	}
	if cols, err := s.missingDefaults(ctx); err == nil && len(cols) > 0 {
		info.Warnings = append(info.Warnings, "the table has no server-side default for "+strings.Join(cols, ", ")+
			": a plain SQL INSERT of biz_no, event_type and payload by another program fails (strict SQL mode) or "+
			"writes an event without an event id (non-strict) until they are added (see docs/upgrading.md)")
	}
	return info, nil
}

// missingDefaults returns the columns, of those a plain SQL INSERT of biz_no, event_type and
// payload leaves to the server (docs/other-writers.md), that have no default in the table:
// a table made by an earlier version has none of them. InsertEvent never needs them, so
// Check only warns.
func (s *MySQLStore) missingDefaults(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT column_name FROM information_schema.columns
	WHERE table_schema = DATABASE() AND table_name = ?
	  AND column_name IN ('event_id', 'next_retry_time', 'create_time', 'update_time') AND column_default IS NULL
	ORDER BY ordinal_position`, s.table)
	if err != nil {
		return nil, s.wrap("check column defaults", err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, s.wrap("check column defaults", err)
		}
		cols = append(cols, strings.ToLower(c))
	}
	return cols, s.wrap("check column defaults", rows.Err())
}

// upgradeHint explains a table made by an earlier version.
const upgradeHint = "it was created by an earlier version of this package " +
	"(add the columns as docs/upgrading.md says, or drop the table if its events are all sent)"

// lockRetryCount is how many statements were run again after a deadlock (1213) or a lock
// wait timeout (1205) since the store was made (the publisher's lock-retry metric). Such
// retries are normal under contention and invisible to callers; a steady rise says the
// instances contend more than they should.
func (s *MySQLStore) lockRetryCount() int64 { return s.lockRetries.Load() }

// execOne runs a statement that targets one row and reports whether it changed it.
func (s *MySQLStore) execOne(ctx context.Context, op, query string, args ...any) (bool, error) {
	n, err := s.exec(ctx, op, query, args...)
	return n == 1, err
}

// exec runs one autocommit statement and returns the rows it changed. Every statement here
// is conditional, so running it again after a lock conflict is safe.
func (s *MySQLStore) exec(ctx context.Context, op, query string, args ...any) (int64, error) {
	n, err := retryOnLockConflict(ctx, s, func() (int64, error) {
		res, err := s.db.ExecContext(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	})
	return n, s.wrap(op, err)
}

// retryOnLockConflict runs fn again while it fails with a deadlock (up to maxDeadlockTries
// times in all) or a lock wait timeout (up to maxLockAttempts): either rolls back the
// statement (or the transaction) whole, so nothing of the failed try remains. A deadlock is
// found at once and is normal where instances contend, so it is tried more often; a lock
// wait timeout has already waited its innodb_lock_wait_timeout. Each retry is counted in
// s.lockRetries.
func retryOnLockConflict[T any](ctx context.Context, s *MySQLStore, fn func() (T, error)) (T, error) {
	deadlocks, timeouts := 0, 0
	for attempt := 1; ; attempt++ {
		v, err := fn()
		if err == nil || !isLockConflict(err) {
			return v, err
		}
		if mysqldialect.Is(err, mysqldialect.ErrLockDeadlock) {
			deadlocks++
		} else {
			timeouts++
		}
		if deadlocks == maxDeadlockTries || timeouts == maxLockAttempts {
			return v, err
		}
		s.lockRetries.Add(1)
		// A short, jittered pause, so that the transaction that won the lock finishes first.
		if sleep(ctx, time.Duration(attempt)*time.Duration(1+mrand.IntN(4))*time.Millisecond) != nil {
			return v, err
		}
	}
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// selectIDs runs a query that returns one column of ids.
func (s *MySQLStore) selectIDs(ctx context.Context, op, q string, args ...any) ([]int64, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, s.wrap(op, err)
		}
		ids = append(ids, id)
	}
	return ids, s.wrap(op, rows.Err())
}

// idList writes ids as an SQL list of integer literals. Literals rather than one placeholder
// each: a statement with parameters is prepared, run and closed (three round trips, unless
// the DSN sets interpolateParams), and integers cannot carry anything but a number.
func idList(ids []int64) string {
	b := make([]byte, 0, len(ids)*8)
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, id, 10)
	}
	return string(b)
}

// ignoreDone drops the error of a rollback on a transaction that has already ended.
func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) {
		// Ended already, or its connection is gone, which ends it: the error that made the
		// caller roll back says all there is to say.
		return nil
	}
	return err
}

// isLockConflict reports a deadlock or lock wait timeout: the statement was rolled back and
// may simply be run again.
func isLockConflict(err error) bool { return mysqldialect.IsLockConflict(err) }

// wrap names the operation, and the fix where the driver's error has an obvious one.
func (s *MySQLStore) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == mysqldialect.ErrNoSuchTable {
		return fmt.Errorf("outbox: %s: %w: table %s does not exist (create it with CreateSchema or schema.sql): %w", op, ErrNoTable, s.table, err)
	}
	if errors.As(err, &me) && me.Number == mysqldialect.ErrBadField {
		for _, col := range []string{"event_id", "reclaim_count", "trace_parent", "trace_state", "topic", mysqldialect.FailuresColumn} {
			if strings.Contains(me.Message, col) {
				return fmt.Errorf("outbox: %s: table %s has no %s column: %s: %w", op, s.table, col, upgradeHint, err)
			}
		}
	}
	if isNoPartitioning(err) {
		return fmt.Errorf("outbox: %s: table %s: %s: %w", op, s.table, noPartitionsHint, err)
	}
	if errors.As(err, &me) && me.Number == errBinlogStatementMode {
		return fmt.Errorf("outbox: %s: %s: %w", op, binlogHint, err)
	}
	return fmt.Errorf("outbox: %s: %w", op, err)
}

// errBinlogStatementMode is ER_BINLOG_STMT_MODE_AND_ROW_ENGINE: with binlog_format =
// STATEMENT, InnoDB refuses to lock or write rows in READ COMMITTED, the batch claim's
// isolation level.
const errBinlogStatementMode = mysqldialect.ErrBinlogStmtModeAndRowEngine

// binlogHint names the fixes for errBinlogStatementMode.
const binlogHint = "the batch claim runs in READ COMMITTED, which the server can write to its binary log only as rows: " +
	"set binlog_format to ROW (MySQL's default) or MIXED (MariaDB's), " +
	"or use ClaimPerRow, whose statements run in the session's own isolation level"

func truncateReason(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	if utf8.RuneCountInString(s) <= maxReasonLen {
		return s
	}
	r := []rune(s)
	return string(r[:maxReasonLen-3]) + "..."
}

// dbTime scans a DATETIME column whether or not the DSN has parseTime=true; NULL scans as the
// zero time. The column holds UTC.
type dbTime struct{ t *time.Time }

func (d dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		*d.t = time.Time{}
	case time.Time:
		*d.t = x
	case []byte:
		return d.parse(string(x))
	case string:
		return d.parse(x)
	default:
		return fmt.Errorf("outbox: cannot scan %T into a time", v)
	}
	return nil
}

func (d dbTime) parse(s string) error {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return fmt.Errorf("outbox: cannot parse time %q: %w", s, err)
	}
	*d.t = t
	return nil
}

// Subscribe returns a channel that receives a signal (coalesced: at most one waits) whenever
// events committed through this store may be due, and a function that ends the subscription.
// [Publisher.Run] subscribes when its store offers this.
func (s *MySQLStore) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.subsMu.Lock()
	if s.subs == nil {
		s.subs = map[chan struct{}]struct{}{}
	}
	s.subs[ch] = struct{}{}
	s.subsMu.Unlock()
	return ch, func() {
		s.subsMu.Lock()
		delete(s.subs, ch)
		last := len(s.subs) == 0
		s.subsMu.Unlock()
		if last {
			s.closeClaimSession() // no run claims through this store any more
		}
	}
}

// Notify wakes the subscribed publishers. [Tx.Commit] does this by itself; call it after
// committing directly a transaction wrapped with WrapTx. It never blocks. The next claim
// reads the due rows from the start rather than from where the last one left nothing behind
// (see [MySQLConfig.ScanFromStart]), since Notify cannot tell how long ago the transaction
// wrote its events; Tx.Commit can, so prefer it.
func (s *MySQLStore) Notify() {
	s.floor.reset()
	s.notify()
}

// notify wakes the subscribed publishers.
func (s *MySQLStore) notify() {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
