package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// testOptions runs the example on an outbox table, a topic and a consumer group of its own,
// so that it can run beside other tests on the shared services. The example's other tables
// are shared, the inbox's too (each group's rows its own); every run's orders have a prefix
// of their own.
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
		for _, q := range []string{"DROP TABLE IF EXISTS `" + o.table + "`",
			"DELETE FROM t_inbox WHERE consumer_group = '" + o.group + "'",
			"DELETE FROM t_inbox_rejected WHERE consumer_group = '" + o.group + "'"} {
			var me *mysql.MySQLError
			if _, err := db.Exec(q); err != nil && !(errors.As(err, &me) && me.Number == errNoSuchTable) {
				t.Errorf("clean up: %s: %v", q, err)
			}
		}
	})
	return o
}

const errNoSuchTable = 1146

// forget deletes a run's rows from the example's shared tables when t ends (testOptions
// deletes the inbox's rows of the test's group).
func forget(t *testing.T, db *sql.DB, prefix string) {
	t.Cleanup(func() {
		for _, table := range []string{"example_orders", "example_user_points", "example_order_status", "example_out_of_order"} {
			if _, err := db.Exec("DELETE FROM "+table+" WHERE order_no LIKE ?", prefix+"%"); err != nil {
				t.Errorf("clean up %s: %v", table, err)
			}
		}
	})
}

// consumed counts the event ids the inbox has recorded as handled in group.
func consumed(t *testing.T, db *sql.DB, group string, ids map[int64]string) int {
	t.Helper()
	n := 0
	for _, eventID := range ids {
		var c int
		require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM t_inbox WHERE consumer_group = ? AND event_id = ?", group, eventID).Scan(&c))
		n += c
	}
	return n
}

// The example twice, with the outbox table dropped and created again between the runs while
// the points service keeps its inbox, as when a table is reset or
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
	forget(t, db, first.prefix)
	require.Len(t, firstIDs, o.orders)
	require.Equal(t, o.orders, consumed(t, db, o.group, firstIDs), "the inbox recorded every event of the first run")

	_, err = db.Exec("DROP TABLE `" + o.table + "`")
	require.NoError(t, err)
	out.Reset()
	second, err := run(ctx, o)
	t.Logf("second run, on the recreated table:\n%s", out.String())
	require.NoError(t, err)

	secondIDs := testsvc.EventIDs(t, db, o.table)
	forget(t, db, second.prefix)
	assert.Equal(t, slices.Sorted(maps.Keys(firstIDs)), slices.Sorted(maps.Keys(secondIDs)),
		"the recreated table gives its rows the first run's row ids again")
	for id, eventID := range secondIDs {
		assert.NotEqual(t, firstIDs[id], eventID, "row %d has its predecessor's event id", id)
	}
	assert.Equal(t, o.orders, consumed(t, db, o.group, firstIDs), "the first run's records were kept")
	assert.Equal(t, o.orders, consumed(t, db, o.group, secondIDs), "the inbox recorded every event of the second run")
	assert.Zero(t, second.lost(), "every order of the second run got its points")
	assert.Equal(t, o.orders, second.awarded)
	assert.Equal(t, o.orders, second.published)
	assert.Equal(t, second.consumed-o.orders, second.duplicates,
		"every suppressed delivery was a second delivery of an event that was awarded")
	assert.GreaterOrEqual(t, int64(second.duplicates), second.lostAcks, "every resend was suppressed")
	assert.Zero(t, second.rejected)
	assert.Equal(t, int64(o.duplicate), second.lostAcks)
	assert.Equal(t, o.orders, second.requests, "a trace per order API request")
	assert.Equal(t, o.orders, second.traced, "every request's trace ran from the order API to the points service")
	assert.Equal(t, o.orders, second.linkedSends, "every request's trace is linked from a send span")
	assert.Equal(t, o.orders, first.traced)
	assert.Equal(t, o.orders, first.linkedSends)
}

