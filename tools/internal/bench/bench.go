// Package bench measures the publisher on real servers: how fast K instances drain a backlog
// in each claim mode, and how long an event waits between its commit and its send; and, at a
// steady commit rate rather than from a backlog, what publishing costs the service's
// database (Steady), what the event's INSERT and each outbox index cost the business
// transaction (WritePath), and what publishing takes from the writers' throughput (Service).
// The benchmark program (tools/outbox-bench) prints its results as tables; the package's go
// test benchmarks run the same code.
package bench

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

// Env is the database a run uses.
type Env struct {
	DSN string
}

// open returns a new pool, as a separate instance would have.
func (e Env) open() (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(e.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse DSN: %w", err)
	}
	cfg.ParseTime = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxIdleConns(16)
	return db, nil
}

// SenderFactory makes instance i's sender. The sender belongs to the instance's publisher,
// whose Close closes it (if it is an io.Closer); a reference relay's is closed by the run.
type SenderFactory func(i int) (outbox.Sender, error)

// NopSender is a sender that does nothing: it measures the publisher and the database alone.
func NopSender(int) (outbox.Sender, error) {
	return outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }), nil
}

// SlowSender returns a sender that takes d per event, one event after another, as a broker
// that answers every message after d would: with it the instances' sends, not the database,
// set the pace.
func SlowSender(d time.Duration) SenderFactory {
	return func(int) (outbox.Sender, error) {
		return outbox.SenderFunc(func(ctx context.Context, _ outbox.Event) error {
			time.Sleep(d) // d is short: no need to wake early when ctx ends
			return ctx.Err()
		}), nil
	}
}

// closeSender closes s if it is an io.Closer: a sender no publisher took over.
func closeSender(s outbox.Sender) {
	if c, ok := s.(io.Closer); ok {
		_ = c.Close()
	}
}

// ModeName names a claim mode as the tables do: "per-row" (Tuning.ClaimPerRow) or "batch".
func ModeName(perRow bool) string {
	if perRow {
		return "per-row"
	}
	return "batch"
}

// Drain is one drain measurement.
type Drain struct {
	PerRow    bool // Tuning.ClaimPerRow: per-row claims; false: batch claims (the default)
	Instances int
	Events    int
	Sender    SenderFactory
	BatchSize int // Tuning.BatchSize; 0: the mode's default

	// ConcurrentClaims drains with MySQLConfig.ConcurrentClaims: batch claims scan at the
	// same time instead of taking turns.
	ConcurrentClaims bool
	// GrowingRows drains a table whose lease columns grow when a row is claimed: status
	// VARCHAR(16), claim_owner VARCHAR(128) NULL and claimed_at NULL, the layout before
	// schema.sql made them fixed-width. A baseline for the in-place claim.
	GrowingRows bool
	// Eager publishes as before coalescing: every wake-up claims at once
	// (Tuning.EagerClaims), every claim is a transaction of its own
	// (MySQLConfig.PooledClaims) and locks the due rows as it scans them from the start
	// (MySQLConfig.ScanFromStart). The baseline of the steady-state rows.
	Eager bool
	// CoalesceDelay is Tuning.CoalesceDelay when not Eager; 0 is the default.
	CoalesceDelay time.Duration
	// Keys spreads the events over this many biz nos, event i of key i mod Keys (1: one hot
	// key); 0 gives every event a biz no of its own.
	Keys int
	// Ordering is the MySQLConfig.Ordering of the publishers' stores; other than Unordered,
	// the table gets the index ordered claims need (idx_biz_no_status in place of
	// idx_biz_no).
	Ordering outbox.Ordering
	// Reference, other than NoReference, runs that reference relay (one, on the first
	// instance's pool, a round every CoalesceDelay) instead of the library's publishers.
	Reference Reference
	// Relay publishes through the binlog relay (module relay): each instance runs a relay
	// beside its publisher, whose store stands by while a relay leads (RelayTable). The
	// server needs its binlog on, as docs/relay.md says.
	Relay bool
	// Topic is the publishers' stores' default topic (MySQLConfig.Routes.Topic), where the
	// drained events go; empty: the library's default.
	Topic string
	// Topics, if set, spreads each biz no's events over these topics in turn: a biz no's
	// event j is of type EventType(j mod len(Topics)), which the stores route to
	// Topics[j mod len(Topics)] (RoutedTopics). Topic is then unused.
	Topics []string
}

