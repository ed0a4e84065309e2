package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
	"github.com/go-outbox/outbox/relay"
)

// binlogArgs start a private MariaDB server as production runs one, and as the relay needs
// it: the binlog on, ROW format with full row metadata, synced at each commit.
var binlogArgs = []string{"--log-bin", "--binlog-format=ROW", "--binlog-row-metadata=FULL", "--sync-binlog=1", "--server-id=7"}

// env is one outbox table on a private server with the binlog on, with its relay table.
type env struct {
	srv      *testsvc.MySQLServer
	db       *sql.DB
	store    *outbox.MySQLStore
	table    string
	relayTbl string
	dsn      string
	ordering outbox.Ordering
	cfg      outbox.MySQLConfig // the store's
}

func newServer(t *testing.T, extra ...string) *testsvc.MySQLServer {
	t.Helper()
	return testsvc.PrivateMySQL(t, append(append([]string{}, binlogArgs...), extra...)...)
}

func newEnv(t *testing.T, srv *testsvc.MySQLServer, ordering outbox.Ordering) *env {
	t.Helper()
	return newEnvConfig(t, srv, outbox.MySQLConfig{Ordering: ordering})
}

// newEnvConfig is newEnv with the store's settings (its Table and RelayTable are the env's).
func newEnvConfig(t *testing.T, srv *testsvc.MySQLServer, cfg outbox.MySQLConfig) *env {
	t.Helper()
	e := &env{srv: srv, db: srv.OpenDB(t), table: testsvc.UniqueTable("t_relay"), ordering: cfg.Ordering, dsn: srv.DSN()}
	e.relayTbl = e.table + "_cp"
	cfg.Table, cfg.RelayTable = e.table, e.relayTbl
	e.cfg = cfg
	var err error
	e.store, err = outbox.NewMySQLStore(e.db, cfg)
	require.NoError(t, err)
	require.NoError(t, e.store.CreateSchema(context.Background()))
	require.NoError(t, relay.CreateSchema(context.Background(), e.db, relay.Config{CheckpointTable: e.relayTbl}))
	return e
}

// insert commits n events, one transaction each, of biz nos key(i); it returns their event ids.
func (e *env) insert(t testing.TB, n int, key func(i int) string) []string {
	t.Helper()
	ids := make([]string, 0, n)
	for i := range n {
		tx, err := e.store.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		id, err := tx.InsertEvent(context.Background(), outbox.EventInput{BizNo: key(i), EventType: "ORDER_CREATED", Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		ids = append(ids, id)
	}
	return ids
}

// routeTo makes topic the default of the store's routes, and of the relays' made by config
// from now on: the events inserted after it go there.
func (e *env) routeTo(t testing.TB, topic string) {
	t.Helper()
	e.cfg.Routes.Topic = topic
	var err error
	e.store, err = outbox.NewMySQLStore(e.db, e.cfg)
	require.NoError(t, err)
}

func byIndex(prefix string) func(int) string {
	return func(i int) string { return fmt.Sprintf("%s-%d", prefix, i) }
}

func (e *env) config(id string) relay.Config {
	return relay.Config{Table: e.table, CheckpointTable: e.relayTbl, InstanceID: id, Ordering: e.ordering, Routes: e.cfg.Routes,
		CheckpointInterval: 200 * time.Millisecond, FallbackAfter: 3 * time.Second,
		Logger: testLogger()}
}

// testLogger writes the relays' logs to stderr with -v, and nowhere without.
func testLogger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.DiscardHandler)
}

// start runs a relay until stop is called or the test ends: stop closes it (a leader hands
// the table back) and checks that Run returned nil; it does so once, whoever calls it.
func start(t *testing.T, dsn string, sender outbox.Sender, cfg relay.Config) (r *relay.Relay, stop func()) {
	t.Helper()
	r, err := relay.New(dsn, sender, cfg)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	stop = sync.OnceFunc(func() {
		require.NoError(t, r.Close())
		require.NoError(t, <-done)
	})
	t.Cleanup(stop)
	return r, stop
}