// The example with -ordered: each order's life (created, paid a few requests later, one in
// five cancelled after that), every change committed with its event, published by three
// instances in key order (one of them losing acknowledgements, so that some events are sent
// twice), and consumed orderly. No event arrives out of its order's life, every order ends
// in the status the order API left it in, and what held before holds: every order is
// awarded its points once, the inbox records every event once by its eventId, and every
// suppressed delivery is a second one.
//
// The example runs as a program of its own, as a user runs it, built without the race
// detector: the RocketMQ client's orderly consumer races itself (consumer/process_queue.go:
// takeMessages reads the message cache's size without the lock putMessage writes it under;
// apache/rocketmq-client-go#1213, unfixed at the version in go.mod), which -race reports in
// any process that runs one.
func TestOrderedLivesArriveInOrder(t *testing.T) {
	t.Parallel()
	o := testOptions(t, io.Discard)
	sum, events := runOrdered(t, testsvc.OpenDB(t), o)
	assert.Equal(t, events, sum["linked by a send"], "every request's trace is linked from a send span")
}

// runOrdered runs the example with -ordered (and args) as a program of its own, 200 orders
// published by three instances, the first losing 5 acknowledgements, and checks what every
// ordered run must show: nothing out of order, every order in its final status, every order
// awarded once, every event recorded by the inbox once, every duplicate a resend. It returns
// the summary and the number of events the order API wrote.
func runOrdered(t *testing.T, db *sql.DB, o options, args ...string) (sum map[string]int, events int) {
	t.Helper()
	const orders, duplicate = 200, 5
	bin := buildExample(t)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"-ordered", "-dsn", o.dsn, "-namesrv", o.namesrv, "-topic", o.topic,
		"-table", o.table, "-group", o.group, "-orders", strconv.Itoa(orders), "-instances", "3",
		"-duplicate", strconv.Itoa(duplicate), "-timeout", "3m"}, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("go -C examples run ./order-service %s:\n%s", strings.Join(cmd.Args[1:], " "), stdout.String())
	ids := testsvc.EventIDs(t, db, o.table)
	var prefix string
	if len(ids) > 0 {
		require.NoError(t, db.QueryRow("SELECT biz_no FROM `"+o.table+"` LIMIT 1").Scan(&prefix))
		prefix = strings.TrimRight(prefix, "0123456789")
		forget(t, db, prefix)
	}
	require.NoError(t, err, "stderr:\n%s", stderr.String())
	sum = parseSummary(t, stdout.String())

	cancelledOrders := 0
	for i := range orders {
		if cancelled(i) {
			cancelledOrders++
		}
	}
	events = 2*orders + cancelledOrders
	require.Positive(t, cancelledOrders)
	assert.Equal(t, orders, sum["orders created"])
	assert.Equal(t, orders, sum["orders paid"])
	assert.Equal(t, cancelledOrders, sum["orders cancelled"])
	assert.Len(t, ids, events, "one outbox row per event")
	assert.Equal(t, events, sum["events published"])

	assert.Zero(t, sum["out of order"], "events that arrived out of their order's life")
	var recorded int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM example_out_of_order WHERE order_no LIKE ?", prefix+"%").Scan(&recorded))
	assert.Zero(t, recorded)
	statuses := map[string]string{}
	rows, err := db.Query("SELECT order_no, status FROM example_order_status WHERE order_no LIKE ?", prefix+"%")
	require.NoError(t, err)
	for rows.Next() {
		var orderNo, status string
		require.NoError(t, rows.Scan(&orderNo, &status))
		statuses[orderNo] = status
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	assert.Len(t, statuses, orders)
	for i := range orders {
		orderNo := fmt.Sprintf("%s%d", prefix, i)
		assert.Equal(t, finalStatus(i), statuses[orderNo], "order %s's final status", orderNo)
	}
	assert.Zero(t, sum["wrong final status"])

	assert.Zero(t, sum["lost"], "every order got its points")
	assert.Equal(t, orders, sum["points awarded"])
	assert.Equal(t, events, consumed(t, db, o.group, ids), "the inbox recorded every event, by its eventId")
	assert.Equal(t, duplicate, sum["acks lost on purpose"])
	assert.GreaterOrEqual(t, sum["duplicates suppressed"], sum["acks lost on purpose"], "every resend was suppressed")
	assert.Equal(t, sum["messages consumed"]-events, sum["duplicates suppressed"],
		"every suppressed delivery was a second delivery of an event that was processed")
	assert.Zero(t, sum["messages rejected"])
	assert.Equal(t, events, sum["request traces"], "a trace per order API request")
	assert.Equal(t, events, sum["continued by consumer"], "every request's trace reached the points service")
	return sum, events
}

