package outbox_test

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// Events written by programs that do not use this package (docs/other-writers.md): the
// plain INSERT of biz_no, event_type and payload, with the rest left to the columns'
// defaults on the server.

// execer is what runs the plain INSERT: a pool, a connection or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// docSQL returns the first ```sql block after the heading in a page of docs/, so that the
// tests run the statements the page shows.
func docSQL(t testing.TB, page, heading string) string {
	t.Helper()
	text, err := os.ReadFile("docs/" + page)
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(text), "\n"+heading+"\n")
	require.True(t, ok, "docs/%s has the heading %q", page, heading)
	_, block, ok := strings.Cut(after, "```sql\n")
	require.True(t, ok, "docs/%s has an sql block after %q", page, heading)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok)
	return block
}

// plainInsertSQL is docs/other-writers.md's INSERT on b's table.
func (b *bundle) plainInsertSQL(t testing.TB) string {
	t.Helper()
	q := strings.TrimSuffix(strings.TrimSpace(docSQL(t, "other-writers.md", "## The INSERT")), ";")
	require.Equal(t, "INSERT INTO t_event_record (biz_no, event_type, payload) VALUES (?, ?, ?)", q)
	return strings.ReplaceAll(q, "t_event_record", "`"+outbox.TableForTest(b.store)+"`")
}

// plainInsert writes one event as a program of another language does, and returns its id.
func (b *bundle) plainInsert(t testing.TB, x execer, bizNo, eventType string, payload []byte) int64 {
	t.Helper()
	res, err := x.ExecContext(context.Background(), b.plainInsertSQL(t), bizNo, eventType, payload)
	require.NoError(t, err)
	id, err := res.LastInsertId()
	require.NoError(t, err)
	return id
}

// requireServerEventID checks that id is what UUID() makes: a canonical, lowercase
// version-1 UUID.
func requireServerEventID(t testing.TB, id string) {
	t.Helper()
	u, err := uuid.Parse(id)
	require.NoError(t, err, "event id %q", id)
	assert.Equal(t, u.String(), id, "canonical and lowercase")
	assert.Equal(t, uuid.Version(1), u.Version(), "UUID() is version 1")
}

// A plain INSERT of biz_no, event_type and payload writes a WAIT event due at once, as
// InsertEvent does: an event id of its own, the database's UTC time in next_retry_time,
// create_time and update_time whatever the session's time_zone, no lease, no trace
// context, the default topic, the payload byte for byte.
func TestPlainSQLInsertWritesADueEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	payload := []byte("{\"order\":1}\x00\xff'\\")
	seen := map[string]bool{}
	for _, tz := range []string{"SYSTEM", "+09:00", "-05:00"} {
		t.Run(tz, func(t *testing.T) {
			conn, err := b.db.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			_, err = conn.ExecContext(ctx, "SET time_zone = '"+tz+"'")
			require.NoError(t, err)
			_, err = conn.ExecContext(ctx, "SET @before = UTC_TIMESTAMP(3)")
			require.NoError(t, err)
			id := b.plainInsert(t, conn, "ORD-"+tz, "ORDER_CREATED", payload)
			_, err = conn.ExecContext(ctx, "SET @after = UTC_TIMESTAMP(3)")
			require.NoError(t, err)

			// Compared in the session itself: between two readings of the database's UTC
			// clock, and all three columns the same statement's time. CURRENT_TIMESTAMP
			// (the session's zone) would be hours away in the +09:00 and -05:00 sessions.
			var inUTC, same int
			require.NoError(t, conn.QueryRowContext(ctx, "SELECT create_time BETWEEN @before AND @after, "+
				"next_retry_time = create_time AND update_time = create_time FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ?", id).
				Scan(&inUTC, &same))
			assert.Equal(t, 1, inUTC, "create_time is the database's UTC time")
			assert.Equal(t, 1, same, "next_retry_time and update_time are create_time")

			ev := b.get(t, id)
			requireServerEventID(t, ev.EventID)
			assert.False(t, seen[ev.EventID], "a new event id for every row")
			seen[ev.EventID] = true
			assert.Equal(t, "ORD-"+tz, ev.BizNo)
			assert.Equal(t, "ORDER_CREATED", ev.EventType)
			assert.Equal(t, payload, ev.Payload)
			assert.Equal(t, outbox.StatusWait, ev.Status)
			assert.Zero(t, ev.RetryCount)
			assert.Zero(t, ev.ReclaimCount)
			assert.Empty(t, ev.ClaimOwner)
			assert.True(t, ev.ClaimedAt.IsZero(), "nobody holds it")
			assert.Empty(t, ev.LastError)
			assert.Empty(t, ev.TraceParent)
			assert.Empty(t, ev.TraceState)
			assert.Equal(t, "ORDER_EVENT_TOPIC", ev.Topic, "no topic named: read as the store's default, which its claim writes on it")
			assert.Equal(t, ev.CreateTime, ev.NextRetryTime)
		})
	}
}

