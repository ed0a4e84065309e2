package main

import (
	"context"
	"database/sql"
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// testOptions runs the example on an outbox table, a topic and a consumer group of its own,
// so that it can run beside other tests on the shared services. The example's other tables
// are shared; every run's orders have a prefix of their own.
func testOptions(t *testing.T, out io.Writer) options {
	t.Helper()
	db := testsvc.OpenDB(t) // skips, or fails in CI, without a database
	o := options{
		dsn:       testsvc.MySQLDSN(t),
		namesrv:   testsvc.RocketMQNameServer(t),
		topic:     testsvc.NewTopic(t, "ORDER_EVENT"),
		table:     testsvc.UniqueTable("example_event"),
		group:     testsvc.UniqueTable("points"),
		orders:    200,
		instances: 2,
		duplicate: 3,
		timeout:   3 * time.Minute,
		out:       out,
	}
	t.Cleanup(func() {
		for _, q := range []string{"DROP TABLE IF EXISTS `" + o.table + "`", "DELETE FROM example_rejected_message WHERE topic = '" + o.topic + "'"} {
			if _, err := db.Exec(q); err != nil {
				t.Errorf("clean up: %s: %v", q, err)
			}
		}
	})
	return o
}

// forget deletes a run's rows from the example's shared tables when t ends.
func forget(t *testing.T, db *sql.DB, prefix string, eventIDs map[int64]string) {
	t.Cleanup(func() {
		for _, table := range []string{"example_orders", "example_user_points"} {
			if _, err := db.Exec("DELETE FROM "+table+" WHERE order_no LIKE ?", prefix+"%"); err != nil {
				t.Errorf("clean up %s: %v", table, err)
			}
		}
		for _, eventID := range eventIDs {
			if _, err := db.Exec("DELETE FROM example_consumed_message WHERE msg_id = ?", eventID); err != nil {
				t.Errorf("clean up example_consumed_message: %v", err)
			}
		}
	})
}

// consumed counts the event ids the points service has recorded as processed.
func consumed(t *testing.T, db *sql.DB, ids map[int64]string) int {
	t.Helper()
	n := 0
	for _, eventID := range ids {
		var c int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM example_consumed_message WHERE msg_id = ?", eventID).Scan(&c))
		n += c
	}
	return n
}

// The example twice, with the outbox table dropped and created again between the runs while
// the points service keeps its record of consumed messages, as when a table is reset or
// restored from an empty backup. The second run's rows have the first run's row ids again;
// their event ids are new, so the points service awards every order: lost 0, and the only
// deliveries it suppresses are the second ones of the events it really had.
func TestRecreatedOutboxTableDropsNothing(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	o := testOptions(t, &out)
	db := testsvc.OpenDB(t)
	ctx := context.Background()

	first, err := run(ctx, o)
	t.Logf("first run:\n%s", out.String())
	require.NoError(t, err)
	require.Zero(t, first.lost())
	firstIDs := testsvc.EventIDs(t, db, o.table)
	forget(t, db, first.prefix, firstIDs)
	require.Len(t, firstIDs, o.orders)
	require.Equal(t, o.orders, consumed(t, db, firstIDs), "the points service recorded every event of the first run")

	_, err = db.Exec("DROP TABLE `" + o.table + "`")
	require.NoError(t, err)
	out.Reset()
	second, err := run(ctx, o)
	t.Logf("second run, on the recreated table:\n%s", out.String())
	require.NoError(t, err)

	secondIDs := testsvc.EventIDs(t, db, o.table)
	forget(t, db, second.prefix, secondIDs)
	assert.Equal(t, slices.Sorted(maps.Keys(firstIDs)), slices.Sorted(maps.Keys(secondIDs)),
		"the recreated table gives its rows the first run's row ids again")
	for id, eventID := range secondIDs {
		assert.NotEqual(t, firstIDs[id], eventID, "row %d has its predecessor's event id", id)
	}
	assert.Equal(t, o.orders, consumed(t, db, firstIDs), "the first run's records were kept")
	assert.Zero(t, second.lost(), "every order of the second run got its points")
	assert.Equal(t, o.orders, second.awarded)
	assert.Equal(t, o.orders, second.published)
	assert.Equal(t, second.consumed-int64(o.orders), second.duplicates,
		"every suppressed delivery was a second delivery of an event that was awarded")
	assert.GreaterOrEqual(t, second.duplicates, second.lostAcks, "every resend was suppressed")
	assert.Equal(t, int64(o.duplicate), second.lostAcks)
	assert.Equal(t, o.orders, second.traced, "every order's trace ran from the order API to the points service")
	assert.Equal(t, o.orders, second.linkedSends, "every order's trace is linked from a send span")
	assert.Equal(t, o.orders, first.traced)
}

// A message the points service can never process, one whose body is not JSON and one
// without an eventId, sent straight to the topic, is recorded once with its reason and
// acknowledged: never handed back to RocketMQ to be redelivered. A good message after them
// is still processed.
func TestPoisonMessageIsRecordedAndSkipped(t *testing.T) {
	t.Parallel()
	o := testOptions(t, io.Discard)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db, err := openDB(o.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() }) // after forget's clean-up
	_, err = prepareTables(ctx, db, o)
	require.NoError(t, err)
	prefix := testsvc.UniqueTable("ORD-poison") + "-"
	good := uuid.Must(uuid.NewV7()).String()
	forget(t, db, prefix, map[int64]string{0: good})
	points, err := startPointsService(ctx, db, o, testsvc.UniqueTable("points"), prefix, noop.NewTracerProvider())
	require.NoError(t, err)
	defer points.shutdown()

	addrs, err := primitive.NewNamesrvAddr(o.namesrv)
	require.NoError(t, err)
	prod, err := rocketmq.NewProducer(producer.WithNameServer(addrs),
		producer.WithGroupName(testsvc.UniqueTable("pg")), producer.WithInstanceName(testsvc.UniqueTable("poison")))
	require.NoError(t, err)
	require.NoError(t, prod.Start())
	defer func() { _ = prod.Shutdown() }()
	send := func(body string, eventID string) {
		t.Helper()
		m := primitive.NewMessage(o.topic, []byte(body))
		m.WithTag("ORDER_CREATED")
		m.WithProperty(outbox.PropertyBizNo, prefix+"1")
		if eventID != "" {
			m.WithProperty(outbox.PropertyEventID, eventID)
		}
		res, err := prod.SendSync(ctx, m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
	}
	notJSON := uuid.Must(uuid.NewV7()).String()
	send("{not json", notJSON)
	send(`{"orderNo":"`+prefix+`2","userId":1,"amount":100}`, "")
	send(`{"orderNo":"`+prefix+`3","userId":7,"amount":500}`, good)

	type rejected struct {
		key, reason string
		deliveries  int
	}
	var got []rejected
	require.Eventually(t, func() bool {
		got = nil
		rows, err := db.QueryContext(ctx, "SELECT msg_key, reason, deliveries FROM example_rejected_message WHERE topic = ? ORDER BY reason", o.topic)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var r rejected
			require.NoError(t, rows.Scan(&r.key, &r.reason, &r.deliveries))
			got = append(got, r)
		}
		require.NoError(t, rows.Err())
		var awarded int
		require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM example_user_points WHERE order_no = ?", prefix+"3").Scan(&awarded))
		return len(got) == 2 && awarded == 1
	}, 2*time.Minute, 100*time.Millisecond, "both poison messages recorded, the good one awarded")

	assert.Equal(t, notJSON, got[0].key, "recorded under its eventId")
	assert.Contains(t, got[0].reason, "not an ORDER_CREATED payload")
	assert.True(t, strings.HasPrefix(got[1].key, "msgId:"), "without an eventId, recorded under the broker's message id: %s", got[1].key)
	assert.Contains(t, got[1].reason, "no eventId")
	for _, r := range got {
		assert.Equal(t, 1, r.deliveries, "%s was delivered once", r.key)
	}
	assert.Zero(t, points.retries.Load(), "nothing was handed back to RocketMQ for redelivery")
	assert.Equal(t, int64(2), points.rejected.Load())
	assert.Equal(t, 1, consumed(t, db, map[int64]string{0: good}), "the good message was processed")
}