func rocketSender(t *testing.T) outbox.Sender {
	t.Helper()
	s, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{testsvc.RocketMQNameServer(t)},
		GroupName: testsvc.UniqueTable("relay")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// statuses counts the table's rows by status.
func (e *env) statuses(t testing.TB) map[string]int {
	t.Helper()
	rows, err := e.db.Query("SELECT status, COUNT(*) FROM " + e.table + " GROUP BY status")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var s string
		var n int
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func (e *env) checkpoint(t testing.TB) (epoch int64, mode, gtid string) {
	t.Helper()
	err := e.db.QueryRow("SELECT epoch, mode, gtid FROM "+e.relayTbl+" WHERE outbox_table = ?", e.table).Scan(&epoch, &mode, &gtid)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, "", ""
	}
	require.NoError(t, err)
	return epoch, mode, gtid
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitLeader(t testing.TB, rs ...*relay.Relay) *relay.Relay {
	t.Helper()
	var leader *relay.Relay
	waitFor(t, 20*time.Second, "a leader", func() bool {
		for _, r := range rs {
			if r.Health().Leader {
				leader = r
				return true
			}
		}
		return false
	})
	return leader
}

// Events committed before the relay starts (found by its sweep) and while it runs (read
// from the binlog) reach the broker once each, and their rows end SUCCESS, marked by the
// relay; its checkpoint records a position.
func TestRelayPublishesEveryCommittedEventOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	before := e.insert(t, 50, byIndex("before"))
	reader := sdkmetric.NewManualReader()
	cfg := e.config("relay-1")
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	r, _ := start(t, e.dsn, rocketSender(t), cfg)
	waitLeader(t, r)
	during := e.insert(t, 300, byIndex("during"))
	c.WaitDistinct(t, len(before)+len(during), 60*time.Second)

	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 350 })
	deliveries := c.Deliveries()
	for _, id := range append(before, during...) {
		assert.Equal(t, 1, deliveries[id], "event %s", id)
	}
	var owners int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE claim_owner = 'relay-1'").Scan(&owners))
	assert.Equal(t, 350, owners)
	st := r.Stats()
	assert.Equal(t, int64(350), st.Sent)
	assert.Equal(t, int64(50), st.Swept, "the events committed before the relay started came from the table")
	got := sums(t, reader)
	assert.Equal(t, int64(350), got["outbox.events.sent"], "the publisher's counter, by the relay")
	assert.Equal(t, int64(50), got["outbox.relay.events.swept"])
	assert.Equal(t, int64(1), got["outbox.relay.terms"])
	assert.Equal(t, int64(1), got["outbox.relay.leader"])
	waitFor(t, 5*time.Second, "a checkpoint", func() bool { _, _, g := e.checkpoint(t); return g != "" })
	epoch, mode, gtid := e.checkpoint(t)
	assert.Equal(t, int64(1), epoch)
	assert.Equal(t, "relay", mode)
	assert.Regexp(t, `^0-7-\d+$`, gtid)
}

// Polling publishers of a relayed table claim nothing while the relay leads; when the
// relay closes, it hands the table back and they publish what comes next.
func TestPublishersStandByWhileTheRelayLeads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-standby")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	sender := rocketSender(t)

	r, stop := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 2 {
		p, err := outbox.NewPublisher(e.store, sender, outbox.Config{InstanceID: fmt.Sprintf("poller-%d", i),
			PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		wg.Go(func() { _ = p.Run(ctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })

	first := e.insert(t, 200, byIndex("relayed"))
	c.WaitDistinct(t, len(first), 60*time.Second)
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 200 })
	var byRelay int
	require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE claim_owner = 'relay-1'").Scan(&byRelay))
	assert.Equal(t, 200, byRelay, "the pollers claimed nothing while the relay led")

	stop()
	_, mode, _ := e.checkpoint(t)
	assert.Equal(t, "polling", mode, "a relay that closes hands the table back")
	second := e.insert(t, 100, byIndex("polled"))
	c.WaitDistinct(t, len(first)+len(second), 60*time.Second)
	// A publisher records its successes with its next claim.
	waitFor(t, 10*time.Second, "the pollers' rows SUCCESS", func() bool {
		var byPollers int
		require.NoError(t, e.db.QueryRow("SELECT COUNT(*) FROM "+e.table+" WHERE claim_owner LIKE 'poller-%' AND status = 'SUCCESS'").Scan(&byPollers))
		return byPollers == 100
	})
	for id, n := range c.Deliveries() {
		assert.Equal(t, 1, n, "event %s", id)
	}
}

// A relay refuses a server without the binlog, naming the fix, and returns at once.
func TestRelayRefusesAServerWithoutTheBinlog(t *testing.T) {
	t.Parallel()
	srv := testsvc.PrivateMySQL(t)
	e := newEnv(t, srv, outbox.Unordered)
	r, err := relay.New(e.dsn, outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }), e.config("relay-1"))
	require.NoError(t, err)
	defer r.Close()
	err = r.Run(context.Background())
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "log-bin")
}