// DrainResult is what a drain measured.
type DrainResult struct {
	Elapsed    time.Duration
	Statements int64 // statements the server ran for the publishers (its Questions counter)
	// LockRetries is the statements run again after a deadlock or lock wait timeout: the
	// publishers' outbox.store.lock_retries counter.
	LockRetries int64
	Errors      int64 // error-level log records: what the user would see
	RedoBytes   int64 // InnoDB redo log written during the drain; -1 if the server does not say
}

// EventsPerSecond is the drain rate.
func (r DrainResult) EventsPerSecond(events int) float64 {
	return float64(events) / r.Elapsed.Seconds()
}

// growingRows turns schema.sql's fixed-width lease columns back into ones that grow when a
// row is claimed.
const growingRows = "ALTER TABLE `%s` MODIFY status VARCHAR(16) NOT NULL DEFAULT 'WAIT', " +
	"MODIFY claim_owner VARCHAR(128) NULL DEFAULT NULL, MODIFY claimed_at DATETIME(3) NULL DEFAULT NULL"

// redoLSN returns the InnoDB redo log's current sequence number (MariaDB: Innodb_lsn_current;
// MySQL 8.0.30+: Innodb_redo_log_current_lsn), or -1 if the server reports neither.
func redoLSN(ctx context.Context, db *sql.DB) int64 {
	var name string
	var lsn int64
	err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('Innodb_lsn_current', 'Innodb_redo_log_current_lsn')").Scan(&name, &lsn)
	if err != nil {
		return -1
	}
	return lsn
}

// table is a fresh outbox table, dropped by drop.
type table struct {
	db    *sql.DB
	store *outbox.MySQLStore
	name  string
}

var tableSeq atomic.Int64

func newTable(ctx context.Context, env Env) (*table, error) { return newTableWith(ctx, env, 0) }

// newTableWith is newTable, partitioned by RANGE (id) with partitionIDs ids a partition
// when positive (MySQLConfig.PartitionIDs).
func newTableWith(ctx context.Context, env Env, partitionIDs int64) (*table, error) {
	db, err := env.open()
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("bench_event_%d_%d", time.Now().UnixNano()%1e9, tableSeq.Add(1))
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: name, PartitionIDs: partitionIDs})
	if err == nil {
		err = store.CreateSchema(ctx)
	}
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &table{db: db, store: store, name: name}, nil
}

func (t *table) drop() {
	_, _ = t.db.Exec("DROP TABLE IF EXISTS `" + t.name + "`")
	_ = t.db.Close()
}

// orderedIndex makes a table ready for ordered claims, as docs/ordering.md's ALTER TABLE does.
const orderedIndex = "ALTER TABLE `%s` DROP INDEX idx_biz_no, ADD INDEX idx_biz_no_status (biz_no, status, id)"