// binlogArgs start a private MariaDB server with the binary log a relay needs: on, in row
// format with full row metadata, synced at each commit.
var binlogArgs = []string{"--log-bin", "--binlog-format=ROW", "--binlog-row-metadata=FULL", "--sync-binlog=1", "--server-id=7"}

// relayOptions runs the example with -relay on srv, a private server (every table its own),
// and on a topic and a consumer group of its own.
func relayOptions(t *testing.T, srv *testsvc.MySQLServer, out io.Writer) options {
	t.Helper()
	return options{
		dsn:       srv.DSN(),
		namesrv:   testsvc.RocketMQNameServer(t),
		topic:     testsvc.NewTopic(t, "ORDER_EVENT"),
		table:     testsvc.UniqueTable("example_event"),
		group:     testsvc.UniqueTable("points"),
		orders:    200,
		instances: 3,
		duplicate: 3,
		relay:     true,
		timeout:   3 * time.Minute,
		out:       out,
	}
}

// senders counts a table's rows by claim_owner.
func senders(t *testing.T, db *sql.DB, table string) map[string]int {
	t.Helper()
	rows, err := db.Query("SELECT claim_owner, COUNT(*) FROM `" + table + "` GROUP BY claim_owner")
	require.NoError(t, err)
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var owner string
		var n int
		require.NoError(t, rows.Scan(&owner, &n))
		got[owner] = n
	}
	require.NoError(t, rows.Err())
	return got
}

// checkRelayed checks that one relay sent all n events of table, the first instance's, and
// that it handed the table back to the publishers when it stopped.
func checkRelayed(t *testing.T, db *sql.DB, table string, n int) {
	t.Helper()
	owners := senders(t, db, table)
	require.Len(t, owners, 1, "one sender marked every row: %v", owners)
	for owner, count := range owners {
		assert.True(t, strings.HasPrefix(owner, "relay-0-"), "the first instance's relay sent them, not %q", owner)
		assert.Equal(t, n, count)
	}
	var mode string
	require.NoError(t, db.QueryRow("SELECT mode FROM "+relayTable+" WHERE outbox_table = ?", table).Scan(&mode))
	assert.Equal(t, "polling", mode, "the leader handed the table back to the publishers as it stopped")
}

// The example with -relay, on a private MariaDB with the binlog on, each of its three
// instances running a relay beside its publisher: the first instance's relay leads and
// sends every event, reading them from the binlog as the order API commits them; the other
// relays and every publisher stand by (no row is marked by a publisher). The first
// instance's sender loses acknowledgements, so the relay sends those events again, and the
// points service suppresses them: every order is still awarded once. Then the same with
// -ordered, as a program of its own (see TestOrderedLivesArriveInOrder): each order's
// events reach the orderly consumer in commit order.
func TestRelaySendsWhilePublishersStandBy(t *testing.T) {
	t.Parallel()
	srv := testsvc.PrivateMySQL(t, binlogArgs...)
	db := srv.OpenDB(t)

	t.Run("unordered", func(t *testing.T) {
		var out strings.Builder
		o := relayOptions(t, srv, &out)
		sum, err := run(context.Background(), o)
		t.Logf("go -C examples run ./order-service -relay:\n%s", out.String())
		require.NoError(t, err)
		assert.Contains(t, out.String(), "relay relay-0-")
		assert.Zero(t, sum.lost(), "every order got its points")
		assert.Equal(t, o.orders, sum.awarded)
		assert.Equal(t, o.orders, sum.published)
		assert.Equal(t, o.orders, sum.byRelay, "the relay sent every event")
		assert.Zero(t, sum.byPublishers, "the publishers stood by")
		assert.Equal(t, 1, sum.relaysLed, "one relay led, the others stood by")
		checkRelayed(t, db, o.table, o.orders)
		ids := testsvc.EventIDs(t, db, o.table)
		assert.Equal(t, o.orders, consumed(t, db, o.group, ids), "the inbox recorded every event")
		assert.Equal(t, int64(o.duplicate), sum.lostAcks, "the relay lost acknowledgements through the first instance's sender")
		assert.GreaterOrEqual(t, int64(sum.duplicates), sum.lostAcks, "every resend was suppressed")
		assert.Equal(t, sum.consumed-o.orders, sum.duplicates, "every suppressed delivery was a second one")
		assert.Zero(t, sum.rejected)
		assert.Equal(t, o.orders, sum.traced, "every request's trace reached the points service through the relay")
		assert.Zero(t, sum.linkedSends, "the relay makes no send spans")
	})

	t.Run("ordered", func(t *testing.T) {
		o := relayOptions(t, srv, io.Discard)
		sum, events := runOrdered(t, db, o, "-relay")
		assert.Equal(t, events, sum["sent by the relay"])
		assert.Zero(t, sum["sent by publishers"])
		assert.Zero(t, sum["linked by a send"], "the relay makes no send spans")
		checkRelayed(t, db, o.table, events)
	})
}