// When the leader's lock connection is killed (its session, and with it the lock, ends), a
// standby takes over and resends from the checkpoint: nothing is lost, every duplicate has
// the same eventId, and the old leader stops.
func TestStandbyTakesOverWhenTheLeadersLockIsKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-failover")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	a, _ := start(t, e.dsn, rocketSender(t), e.config("relay-a"))
	b, _ := start(t, e.dsn, rocketSender(t), e.config("relay-b"))
	leader := waitLeader(t, a, b)
	standby := a
	if leader == a {
		standby = b
	}
	var ids []string
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			got := e.insert(t, 1, byIndex(fmt.Sprintf("k%d", i)))
			mu.Lock()
			ids = append(ids, got...)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	})
	time.Sleep(time.Second)
	var conn sql.NullInt64
	require.NoError(t, e.db.QueryRow("SELECT IS_USED_LOCK(?)", "outbox-relay:outbox_test."+e.table).Scan(&conn))
	require.True(t, conn.Valid, "the leader holds its lock")
	_, err := e.db.Exec(fmt.Sprintf("KILL %d", conn.Int64))
	require.NoError(t, err)
	waitFor(t, 20*time.Second, "the standby to lead", func() bool { return standby.Health().Leader })
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()

	c.WaitDistinct(t, len(ids), 60*time.Second)
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == len(ids) })
	deliveries := c.Deliveries()
	dups := 0
	for _, id := range ids {
		require.GreaterOrEqual(t, deliveries[id], 1, "event %s lost", id)
		dups += deliveries[id] - 1
	}
	t.Logf("%d events, %d duplicates after the failover", len(ids), dups)
	assert.LessOrEqual(t, dups, 400, "duplicates are bounded by the checkpoint interval's traffic and a batch in flight")
	epoch, mode, _ := e.checkpoint(t)
	assert.Equal(t, "relay", mode)
	assert.GreaterOrEqual(t, epoch, int64(2))
	assert.False(t, leader.Health().Leader && standby.Health().Leader, "one leader at a time")
}

// A relay that died leaves its checkpoint; if the binlog it names is purged while events
// are committed, the next leader cannot resume (error 1236), sweeps the table instead and
// loses nothing.
func TestRelayRecoversFromAPurgedPosition(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-purge")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	sender := rocketSender(t)
	r, stop := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	first := e.insert(t, 20, byIndex("first"))
	c.WaitDistinct(t, len(first), 60*time.Second)
	waitFor(t, 5*time.Second, "a checkpoint", func() bool { _, _, g := e.checkpoint(t); return g != "" })
	stop()
	_, _, gtid := e.checkpoint(t)
	// As a leader killed with SIGKILL leaves it: mode relay, its last position.
	_, err := e.db.Exec("UPDATE "+e.relayTbl+" SET mode = 'relay', gtid = ?, heartbeat_at = UTC_TIMESTAMP(3) WHERE outbox_table = ?", gtid, e.table)
	require.NoError(t, err)

	gap := e.insert(t, 30, byIndex("gap"))
	purgeBinlogs(t, e.db)

	r2, _ := start(t, e.dsn, sender, e.config("relay-2"))
	waitLeader(t, r2)
	after := e.insert(t, 20, byIndex("after"))
	c.WaitDistinct(t, len(first)+len(gap)+len(after), 60*time.Second)
	waitFor(t, 10*time.Second, "handover counted", func() bool { return r2.Stats().Handovers >= 1 })
	assert.GreaterOrEqual(t, r2.Stats().Swept, int64(len(gap)), "the gap came from the table")
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 70 })
}