// fill inserts n due WAIT events with 100-byte payloads, 1,000 rows a statement, spread over
// keys biz nos (0: one each): event i is of biz no i mod keys. With types, a biz no's events
// cycle over that many event types (EventType): its event j is of type j mod types; with
// none, every event is of type BENCH.
func (t *table) fill(ctx context.Context, n, keys, types int) error {
	const chunk = 1000
	payload := strings.Repeat("x", 100)
	for done := 0; done < n; done += chunk {
		rows := min(chunk, n-done)
		var q strings.Builder
		q.WriteString("INSERT INTO `" + t.name + "` (event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, create_time, update_time) VALUES ")
		args := make([]any, 0, rows*4)
		for i := range rows {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString("(?, ?, ?, ?, 'WAIT', 0, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))")
			eventID, err := uuid.NewV7() // as InsertEvent makes them
			if err != nil {
				return fmt.Errorf("fill: %w", err)
			}
			key, j := done+i, 0
			if keys > 0 {
				key, j = key%keys, key/keys
			}
			typ := "BENCH"
			if types > 0 {
				typ = EventType(j % types)
			}
			args = append(args, eventID.String(), fmt.Sprint("ORD-", key), typ, payload)
		}
		if _, err := t.db.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

// fillSent inserts n SUCCESS events sent age ago (claimed and acknowledged then), with
// 100-byte payloads, 2,000 rows a statement: the history a retention purge deletes.
func (t *table) fillSent(ctx context.Context, n int, age time.Duration) error {
	const chunk = 2000
	payload := strings.Repeat("x", 100)
	at := fmt.Sprintf("DATE_SUB(UTC_TIMESTAMP(3), INTERVAL %d SECOND)", int64(age.Seconds()))
	for done := 0; done < n; done += chunk {
		rows := min(chunk, n-done)
		var q strings.Builder
		q.WriteString("INSERT INTO `" + t.name + "` (event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES ")
		args := make([]any, 0, rows*3)
		for i := range rows {
			if i > 0 {
				q.WriteByte(',')
			}
			q.WriteString("(?, ?, 'BENCH', ?, 'SUCCESS', 0, " + at + ", 'old-instance', " + at + ", " + at + ", " + at + ")")
			eventID, err := uuid.NewV7()
			if err != nil {
				return fmt.Errorf("fill: %w", err)
			}
			args = append(args, eventID.String(), fmt.Sprint("OLD-", done+i), payload)
		}
		if _, err := t.db.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	return nil
}

// pending counts the rows not yet SUCCESS (cheap once few are left: idx_status_next_retry).
func (t *table) pending(ctx context.Context) (int, error) {
	var n int
	err := t.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+t.name+"` WHERE status IN ('WAIT', 'SENDING')").Scan(&n)
	return n, err
}

func questions(ctx context.Context, db *sql.DB) (int64, error) {
	var name string
	var n int64
	err := db.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Questions'").Scan(&name, &n)
	return n, err
}

// errorCounter counts the publishers' error-level log records and keeps the first one.
type errorCounter struct {
	n     atomic.Int64
	mu    sync.Mutex
	first string
}

func (c *errorCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelError }
func (c *errorCounter) WithAttrs([]slog.Attr) slog.Handler           { return c }
func (c *errorCounter) WithGroup(string) slog.Handler                { return c }

func (c *errorCounter) Handle(_ context.Context, r slog.Record) error {
	if c.n.Add(1) == 1 {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		c.mu.Lock()
		c.first = b.String()
		c.mu.Unlock()
	}
	return nil
}

// First is the first error-level record, "" if none.
func (c *errorCounter) First() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.first
}

// instance is one running publisher with its own pool and sender.
type instance struct {
	db    *sql.DB
	store *outbox.MySQLStore
	pub   *outbox.Publisher
	// meters is the publisher's MeterProvider, read by lockRetries.
	meters *meters
	// relay, if set, runs instead of pub: a reference relay (see Reference).
	relay func(context.Context)
	// rl, if set, is the instance's binlog relay (Drain.Relay), run beside pub.
	rl    *relay.Relay
	close func()
}

// benchStore is an instance's store as its publisher sees it: the MySQL store without Stats,
// so that reading the lock-retry counter, which collects the publisher's table gauges too,
// runs no statement of its own during a measurement (a store without Stats reports no table
// gauges: the publisher's choice, see Store.Stats).
type benchStore struct{ *outbox.MySQLStore }

func (benchStore) Stats(context.Context, outbox.StatsOptions) (outbox.TableStats, error) {
	return outbox.TableStats{}, errors.ErrUnsupported
}

// startInstances makes d.Instances publishers on the table name, configured as d says, each
// with its own pool and a sender from senders.
func startInstances(env Env, name string, d Drain, poll time.Duration,
	senders SenderFactory, errs *errorCounter) ([]*instance, error) {
	var out []*instance
	for i := range d.Instances {
		db, err := env.open()
		if err != nil {
			return out, err
		}
		mc := outbox.MySQLConfig{Table: name, Ordering: d.Ordering, Routes: outbox.Routes{Topic: d.Topic},
			ConcurrentClaims: d.ConcurrentClaims, PooledClaims: d.Eager, ScanFromStart: d.Eager}
		if len(d.Topics) > 0 {
			mc.Routes = RoutedTopics(d.Topics)
		}
		if d.Relay {
			mc.RelayTable = relayTable(name)
		}
		store, err := outbox.NewMySQLStore(db, mc)
		if err != nil {
			_ = db.Close()
			return out, err
		}
		sender, err := senders(i)
		if err != nil {
			_ = db.Close()
			return out, err
		}
		if d.Reference != NoReference {
			// One relay for all: the cheapest a reference can be. The other instances'
			// pools and stores serve their writers, as they do with the library.
			in := &instance{db: db, store: store, close: func() { closeSender(sender); _ = db.Close() }}
			out = append(out, in)
			if i == 0 {
				in.relay = func(ctx context.Context) {
					gap := cmp.Or(d.CoalesceDelay, 7*time.Millisecond) // the default Tuning.CoalesceDelay
					run := func() error { return runReference(ctx, db, name, d.Reference, gap, sender) }
					if d.Reference == BinlogOnly {
						run = func() error { return runBinlogReference(ctx, env, db, name, sender) }
					}
					if err := run(); err != nil {
						slog.New(errs).Error("reference relay stopped", "err", err)
					}
				}
			}
			continue
		}
		m := newMeters()
		pub, err := outbox.NewPublisher(benchStore{store}, sender, outbox.Config{
			InstanceID:    fmt.Sprintf("bench-%d-%s", i, outbox.DefaultInstanceID()),
			PollInterval:  poll,
			Logger:        slog.New(errs),
			MeterProvider: m.provider,
			Tuning: outbox.Tuning{
				ClaimPerRow:   d.PerRow,
				BatchSize:     d.BatchSize,
				CoalesceDelay: d.CoalesceDelay,
				EagerClaims:   d.Eager,
			},
		})
		if err != nil {
			closeSender(sender)
			m.shutdown()
			_ = db.Close()
			return out, err
		}
		in := &instance{db: db, store: store, pub: pub, meters: m}
		if d.Relay {
			if in.rl, err = newRelay(context.Background(), env, db, name, i, sender, errs); err != nil {
				_ = pub.Close()
				m.shutdown()
				_ = db.Close()
				return out, err
			}
		}
		in.close = func() {
			if in.rl != nil {
				_ = in.rl.Close() // leaves the sender to the publisher
			}
			_ = pub.Close() // closes the sender
			m.shutdown()
			_ = db.Close()
		}
		out = append(out, in)
	}
	return out, nil
}

// run starts every instance's publisher and returns a function that stops them and waits.
func run(instances []*instance) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, in := range instances {
		switch {
		case in.relay != nil:
			wg.Go(func() { in.relay(ctx) })
		case in.pub != nil:
			wg.Go(func() { _ = in.pub.Run(ctx) })
		}
		if in.rl != nil {
			wg.Go(func() {
				if err := in.rl.Run(ctx); err != nil {
					slog.Error("relay refused to start", "err", err)
				}
			})
		}
	}
	return func() {
		// Every Run stops at once; each publisher's Close then closes its sender.
		cancel()
		wg.Wait()
		for _, in := range instances {
			in.close()
		}
	}
}