// Every row gets an event id of its own: several rows of one statement, many rows of one
// transaction, and beside the ids InsertEvent writes. uk_event_id would refuse a repeat.
func TestPlainSQLInsertEventIDsAreUnique(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	goIDs := b.insert(t, 10)
	tbl := "`" + outbox.TableForTest(b.store) + "`"
	_, err := b.db.ExecContext(ctx, "INSERT INTO "+tbl+" (biz_no, event_type, payload) VALUES "+
		"('ORD-A', 'ORDER_CREATED', 'a'), ('ORD-B', 'ORDER_CREATED', 'b'), ('ORD-C', 'ORDER_CREATED', 'c')")
	require.NoError(t, err)
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	for i := range 200 {
		b.plainInsert(t, tx, fmt.Sprintf("ORD-T%d", i), "ORDER_CREATED", []byte("{}"))
	}
	require.NoError(t, tx.Commit())

	ids := b.eventIDs(t)
	require.Len(t, ids, 213)
	byEventID := map[string]int64{}
	for id, eventID := range ids {
		prev, dup := byEventID[eventID]
		require.False(t, dup, "rows %d and %d share event id %s", prev, id, eventID)
		byEventID[eventID] = id
	}
	isGo := map[int64]bool{}
	for _, id := range goIDs {
		isGo[id] = true
	}
	for id, eventID := range ids {
		if isGo[id] {
			u, err := uuid.Parse(eventID)
			require.NoError(t, err)
			assert.Equal(t, uuid.Version(7), u.Version(), "InsertEvent's ids stay UUIDv7")
			continue
		}
		requireServerEventID(t, eventID)
	}
}

// The claims read a plain INSERT's rows as they read InsertEvent's: the batch claim and the
// per-row claim, each event whole; and in key order, a biz no's events in id order whoever
// wrote each one.
func TestPlainSQLInsertsAreClaimed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	check := func(t *testing.T, b *bundle, evs []outbox.Event, want []int64) {
		t.Helper()
		require.Equal(t, want, idsOf(evs))
		ids := b.eventIDs(t)
		for _, ev := range evs {
			row := b.get(t, ev.ID)
			assert.Equal(t, ids[ev.ID], ev.EventID, "event %d carries its row's event id", ev.ID)
			assert.Equal(t, row.BizNo, ev.BizNo)
			assert.Equal(t, row.EventType, ev.EventType)
			assert.Equal(t, row.Payload, ev.Payload)
			assert.Equal(t, row.CreateTime, ev.CreateTime)
			assert.Zero(t, ev.RetryCount)
			assert.Empty(t, ev.TraceParent)
		}
	}
	// Written in turn by a Go service and by plain SQL, one transaction each.
	write := func(t *testing.T, b *bundle, key string) []int64 {
		var ids []int64
		for i := range 4 {
			if i%2 == 0 {
				ids = append(ids, b.insertPayload(t, key, fmt.Appendf(nil, `{"go":%d}`, i)))
			} else {
				ids = append(ids, b.plainInsert(t, b.db, key, "ORDER_PAID", fmt.Appendf(nil, `{"sql":%d}`, i)))
			}
		}
		return ids
	}

	t.Run("batch", func(t *testing.T) {
		b := setup(t)
		want := write(t, b, "ORD-1")
		evs, more, err := claimDue(ctx, b.store, "batch", 10, 1<<20)
		require.NoError(t, err)
		assert.False(t, more)
		slices.SortFunc(evs, byRowID)
		check(t, b, evs, want)
		assert.Equal(t, 4, b.countStatus(t, outbox.StatusSending))
	})
	t.Run("per-row", func(t *testing.T) {
		b := setup(t)
		want := write(t, b, "ORD-1")
		evs, err := b.store.Candidates(ctx, 10)
		require.NoError(t, err)
		slices.SortFunc(evs, byRowID)
		check(t, b, evs, want)
		for _, ev := range evs {
			won, err := b.store.Claim(ctx, ev, "per-row")
			require.NoError(t, err)
			assert.True(t, won, "event %d", ev.ID)
		}
	})
	t.Run("key order", func(t *testing.T) {
		b := orderedSetup(t)
		want := write(t, b, "ORD-K")
		res := orderedClaim(t, b.store, "ordered", outbox.KeyOrder, 10)
		check(t, b, res.Events, want)

		// Per row: a claim of a later event loses while an earlier one of its key is open,
		// whoever wrote either; in id order, each is claimed once the one before is done.
		o := orderedSetup(t)
		want = write(t, o, "ORD-K")
		evs, err := o.store.Candidates(ctx, 10)
		require.NoError(t, err)
		slices.SortFunc(evs, byRowID)
		check(t, o, evs, want)
		won, err := o.store.Claim(ctx, evs[1], "ordered")
		require.NoError(t, err)
		assert.False(t, won, "the plain INSERT's event waits for the one before it")
		for _, ev := range evs {
			won, err := o.store.Claim(ctx, ev, "ordered")
			require.NoError(t, err)
			require.True(t, won, "event %d", ev.ID)
			n, err := o.store.MarkSuccess(ctx, []int64{ev.ID}, "ordered")
			require.NoError(t, err)
			require.Equal(t, int64(1), n)
		}
	})
}