// Events that another program writes with a plain SQL INSERT of biz_no, event_type and
// payload (docs/other-writers.md) are read from the binlog as InsertEvent's are: the row
// image carries the event id and the times the columns' defaults gave the row, and the
// relay sends each once, with that event id, without sweeping the table.
func TestRelaySendsPlainSQLInserts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-plain")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	r, _ := start(t, e.dsn, rocketSender(t), e.config("relay-1"))
	waitLeader(t, r)

	_, err := e.db.Exec("INSERT INTO "+e.table+" (biz_no, event_type, payload) VALUES (?, ?, ?)", "plain-1", "ORDER_CREATED", []byte(`{"n":1}`))
	require.NoError(t, err)
	_, err = e.db.Exec("INSERT INTO " + e.table + ` (biz_no, event_type, payload) VALUES
		('plain-2', 'ORDER_CREATED', '{"n":2}'), ('plain-3', 'ORDER_CREATED', '{"n":3}'), ('plain-4', 'ORDER_PAID', '{"n":4}')`)
	require.NoError(t, err)
	// From a session in MIXED format (MariaDB's default): UUID() is unsafe for statement
	// logging, so the server logs the insert as rows, and the relay reads it as such.
	conn, err := e.db.Conn(context.Background())
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "SET SESSION binlog_format = 'MIXED'")
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "INSERT INTO "+e.table+" (biz_no, event_type, payload) VALUES ('plain-5', 'ORDER_CREATED', '{}')")
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "SET SESSION binlog_format = 'ROW'") // back to the pool as it came
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	goIDs := e.insert(t, 1, byIndex("go"))
	ids := testsvc.EventIDs(t, e.db, e.table)
	require.Len(t, ids, 6)
	c.WaitDistinct(t, 6, 60*time.Second)
	waitFor(t, 10*time.Second, "every row SUCCESS", func() bool { return e.statuses(t)["SUCCESS"] == 6 })

	deliveries := c.Deliveries()
	for _, eventID := range ids {
		assert.Equal(t, 1, deliveries[eventID], "event %s", eventID)
	}
	assert.Contains(t, deliveries, goIDs[0])
	for _, m := range c.Messages() {
		var bizNo string
		require.NoError(t, e.db.QueryRow("SELECT biz_no FROM "+e.table+" WHERE event_id = ?", m.GetProperty("eventId")).Scan(&bizNo))
		assert.Equal(t, bizNo, m.GetProperty("bizNo"))
	}
	st := r.Stats()
	assert.Equal(t, int64(6), st.Sent)
	assert.Zero(t, st.Swept, "read from the binlog, not from the table")
	assert.Zero(t, st.Handovers, "no statement to follow: the MIXED session's insert was logged as rows")
}