// backlog makes a fresh table holding d.Events due events and d.Instances publisher instances
// on it, not yet running, with senders (d.Sender is not used). On error it leaves nothing
// behind.
func backlog(ctx context.Context, env Env, d Drain, senders SenderFactory) (*table, []*instance, *errorCounter, error) {
	t, err := newTable(ctx, env)
	if err != nil {
		return nil, nil, nil, err
	}
	if d.GrowingRows {
		if _, err := t.db.ExecContext(ctx, fmt.Sprintf(growingRows, t.name)); err != nil {
			t.drop()
			return nil, nil, nil, err
		}
	}
	if d.Ordering != outbox.Unordered {
		if _, err := t.db.ExecContext(ctx, fmt.Sprintf(orderedIndex, t.name)); err != nil {
			t.drop()
			return nil, nil, nil, err
		}
	}
	if err := t.fill(ctx, d.Events, d.Keys, len(d.Topics)); err != nil {
		t.drop()
		return nil, nil, nil, err
	}
	errs := &errorCounter{}
	instances, err := startInstances(env, t.name, d, 10*time.Millisecond, senders, errs)
	if err != nil {
		for _, in := range instances {
			in.close()
		}
		t.drop()
		return nil, nil, nil, err
	}
	return t, instances, errs, nil
}