// byRowID orders events by row id: the claims return them oldest first by due time, and
// rows of one millisecond may come in either order.
func byRowID(a, b outbox.Event) int { return cmp.Compare(a.ID, b.ID) }

// A plain INSERT wakes no publisher (only a commit through the store does): its event is
// sent by the next round, at the poll, to a real broker, with the database's event id as
// eventId; a Go service's commit on the same store wakes the publishers for its own event.
func TestPlainSQLInsertIsSentAtTheNextPoll(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	topic := testsvc.NewTopic(t, "OUTBOX_PLAIN")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	logs := &logSink{}
	cfg := fastConfig("plain-poll", logs)
	cfg.PollInterval = time.Second
	hooked, rounds := signalRounds(b.store)
	p := newPublisher(t, hooked, newFastRocketMQSender(t), cfg)
	wake, unsubscribe := b.store.Subscribe()
	defer unsubscribe()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() {
		require.NoError(t, p.Close())
		require.NoError(t, <-done)
	}()
	select {
	case <-rounds: // the first round, with nothing due
	case <-time.After(30 * time.Second):
		t.Fatal("no round began")
	}

	id := b.plainInsert(t, b.db, "ORD-SQL", "ORDER_CREATED", []byte(`{"order":"ORD-SQL"}`))
	select {
	case <-wake:
		t.Fatal("a plain INSERT woke the publishers")
	default:
	}
	consumer.WaitDistinct(t, 1, 60*time.Second)
	ev := b.get(t, id)
	requireServerEventID(t, ev.EventID)
	msgs := consumer.Messages()
	require.NotEmpty(t, msgs)
	m := msgs[0]
	assert.Equal(t, ev.EventID, m.GetProperty("eventId"), "consumers see the database's event id")
	assert.Equal(t, "ORD-SQL", m.GetProperty("bizNo"))
	assert.Equal(t, "ORD-SQL", m.GetKeys())
	assert.Equal(t, "ORDER_CREATED", m.GetTags())
	assert.Equal(t, []byte(`{"order":"ORD-SQL"}`), m.Body)
	require.Eventually(t, func() bool { return b.get(t, id).Status == outbox.StatusSuccess }, 10*time.Second, 20*time.Millisecond)
	var waited int64
	require.NoError(t, b.db.QueryRow("SELECT TIMESTAMPDIFF(MICROSECOND, create_time, claimed_at) FROM `"+
		outbox.TableForTest(b.store)+"` WHERE id = ?", id).Scan(&waited))
	t.Logf("claimed %v after its insert, at a poll (PollInterval %v, %s claims)", time.Duration(waited)*time.Microsecond,
		cfg.PollInterval, claimModeName())

	// The Go service's own commit signals the publishers of its store.
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-GO", EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	select {
	case <-wake:
	default:
		t.Fatal("Tx.Commit woke no publisher")
	}
	consumer.WaitDistinct(t, 2, 60*time.Second)
	assert.Empty(t, logs.atLeast(slog.LevelWarn))
}