// What the defaults for plain SQL inserts cost InsertEvent on MariaDB in MIXED format (its
// default): they make every insert into the table unsafe for statement logging, so it is
// logged as rows (with its statement's text beside them), where a table without them logs
// the statement. The binlog bytes per insert are logged (docs/other-writers.md, "The binary
// log", has the figures).
func TestInsertEventBinlogInMixedFormat(t *testing.T) {
	t.Parallel()
	srv := newServer(t, "--binlog-format=MIXED")
	db := srv.OpenDB(t)
	ctx := context.Background()
	position := func() (file string, pos int64) {
		var doDB, ignoreDB string
		require.NoError(t, db.QueryRow("SHOW MASTER STATUS").Scan(&file, &pos, &doDB, &ignoreDB))
		return file, pos
	}
	for _, defaults := range []bool{false, true} {
		table := testsvc.UniqueTable("t_mixed")
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
		require.NoError(t, err)
		require.NoError(t, store.CreateSchema(ctx))
		if !defaults { // the table as an earlier version made it
			_, err = db.Exec("ALTER TABLE " + table + " ALTER COLUMN event_id DROP DEFAULT, ALTER COLUMN next_retry_time DROP DEFAULT, " +
				"ALTER COLUMN create_time DROP DEFAULT, ALTER COLUMN update_time DROP DEFAULT")
			require.NoError(t, err)
		}
		file, before := position()
		const n = 100
		for i := range n {
			tx, err := store.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprintf("ORD-%08d", i), EventType: "ORDER_CREATED",
				Payload: []byte(strings.Repeat("a", 1024))})
			require.NoError(t, err)
			require.NoError(t, tx.Commit())
		}
		_, after := position()
		types := map[string]int{}
		rows, err := db.Query(fmt.Sprintf("SHOW BINLOG EVENTS IN '%s' FROM %d", file, before))
		require.NoError(t, err)
		for rows.Next() {
			var log, typ, info string
			var pos, serverID, end int64
			require.NoError(t, rows.Scan(&log, &pos, &typ, &serverID, &end, &info))
			if typ == "Query" && strings.Contains(info, "INSERT INTO") || strings.HasPrefix(typ, "Write_rows") {
				types[typ]++
			}
		}
		require.NoError(t, rows.Err())
		require.NoError(t, rows.Close())
		t.Logf("defaults %v: %d binlog bytes per InsertEvent of 1 KiB, events %v", defaults, (after-before)/n, types)
		if defaults {
			assert.Equal(t, map[string]int{"Write_rows_v1": n}, types, "logged as rows")
		} else {
			assert.Equal(t, map[string]int{"Query": n}, types, "logged as statements")
		}
	}
}

// A statement the row reader cannot follow (an insert from a session that logs statements,
// DDL on the outbox table, TRUNCATE) makes the relay sweep the table and read on from the
// current position: nothing committed is lost.
func TestRelayHandsOverOnStatementsItCannotFollow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	topic := testsvc.NewTopic(t, "relay-hazard")
	e.routeTo(t, topic)
	c := testsvc.Consume(t, topic)
	r, _ := start(t, e.dsn, rocketSender(t), e.config("relay-1"))
	waitLeader(t, r)
	ids := e.insert(t, 5, byIndex("row"))
	c.WaitDistinct(t, len(ids), 60*time.Second)

	// An insert logged as a statement.
	conn, err := e.db.Conn(context.Background())
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "SET SESSION binlog_format = 'STATEMENT'")
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "INSERT INTO "+e.table+` (event_id, biz_no, event_type, payload, next_retry_time, create_time, update_time)
		VALUES ('0190a0a0-0000-7000-8000-000000000001', 'stmt', 'ORDER_CREATED', '{"s":1}', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))`)
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	waitFor(t, 30*time.Second, "the statement-format insert sent", func() bool {
		return c.Deliveries()["0190a0a0-0000-7000-8000-000000000001"] >= 1
	})
	assert.GreaterOrEqual(t, r.Stats().Handovers, int64(1))

	// DDL on the outbox table, then more events.
	_, err = e.db.Exec("ALTER TABLE " + e.table + " ADD COLUMN note VARCHAR(16) NULL")
	require.NoError(t, err)
	more := e.insert(t, 5, byIndex("after-ddl"))
	for _, id := range more {
		waitFor(t, 30*time.Second, "an event after the DDL", func() bool { return c.Deliveries()[id] >= 1 })
	}
	assert.GreaterOrEqual(t, r.Stats().Handovers, int64(2))
	_, err = e.db.Exec("TRUNCATE TABLE " + e.table)
	require.NoError(t, err)
	last := e.insert(t, 5, byIndex("after-truncate"))
	for _, id := range last {
		waitFor(t, 30*time.Second, "an event after the TRUNCATE", func() bool { return c.Deliveries()[id] >= 1 })
	}
	assert.GreaterOrEqual(t, r.Stats().Handovers, int64(3))
}