// counting wraps each sender so that every successful send adds to n.
func counting(f SenderFactory, n *atomic.Int64) SenderFactory {
	return func(i int) (outbox.Sender, error) {
		s, err := f(i)
		if err != nil {
			return nil, err
		}
		return countingSender{s: s, n: n}, nil
	}
}

// countingSender counts the events its sender accepted. Like any wrapper it passes Info on,
// and Close, so that the publisher's Close closes the sender inside.
type countingSender struct {
	s outbox.Sender
	n *atomic.Int64
}

func (c countingSender) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	errs := c.s.Send(ctx, evs, keyOrder)
	for _, err := range errs {
		if err == nil {
			c.n.Add(1)
		}
	}
	return errs
}

func (c countingSender) Info() outbox.SenderInfo { return c.s.Info() }

func (c countingSender) Check(ctx context.Context, topics []string) error {
	return c.s.Check(ctx, topics)
}

func (c countingSender) Close() error {
	if cl, ok := c.s.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// Run drains d.Events pre-inserted events with d.Instances publishers.
func (d Drain) Run(ctx context.Context, env Env) (DrainResult, error) {
	var res DrainResult
	var sent atomic.Int64
	t, instances, errs, err := backlog(ctx, env, d, counting(d.Sender, &sent))
	if err != nil {
		return res, err
	}
	defer t.drop()
	q0, err := questions(ctx, t.db)
	if err != nil {
		return res, err
	}
	lsn0 := redoLSN(ctx, t.db)
	start := time.Now()
	stop := run(instances)
	// Counting the table's pending rows while most are pending would load the database as
	// much as the publishers do: wait for the sends first, then for the last acks.
	for sent.Load() < int64(d.Events) {
		time.Sleep(time.Millisecond)
	}
	polls := int64(0)
	for {
		left, err := t.pending(ctx)
		polls++
		if err != nil {
			stop()
			return res, err
		}
		if left == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	res.Elapsed = time.Since(start)
	res.RedoBytes = -1
	if lsn1 := redoLSN(ctx, t.db); lsn0 >= 0 && lsn1 >= 0 {
		res.RedoBytes = lsn1 - lsn0
	}
	for _, in := range instances {
		n, err := in.meters.lockRetries(ctx)
		if err != nil {
			stop()
			return res, err
		}
		res.LockRetries += n
	}
	stop()
	q1, err := questions(ctx, t.db)
	if err != nil {
		return res, err
	}
	// The server's counter also saw this harness's polls and the counter reads themselves.
	res.Statements = q1 - q0 - polls - 1
	res.Errors = errs.n.Load()
	return res, nil
}

// Latency is one commit-to-send latency measurement: events committed one at a time at a
// steady rate through the instances' stores (round robin, as each instance's order API
// writes through its own), while the publishers run with the given poll interval.
type Latency struct {
	PerRow    bool // Tuning.ClaimPerRow; false: batch claims
	Instances int
	Events    int
	Rate      int  // commits per second
	WakeUp    bool // commit through Tx.Commit (wakes the local publisher), or commit the *sql.Tx directly
	Poll      time.Duration

	// PurgeRows, when positive, fills the table with this many SUCCESS rows sent 60 days ago
	// before the load starts, and purges them (MySQLStore.Purge, older than 30 days, in
	// batches of PurgeBatch rows with PurgePause between) beside the load, from its second
	// second on; the load then runs until the purge has ended and at least Events events
	// were committed.
	PurgeRows  int
	PurgeBatch int
	PurgePause time.Duration
	// Partitioned makes the table partitioned by RANGE (id) (MySQLConfig.PartitionIDs), with
	// partitions of PurgeRows+1 ids (1,000 at least), so that the PurgeRows old rows fill the
	// first partition exactly and the purge drops it whole.
	Partitioned bool
}

// LatencyResult holds the latency of every event, sorted.
type LatencyResult struct {
	Sorted []time.Duration
	// Purged and PurgeElapsed describe the purge that ran beside the load, if any.
	Purged       int64
	PurgeElapsed time.Duration
	// Commits holds how long each transaction of the load took (BeginTx to Commit), sorted;
	// LoadElapsed how long the load ran: together, the writers' throughput.
	Commits     []time.Duration
	LoadElapsed time.Duration
}

// CommitRate is the load's commits per second.
func (r LatencyResult) CommitRate() float64 {
	if r.LoadElapsed <= 0 {
		return 0
	}
	return float64(len(r.Commits)) / r.LoadElapsed.Seconds()
}

// CommitQuantile is the q-quantile of the load's transaction times.
func (r LatencyResult) CommitQuantile(q float64) time.Duration {
	return LatencyResult{Sorted: r.Commits}.Quantile(q)
}

// Quantile returns the q-quantile (0 < q <= 1).
func (r LatencyResult) Quantile(q float64) time.Duration {
	if len(r.Sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(r.Sorted))+0.5) - 1
	return r.Sorted[min(max(i, 0), len(r.Sorted)-1)]
}

// Run commits l.Events events and measures, for each, the time from just before its commit
// to the moment the sender was called with it.
func (l Latency) Run(ctx context.Context, env Env) (LatencyResult, error) {
	var res LatencyResult
	var partitionIDs int64
	if l.Partitioned {
		partitionIDs = max(int64(l.PurgeRows)+1, 1000)
	}
	t, err := newTableWith(ctx, env, partitionIDs)
	if err != nil {
		return res, err
	}
	defer t.drop()

	if l.PurgeRows > 0 {
		if err := t.fillSent(ctx, l.PurgeRows, 60*24*time.Hour); err != nil {
			return res, err
		}
	}

	var mu sync.Mutex
	sentAt := make(map[string]time.Time, l.Events) // by event id
	senders := func(int) (outbox.Sender, error) {
		return outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
			now := time.Now()
			mu.Lock()
			if _, ok := sentAt[ev.EventID]; !ok {
				sentAt[ev.EventID] = now
			}
			mu.Unlock()
			return nil
		}), nil
	}
	errs := &errorCounter{}
	instances, err := startInstances(env, t.name, Drain{PerRow: l.PerRow, Instances: l.Instances}, l.Poll, senders, errs)
	if err != nil {
		for _, in := range instances {
			in.close()
		}
		return res, err
	}
	stop := run(instances)
	defer stop()

	purgeDone := make(chan error, 1)
	purgeStart := make(chan struct{}) // closed a second into the load: a partition's drop needs a row past its bound
	startPurge := sync.OnceFunc(func() { close(purgeStart) })
	defer startPurge()
	if l.PurgeRows > 0 {
		go func() {
			select {
			case <-purgeStart:
			case <-ctx.Done():
				purgeDone <- ctx.Err()
				return
			}
			start := time.Now()
			n, err := t.store.Purge(ctx, 30*24*time.Hour, outbox.PurgeOptions{BatchRows: l.PurgeBatch, Pause: l.PurgePause})
			res.Purged, res.PurgeElapsed = n, time.Since(start)
			purgeDone <- err
		}()
	} else {
		purgeDone <- nil
	}
	var purgeErr error
	purging := true

	committedAt := make(map[string]time.Time, l.Events) // by event id
	tick := time.NewTicker(time.Second / time.Duration(l.Rate))
	defer tick.Stop()
	loadStart := time.Now()
	for i := 0; i < l.Events || purging; i++ {
		if i == l.Rate {
			startPurge()
		}
		if purging {
			select {
			case purgeErr = <-purgeDone:
				purging = false
			default:
			}
		}
		<-tick.C
		store := instances[i%len(instances)].store
		began := time.Now()
		id, at, err := commitOne(ctx, store, i, l.WakeUp)
		if err != nil {
			return res, err
		}
		res.Commits = append(res.Commits, time.Since(began))
		committedAt[id] = at
	}
	res.LoadElapsed = time.Since(loadStart)
	slices.Sort(res.Commits)
	if purgeErr != nil {
		return res, fmt.Errorf("purge: %w", purgeErr)
	}
	deadline := time.Now().Add(time.Minute + 2*l.Poll)
	for {
		mu.Lock()
		n := len(sentAt)
		mu.Unlock()
		if n >= l.Events {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("latency: %d of %d events sent", n, l.Events)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	for id, c := range committedAt {
		res.Sorted = append(res.Sorted, sentAt[id].Sub(c))
	}
	slices.Sort(res.Sorted)
	return res, nil
}

// commitOne writes one event in its own transaction and returns its event id and the moment
// just before the commit.
func commitOne(ctx context.Context, store *outbox.MySQLStore, i int, wake bool) (string, time.Time, error) {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return "", time.Time{}, err
	}
	id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprint("ORD-", i), EventType: "BENCH", Payload: []byte(`{}`)})
	if err != nil {
		_ = tx.Rollback()
		return "", time.Time{}, err
	}
	at := time.Now()
	if wake {
		err = tx.Commit()
	} else {
		err = tx.Tx.Commit() // the *sql.Tx itself: no wake-up, the poll finds it
	}
	return id, at, err
}