// -relay on a server whose binary log is off: the example stops at once, with the relay's
// error, which says how to start the server.
func TestRelayNeedsTheBinlog(t *testing.T) {
	t.Parallel()
	o := testOptions(t, io.Discard)
	db := testsvc.OpenDB(t)
	var logBin int
	require.NoError(t, db.QueryRow("SELECT @@log_bin").Scan(&logBin))
	if logBin == 1 {
		t.Skip("the test server has its binary log on")
	}
	o.relay = true
	began := time.Now()
	_, err := run(context.Background(), o)
	require.Error(t, err)
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "--log-bin")
	assert.Less(t, time.Since(began), time.Minute, "it stopped at once, not at -timeout")
}

// buildExample builds the example, without the race detector, into t's temporary directory.
func buildExample(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "order-service")
	goCmd := "go" // the toolchain on PATH, as `go test` ran
	if gr := os.Getenv("GOROOT"); gr != "" {
		goCmd = filepath.Join(gr, "bin", "go")
	}
	out, err := exec.Command(goCmd, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go -C examples build ./order-service: %s", out)
	return bin
}

// parseSummary reads the numbers of the example's summary, by label.
func parseSummary(t *testing.T, out string) map[string]int {
	t.Helper()
	_, after, ok := strings.Cut(out, "\nsummary (")
	require.True(t, ok, "no summary in the output")
	line := regexp.MustCompile(`(?m)^  ([a-z][a-z ()-]*[a-z)])\s+(\d+)`)
	sum := map[string]int{}
	for _, m := range line.FindAllStringSubmatch(after, -1) {
		n, err := strconv.Atoi(m[2])
		require.NoError(t, err)
		sum[m[1]] = n
	}
	for _, label := range []string{"orders created", "events published", "lost", "out of order"} {
		require.Contains(t, sum, label, "the summary has no %q", label)
	}
	return sum
}