// The purge's partition statements on a partitioned table (MySQLConfig.PartitionIDs:
// REORGANIZE PARTITION to add partitions ahead, DROP PARTITION of partitions of sent rows)
// change no row the relay has to send: the relay reads on through them without a
// handover, and the events after them arrive once each. Other DDL still hands over.
func TestRelayReadsOnThroughPartitionMaintenance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvConfig(t, newServer(t), outbox.MySQLConfig{PartitionIDs: 1000})
	// History: 2,500 events sent 60 days ago, written as SUCCESS (nothing for the relay).
	at := "DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 60 DAY)"
	for lo := 1; lo <= 2500; lo += 500 {
		var q strings.Builder
		q.WriteString("INSERT INTO " + e.table + " (id, event_id, biz_no, event_type, payload, status, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES ")
		for id := lo; id < lo+500; id++ {
			if id > lo {
				q.WriteByte(',')
			}
			fmt.Fprintf(&q, "(%d, UUID(), 'old', 'ORDER_CREATED', '{}', 'SUCCESS', %s, 'old', %s, %s, %s)", id, at, at, at, at)
		}
		_, err := e.db.Exec(q.String())
		require.NoError(t, err)
	}
	var mu sync.Mutex
	sent := map[string]int{}
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		mu.Lock()
		sent[ev.EventID]++
		mu.Unlock()
		return nil
	})
	count := func(ids []string) (n int) {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			n += min(sent[id], 1)
		}
		return n
	}
	r, _ := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	first := e.insert(t, 5, byIndex("before"))
	waitFor(t, 30*time.Second, "the first events sent", func() bool { return count(first) == len(first) })
	handovers := r.Stats().Handovers

	n, err := e.store.Purge(ctx, 30*24*time.Hour, outbox.PurgeOptions{Exclusive: true})
	require.NoError(t, err)
	assert.Equal(t, int64(1999), n, "p1000 and p2000 dropped")
	after := e.insert(t, 5, byIndex("after"))
	waitFor(t, 30*time.Second, "the events after the partition statements sent", func() bool { return count(after) == len(after) })
	assert.Equal(t, handovers, r.Stats().Handovers, "no handover for the partition statements")
	mu.Lock()
	for _, id := range append(first, after...) {
		assert.Equal(t, 1, sent[id], "event %s sent once", id)
	}
	mu.Unlock()

	// Any other DDL on the table is still a statement the relay cannot follow.
	_, err = e.db.Exec("ALTER TABLE " + e.table + " TRUNCATE PARTITION p3000")
	require.NoError(t, err)
	waitFor(t, 30*time.Second, "a handover for TRUNCATE PARTITION", func() bool { return r.Stats().Handovers > handovers })
}

// The checkpoint advances on an idle outbox while other tables commit, so that a failover
// does not reread what those wrote.
func TestCheckpointAdvancesOnAnIdleOutbox(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	r, _ := start(t, e.dsn, outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }), e.config("relay-1"))
	waitLeader(t, r)
	waitFor(t, 5*time.Second, "a checkpoint", func() bool { _, _, g := e.checkpoint(t); return g != "" })
	_, _, before := e.checkpoint(t)
	_, err := e.db.Exec("CREATE TABLE busy (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
	require.NoError(t, err)
	for i := range 50 {
		_, err := e.db.Exec("INSERT INTO busy (v) VALUES (?)", i)
		require.NoError(t, err)
	}
	var pos string
	require.NoError(t, e.db.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos))
	// The checkpoint's own writes move the server's position on too: it reaches pos or
	// passes it.
	seq := func(gtid string) int {
		require.Regexp(t, `^0-7-\d+$`, gtid)
		v, err := strconv.Atoi(strings.TrimPrefix(gtid, "0-7-"))
		require.NoError(t, err)
		return v
	}
	waitFor(t, 5*time.Second, "the checkpoint to reach the server's position", func() bool {
		_, _, g := e.checkpoint(t)
		return seq(g) >= seq(pos)
	})
	assert.NotEqual(t, before, pos)
	assert.Zero(t, r.Stats().Handovers)
}