// A plain INSERT in a transaction that commits long after the insert is due from the
// insert's time, which may be behind the floor of the steady claims that ran meanwhile:
// nothing tells this process of it, so it waits for the next claim that reads from the
// start (at least every 250 ms while claims run, and the first claim after a pause of that
// long), and is claimed then.
func TestPlainSQLInsertCommittedLateIsClaimed(t *testing.T) {
	t.Parallel()
	b := steadyBundle(t)
	ctx := context.Background()
	tx, err := b.db.BeginTx(ctx, nil)
	require.NoError(t, err)
	late := b.plainInsert(t, tx, "ORD-LATE", "ORDER_CREATED", []byte("{}"))
	time.Sleep(100 * time.Millisecond)
	other := b.insert(t, 1)
	ids, _ := claimIDs(t, b.store, 10)
	require.Equal(t, other, ids)
	require.NoError(t, tx.Commit())
	ids, _ = claimIDs(t, b.store, 10)
	assert.Empty(t, ids, "behind the floor, and nobody said")

	outbox.SetFullScanEveryForTest(b.store, 200*time.Millisecond)
	require.Eventually(t, func() bool {
		ids, _ = claimIDs(t, b.store, 10)
		return len(ids) > 0
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, []int64{late}, ids)
}

// Bad input is the server's to refuse: in strict mode (the default sql_mode of both
// servers) an INSERT without payload fails with 1364 and a biz no over 64 characters with
// 1406, and nothing is written. Without strict mode the server writes an empty payload and
// a truncated biz no instead, with warnings; the publisher dead-letters the empty payload
// at its first try (RocketMQ takes no message without a body), and sends the truncated
// biz no as it is.
func TestPlainSQLInsertBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tbl := "`" + outbox.TableForTest(b.store) + "`"
	long := strings.Repeat("B", 65)

	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "SET SESSION sql_mode = 'STRICT_TRANS_TABLES'")
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "INSERT INTO "+tbl+" (biz_no, event_type) VALUES ('ORD-1', 'ORDER_CREATED')")
	requireMySQLError(t, err, 1364, "Field 'payload' doesn't have a default value")
	_, err = conn.ExecContext(ctx, "INSERT INTO "+tbl+" (event_type, payload) VALUES ('ORDER_CREATED', '{}')")
	requireMySQLError(t, err, 1364, "Field 'biz_no' doesn't have a default value")
	_, err = conn.ExecContext(ctx, b.plainInsertSQL(t), nil, "ORDER_CREATED", []byte("{}"))
	requireMySQLError(t, err, 1048, "Column 'biz_no' cannot be null")
	_, err = conn.ExecContext(ctx, b.plainInsertSQL(t), long, "ORDER_CREATED", []byte("{}"))
	requireMySQLError(t, err, 1406, "Data too long for column 'biz_no'")
	assert.Empty(t, b.eventIDs(t), "nothing written")

	_, err = conn.ExecContext(ctx, "SET SESSION sql_mode = ''")
	require.NoError(t, err)
	empty := b.plainInsertVia(t, conn, "INSERT INTO "+tbl+" (biz_no, event_type) VALUES ('ORD-1', 'ORDER_CREATED')")
	assert.Equal(t, []string{"1364"}, warningCodes(t, conn))
	truncated := b.plainInsertVia(t, conn, "INSERT INTO "+tbl+" (biz_no, event_type, payload) VALUES ('"+long+"', 'ORDER_CREATED', '{}')")
	assert.Equal(t, []string{"1265"}, warningCodes(t, conn))
	assert.Empty(t, b.get(t, empty).Payload)
	assert.Equal(t, long[:64], b.get(t, truncated).BizNo)

	topic := testsvc.NewTopic(t, "OUTBOX_PLAIN_BAD")
	b.routeTo(topic)
	consumer := testsvc.Consume(t, topic)
	p := newPublisher(t, b.store, newFastRocketMQSender(t), fastConfig("plain-bad", &logSink{}))
	stats, err := p.PublishPending(ctx)
	require.NoError(t, err)
	assert.Equal(t, 1, stats.DeadLettered)
	assert.Equal(t, 1, stats.Sent)
	ev := b.get(t, empty)
	assert.Equal(t, outbox.StatusFail, ev.Status)
	assert.Contains(t, ev.LastError, "payload is empty")
	consumer.WaitDistinct(t, 1, 60*time.Second)
	assert.Equal(t, long[:64], consumer.Messages()[0].GetProperty("bizNo"))
}