// An outbox table left by an older version of the example, without event_id: recreated when
// all its events were sent, refused (and left as it is) while some are still unsent.
func TestOutdatedOutboxTable(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	ctx := context.Background()
	var out strings.Builder
	o := options{dsn: testsvc.MySQLDSN(t), table: testsvc.UniqueTable("example_event"), out: &out}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + o.table + "`") })
	exampleDB, err := openDB(o.dsn)
	require.NoError(t, err)
	defer exampleDB.Close()
	outdated := func(status string) {
		t.Helper()
		_, err := db.Exec("DROP TABLE IF EXISTS `" + o.table + "`")
		require.NoError(t, err)
		store, err := prepareTables(ctx, exampleDB, o)
		require.NoError(t, err)
		tx, err := store.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-old", EventType: "ORDER_CREATED"})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		for _, q := range []string{"UPDATE `" + o.table + "` SET status = '" + status + "'",
			"ALTER TABLE `" + o.table + "` DROP INDEX uk_event_id, DROP COLUMN event_id"} {
			_, err := db.Exec(q)
			require.NoError(t, err)
		}
	}

	outdated("WAIT")
	_, err = prepareTables(ctx, exampleDB, o)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "1 unsent events")
	assert.Contains(t, err.Error(), "Upgrading")
	var rows int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+o.table+"`").Scan(&rows))
	assert.Equal(t, 1, rows, "the unsent event is left where it was")

	outdated("SUCCESS")
	out.Reset()
	_, err = prepareTables(ctx, exampleDB, o)
	require.NoError(t, err)
	assert.Contains(t, out.String(), "dropped and created again")
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM `"+o.table+"`").Scan(&rows))
	assert.Zero(t, rows)
	var columns int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() "+
		"AND table_name = ? AND column_name = 'event_id'", o.table).Scan(&columns))
	assert.Equal(t, 1, columns, "the new table has event_id")
}