// Events written in several GTID domains are each sent, and a new leader resumes from a
// checkpoint that spans the domains.
func TestRelayFollowsSeveralGTIDDomains(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	var sent sync.Map
	var count atomic.Int64
	sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		if _, dup := sent.LoadOrStore(ev.EventID, true); !dup {
			count.Add(1)
		}
		return nil
	})
	insertIn := func(domain, n int, prefix string) []string {
		conn, err := e.db.Conn(context.Background())
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.ExecContext(context.Background(), fmt.Sprintf("SET SESSION gtid_domain_id = %d", domain))
		require.NoError(t, err)
		var ids []string
		for i := range n {
			tx, err := conn.BeginTx(context.Background(), nil)
			require.NoError(t, err)
			w := e.store.WrapTx(tx)
			id, err := w.InsertEvent(context.Background(), outbox.EventInput{BizNo: fmt.Sprintf("%s-%d", prefix, i), EventType: "T", Payload: []byte("x")})
			require.NoError(t, err)
			require.NoError(t, w.Commit())
			ids = append(ids, id)
		}
		// Put the connection back as the pool lent it.
		_, err = conn.ExecContext(context.Background(), "SET SESSION gtid_domain_id = 0")
		require.NoError(t, err)
		return ids
	}
	r, stop := start(t, e.dsn, sender, e.config("relay-1"))
	waitLeader(t, r)
	n := len(insertIn(0, 10, "d0")) + len(insertIn(1, 10, "d1")) + len(insertIn(2, 10, "d2"))
	waitFor(t, 20*time.Second, "every event", func() bool { return count.Load() == int64(n) })
	waitFor(t, 5*time.Second, "a checkpoint spanning the domains", func() bool {
		_, _, g := e.checkpoint(t)
		return strings.Count(g, ",") == 2
	})
	stop()
	_, _, gtid := e.checkpoint(t)
	_, err := e.db.Exec("UPDATE "+e.relayTbl+" SET mode = 'relay' WHERE outbox_table = ?", e.table)
	require.NoError(t, err)
	m := len(insertIn(1, 5, "late1")) + len(insertIn(2, 5, "late2"))
	r2, _ := start(t, e.dsn, sender, e.config("relay-2"))
	waitLeader(t, r2)
	waitFor(t, 20*time.Second, "the later events", func() bool { return count.Load() == int64(n+m) })
	assert.Zero(t, r2.Stats().Handovers, "resumed from %s without a sweep's handover", gtid)
	assert.Equal(t, int64(m), r2.Stats().Sent, "only the later events were sent")
}

// purgeBinlogs starts a new binlog file and purges every older one. MariaDB keeps a file
// until its transactions are checkpointed in InnoDB, so the purge is tried until it took.
func purgeBinlogs(t *testing.T, db *sql.DB) {
	t.Helper()
	_, err := db.Exec("FLUSH BINARY LOGS")
	require.NoError(t, err)
	logs := func() []string {
		rows, err := db.Query("SHOW BINARY LOGS")
		require.NoError(t, err)
		defer rows.Close()
		cols, err := rows.Columns()
		require.NoError(t, err)
		var names []string
		for rows.Next() {
			vals := make([]any, len(cols))
			var name string
			vals[0] = &name
			for i := 1; i < len(cols); i++ {
				vals[i] = new(sql.RawBytes)
			}
			require.NoError(t, rows.Scan(vals...))
			names = append(names, name)
		}
		require.NoError(t, rows.Err())
		return names
	}
	newest := logs()[len(logs())-1]
	waitFor(t, 20*time.Second, "the older binlogs purged", func() bool {
		_, err := db.Exec("PURGE BINARY LOGS TO '" + newest + "'")
		require.NoError(t, err)
		return len(logs()) == 1
	})
}

// sums collects reader once and returns each Int64 sum or gauge, added over its attributes.
func sums(t *testing.T, reader *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
				}
			}
		}
	}
	return out
}