// plainInsertVia runs an INSERT of one row on conn and returns its id.
func (b *bundle) plainInsertVia(t testing.TB, conn *sql.Conn, query string) int64 {
	t.Helper()
	res, err := conn.ExecContext(context.Background(), query)
	require.NoError(t, err)
	id, err := res.LastInsertId()
	require.NoError(t, err)
	return id
}

// warningCodes returns the codes of SHOW WARNINGS on conn.
func warningCodes(t testing.TB, conn *sql.Conn) []string {
	t.Helper()
	rows, err := conn.QueryContext(context.Background(), "SHOW WARNINGS")
	require.NoError(t, err)
	defer rows.Close()
	var codes []string
	for rows.Next() {
		var level, code, msg string
		require.NoError(t, rows.Scan(&level, &code, &msg))
		codes = append(codes, code)
	}
	require.NoError(t, rows.Err())
	return codes
}

func requireMySQLError(t testing.TB, err error, number uint16, msg string) {
	t.Helper()
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me), "want error %d, got %v", number, err)
	assert.Equal(t, number, me.Number)
	assert.Contains(t, me.Message, msg)
}

// A table made by an earlier version has no defaults for the columns a plain INSERT leaves
// out: the INSERT fails naming the first (1364), InsertEvent works all the same, and the
// publisher warns at Run, naming them and docs/upgrading.md. That page's ALTER TABLE adds
// them: the plain INSERT then works, and the warning is gone.
func TestPlainSQLInsertOnAnOlderTableNeedsTheUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tbl := outbox.TableForTest(b.store)
	// The columns as schema.sql defined them before the defaults.
	b.exec(t, `ALTER TABLE {t}
	MODIFY event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
	MODIFY next_retry_time DATETIME(3) NOT NULL,
	MODIFY create_time DATETIME(3) NOT NULL,
	MODIFY update_time DATETIME(3) NOT NULL`)
	_, err := b.db.ExecContext(ctx, b.plainInsertSQL(t), "ORD-1", "ORDER_CREATED", []byte("{}"))
	requireMySQLError(t, err, 1364, "Field 'event_id' doesn't have a default value")
	require.NoError(t, b.store.CreateSchema(ctx), "the table serves the store as it is")
	goID := b.insert(t, 1)[0]
	u, err := uuid.Parse(b.get(t, goID).EventID)
	require.NoError(t, err)
	assert.Equal(t, uuid.Version(7), u.Version(), "InsertEvent needs no default")

	runOnce := func() *logSink {
		logs := &logSink{}
		p := newPublisher(t, b.store, newRecorder(), fastConfig("upgrade", logs))
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		require.Eventually(t, func() bool { return logs.count(slog.LevelInfo, "outbox publisher started") == 1 },
			30*time.Second, 10*time.Millisecond)
		require.NoError(t, p.Close())
		require.NoError(t, <-done)
		return logs
	}
	logs := runOnce()
	require.Equal(t, 1, logs.count(slog.LevelWarn,
		"no server-side default for event_id, next_retry_time, create_time, update_time"), "%v", logs.atLeast(slog.LevelWarn))
	assert.Equal(t, 1, logs.count(slog.LevelWarn, "docs/upgrading.md"))

	alter := strings.TrimSuffix(strings.TrimSpace(docSQL(t, "upgrading.md", "## Adding the defaults for other writers")), ";")
	b.exec(t, strings.ReplaceAll(alter, "t_event_record", "`"+tbl+"`"))
	id := b.plainInsert(t, b.db, "ORD-2", "ORDER_CREATED", []byte("{}"))
	ev := b.get(t, id)
	requireServerEventID(t, ev.EventID)
	assert.Equal(t, outbox.StatusWait, ev.Status)
	assert.InDelta(t, 0, b.secondsFromNow(t, id, "create_time"), 60, "the database's UTC time")
	assert.Equal(t, ev.CreateTime, ev.NextRetryTime)
	assert.Equal(t, ev.CreateTime, ev.UpdateTime)
	assert.Zero(t, runOnce().count(slog.LevelWarn, "server-side default"), "no warning once the defaults are there")

	// The upgraded table is the one CreateSchema makes: the same defaults.
	fresh := testsvc.NewStore(t, b.db, outbox.MySQLConfig{})
	assert.Equal(t, columnDefaults(t, b.db, outbox.TableForTest(fresh)), columnDefaults(t, b.db, tbl))
}