// Messages the points service can never process, sent straight to the topic (a body that
// is not JSON, an event type that is not an order's, no eventId), are each recorded once in
// the inbox's rejected table with the reason and acknowledged: never handed back to RocketMQ
// to be redelivered. A good message after them is still processed.
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
	forget(t, db, prefix)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	points, err := startPointsService(ctx, db, o, testsvc.UniqueTable("points"), noop.NewTracerProvider(), mp)
	require.NoError(t, err)
	defer points.shutdown()

	addrs, err := primitive.NewNamesrvAddr(o.namesrv)
	require.NoError(t, err)
	prod, err := rocketmq.NewProducer(producer.WithNameServer(addrs),
		producer.WithGroupName(testsvc.UniqueTable("pg")), producer.WithInstanceName(testsvc.UniqueTable("poison")))
	require.NoError(t, err)
	require.NoError(t, prod.Start())
	defer func() { _ = prod.Shutdown() }()
	// As the publisher sends an event: the tag and the eventType property the event type.
	send := func(eventType, body, eventID string) {
		t.Helper()
		m := primitive.NewMessage(o.topic, []byte(body))
		m.WithTag("ORDER_CREATED")
		m.WithProperty(outbox.PropertyEventType, eventType)
		m.WithProperty(outbox.PropertyBizNo, prefix+"1")
		if eventID != "" {
			m.WithProperty(outbox.PropertyEventID, eventID)
		}
		res, err := prod.SendSync(ctx, m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
	}
	notJSON, refund, good := uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String(), uuid.Must(uuid.NewV7()).String()
	send("ORDER_CREATED", "{not json", notJSON)
	send("ORDER_REFUNDED", `{"orderNo":"`+prefix+`4"}`, refund)
	send("ORDER_CREATED", `{"orderNo":"`+prefix+`2","userId":1,"amount":100}`, "")
	send("ORDER_CREATED", `{"orderNo":"`+prefix+`3","userId":7,"amount":500}`, good)

	var got []inbox.RejectedMessage
	require.Eventually(t, func() bool {
		require.NoError(t, points.failed())
		got, err = points.in.Rejected(ctx, 0, 10)
		require.NoError(t, err)
		var awarded int
		require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM example_user_points WHERE order_no = ?", prefix+"3").Scan(&awarded))
		return len(got) == 3 && awarded == 1
	}, 2*time.Minute, 100*time.Millisecond, "the poison messages recorded, the good one awarded")

	byKey := map[string]inbox.RejectedMessage{}
	for _, r := range got {
		byKey[r.Key] = r
		assert.Equal(t, 1, r.Message.Deliveries, "%s was delivered once", r.Key)
		assert.Equal(t, o.topic, r.Message.Topic)
	}
	require.Contains(t, byKey, notJSON, "recorded under its eventId")
	assert.Equal(t, "permanent", byKey[notJSON].ReasonClass)
	assert.Contains(t, byKey[notJSON].Reason, "not an ORDER_CREATED payload")
	assert.Equal(t, "{not json", string(byKey[notJSON].Message.Body), "the body is kept")
	require.Contains(t, byKey, refund)
	assert.Equal(t, "permanent", byKey[refund].ReasonClass)
	assert.Contains(t, byKey[refund].Reason, `"ORDER_REFUNDED" is not one of an order's`)
	delete(byKey, notJSON)
	delete(byKey, refund)
	require.Len(t, byKey, 1)
	for key, r := range byKey {
		assert.True(t, strings.HasPrefix(key, "msgId:"), "without an eventId, recorded under the broker's message id: %s", key)
		assert.Equal(t, "no_event_id", r.ReasonClass)
		assert.Contains(t, r.Reason, "no eventId")
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	outcomes := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "inbox.messages" {
				for _, dp := range sum.DataPoints {
					v, _ := dp.Attributes.Value("outcome")
					outcomes[v.AsString()] += dp.Value
				}
			}
		}
	}
	assert.Equal(t, map[string]int64{"rejected": 3, "handled": 1}, outcomes, "nothing was handed back to RocketMQ for redelivery")
	n, err := rejectedCount(ctx, reader)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "the summary's count")
	assert.Equal(t, 1, consumed(t, db, o.group, map[int64]string{0: good}), "the good message was processed")
	assert.Zero(t, consumed(t, db, o.group, map[int64]string{0: notJSON, 1: refund}), "a rejected message leaves no inbox record")
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
		_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-old", EventType: "ORDER_CREATED", Payload: []byte("{}")})
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
	assert.Contains(t, err.Error(), "docs/upgrading.md")
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

// -ordered on an outbox table made without it: the example makes the table ordered, online,
// with docs/ordering.md's statements, and says so; a second start finds it ordered and leaves it.
func TestOrderedMakesItsTableOrdered(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	ctx := context.Background()
	var out strings.Builder
	o := options{dsn: testsvc.MySQLDSN(t), table: testsvc.UniqueTable("example_event"), out: &out}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS `" + o.table + "`") })
	exampleDB, err := openDB(o.dsn)
	require.NoError(t, err)
	defer exampleDB.Close()
	_, err = prepareTables(ctx, exampleDB, o)
	require.NoError(t, err)
	_, err = db.Exec("ALTER TABLE `" + o.table + "` MODIFY status ENUM('WAIT', 'SENDING', 'SUCCESS', 'FAIL') NOT NULL DEFAULT 'WAIT'")
	require.NoError(t, err, "as a table made before SKIPPED")

	o.ordered = true
	store, err := prepareTables(ctx, exampleDB, o)
	require.NoError(t, err)
	ordering, err := store.Check(ctx)
	require.NoError(t, err, "the table serves ordered claims")
	assert.Equal(t, outbox.KeyOrder, ordering.Ordering)
	assert.Contains(t, out.String(), "ADD INDEX idx_biz_no_status (biz_no, status, id)")
	assert.Contains(t, out.String(), "'SKIPPED'")
	var old int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() "+
		"AND table_name = ? AND index_name = 'idx_biz_no'", o.table).Scan(&old))
	assert.Zero(t, old, "idx_biz_no is replaced")

	out.Reset()
	_, err = prepareTables(ctx, exampleDB, o)
	require.NoError(t, err)
	assert.Empty(t, out.String(), "an ordered table is left as it is")
}