// ServerVersion returns the database server's version string.
func ServerVersion(ctx context.Context, env Env) (string, error) {
	db, err := env.open()
	if err != nil {
		return "", err
	}
	defer db.Close()
	var v string
	err = db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v)
	return v, err
}

// Backlog drains a large backlog with one batch-mode instance, sampling the heap: the
// publisher holds one claimed batch at a time, so its memory must not grow with the backlog.
type Backlog struct {
	Events int
}

// BacklogResult is what a backlog drain measured.
type BacklogResult struct {
	Elapsed            time.Duration
	HeapStart, HeapMax uint64 // bytes in use, after a GC at the start, and the most seen
}

// Run fills the backlog, then drains it.
func (bl Backlog) Run(ctx context.Context, env Env) (BacklogResult, error) {
	var res BacklogResult
	t, instances, errs, err := backlog(ctx, env, Drain{Instances: 1, Events: bl.Events}, NopSender)
	if err != nil {
		return res, err
	}
	defer t.drop()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapStart, res.HeapMax = ms.HeapInuse, ms.HeapInuse
	start := time.Now()
	stop := run(instances)
	defer stop()
	for {
		runtime.ReadMemStats(&ms)
		res.HeapMax = max(res.HeapMax, ms.HeapInuse)
		left, err := t.pending(ctx)
		if err != nil {
			return res, err
		}
		if left == 0 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	res.Elapsed = time.Since(start)
	if n := errs.n.Load(); n > 0 {
		return res, fmt.Errorf("backlog: %d errors logged", n)
	}
	return res, nil
}