// columnDefaults returns every column's default as information_schema shows it.
func columnDefaults(t testing.TB, db *sql.DB, table string) map[string]string {
	t.Helper()
	rows, err := db.Query(`SELECT column_name, COALESCE(column_default, '(none)') FROM information_schema.columns
	WHERE table_schema = DATABASE() AND table_name = ?`, table)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, def string
		require.NoError(t, rows.Scan(&name, &def))
		out[strings.ToLower(name)] = def
	}
	require.NoError(t, rows.Err())
	require.NotEmpty(t, out, "table %s has columns", table)
	return out
}

// docs/other-writers.md's stored procedure writes the event in the caller's transaction and
// hands back its event id: rolled back, it leaves nothing; committed, the event waits.
func TestPlainSQLInsertStoredProcedure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	proc := testsvc.UniqueTable("outbox_insert_event")
	text := docSQL(t, "other-writers.md", "## A stored procedure")
	var body []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "DELIMITER") {
			body = append(body, line)
		}
	}
	create := strings.TrimSuffix(strings.TrimSpace(strings.Join(body, "\n")), "//")
	require.Contains(t, create, "CREATE PROCEDURE outbox_insert_event(")
	create = strings.ReplaceAll(create, "outbox_insert_event", "`"+proc+"`")
	create = regexp.MustCompile(`\bt_event_record\b`).ReplaceAllString(create, "`"+outbox.TableForTest(b.store)+"`")
	b.exec(t, create)
	t.Cleanup(func() { b.exec(t, "DROP PROCEDURE IF EXISTS `"+proc+"`") })

	call := func(commit bool) string {
		tx, err := b.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, "CALL `"+proc+"`(?, ?, ?, @event_id)", "ORD-P", "ORDER_CREATED", []byte(`{"p":1}`))
		require.NoError(t, err)
		var eventID string
		require.NoError(t, tx.QueryRowContext(ctx, "SELECT @event_id").Scan(&eventID))
		if commit {
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
		}
		return eventID
	}
	call(false)
	assert.Empty(t, b.eventIDs(t), "rolled back with the caller's transaction")
	eventID := call(true)
	requireServerEventID(t, eventID)
	ids := b.eventIDs(t)
	require.Len(t, ids, 1)
	for id, got := range ids {
		assert.Equal(t, eventID, got)
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, ev.Status)
		assert.Equal(t, []byte(`{"p":1}`), ev.Payload)
	}
}

// A plain INSERT may name the event's topic. The server checks only the column's width: a
// topic outside MySQLConfig.Routes.Topics, or one that is no RocketMQ topic name, is written and
// claimed as it is, for the sender to refuse; a topic over 127 characters is refused by
// the server in strict mode (1406).
func TestPlainSQLInsertNamesATopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := topicSetup(t, outbox.MySQLConfig{}, "orders")
	insert := func(topic string) (int64, error) {
		res, err := b.db.ExecContext(ctx, "INSERT INTO `"+outbox.TableForTest(b.store)+"` (biz_no, event_type, payload, topic) VALUES (?, ?, ?, ?)",
			"ORD-1", "ORDER_CREATED", []byte(`{}`), topic)
		if err != nil {
			return 0, err
		}
		return res.LastInsertId()
	}
	want := map[int64]string{}
	for _, topic := range []string{"orders", "ordres", "not.a.topic"} {
		id, err := insert(topic)
		require.NoError(t, err, "the server does not know the store's topics")
		want[id] = topic
	}
	_, err := insert(strings.Repeat("t", 128))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1406")

	evs, _, err := claimDue(ctx, b.store, "a", 10, 1<<20)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	for _, ev := range evs {
		assert.Equal(t, want[ev.ID], ev.Topic, "claimed with the topic as written")
	}
}
