// Command order-service is the outbox end to end: an order API that writes each order and its
// ORDER_CREATED event in one transaction, N publisher instances sending the events to
// RocketMQ, and a points service consuming them exactly once through an inbox.
//
// On a fresh Debian machine, one command sets up MariaDB and RocketMQ and runs it:
//
//	bash scripts/run-example.sh -orders 1000 -instances 3
//
// With the services already running:
//
//	go -C examples run ./order-service -dsn "$(bash scripts/mariadb.sh dsn)" -namesrv 127.0.0.1:9876
//
// -duplicate N makes the first publisher lose the acknowledgement of N sends (the broker got
// the message, the publisher records a failure), so those events are sent twice: the consumer
// must suppress the duplicates and still award each order's points exactly once.
//
// The points service is an inbox consumer (package inbox): the inbox records each message's
// eventId in t_inbox, under the consumer group's primary key, in the transaction in which the
// points service awards the points, so the award and the record commit together or not at
// all, and a second delivery of the event is acknowledged without awarding anything. The
// eventId is the UUIDv7 the library gives each event at insert, never the outbox row's id:
// row ids start again at 1 when the outbox table is recreated, and a consumer that remembered
// them would drop every new event as a duplicate of an old one (main_test.go recreates the
// table between two runs to show that nothing is dropped).
//
// A message the points service can never process (no eventId, an eventId that is not a
// UUID, a body that is not an order event's payload, an event type that is not an order's)
// is recorded in t_inbox_rejected with the reason, its properties and its body, and
// acknowledged: handed back to RocketMQ, it would be redelivered for hours to no end. A
// failure that may pass (the database is down) rolls back and the message is delivered
// again with RocketMQ's backoff (10 s, 30 s, 1 min, ...); its fifth failed delivery is
// rejected too, to be replayed (inbox.Replay) once the cause is fixed. With -ordered such a
// failure holds the message's queue instead, for as long as it lasts (it is tried again every
// second, before anything after it in the queue), since an order's later events must not
// overtake it.
//
// One trace runs from the order API to the points service: the order API starts a span for
// each order and inserts the event in its context, so the outbox stores the span's W3C trace
// context with the event; the publishers (given a TracerProvider) make each send a producer
// span linked to it; the message carries it as the traceparent and tracestate properties;
// and the inbox (given the TracerProvider too) handles each delivery in a consumer span of
// the same trace, which says what became of it (handled, duplicate, rejected, failed). The
// spans go to an in-memory exporter of the OpenTelemetry SDK (a service would export them to
// its collector); the summary counts the order API's request traces, those a send span links
// to, and those the points service's span continues, and in them the deliveries of the
// run's own events and the duplicates among them. Nothing is registered globally.
//
// -ordered is per-key ordering. Each order then has a life of two or three events, each
// committed in its own transaction as the order API changes the order: ORDER_CREATED, then
// ORDER_PAID a few requests later, and for one order in five ORDER_CANCELLED after that. The
// publishers keep each order's events in commit order (MySQLConfig.Ordering = outbox.KeyOrder:
// the store claims an order's events in order, on a table with the index ordered claims need,
// and the publishers tell the RocketMQ sender, which sends an order's events to one queue),
// and the points service consumes orderly (ConsumerConfig.Orderly: one goroutine per queue,
// in queue order). Besides awarding points for ORDER_CREATED, it keeps each order's status in
// example_order_status as the events arrive, and records in example_out_of_order every event
// that is not the next one of its order's life: the summary counts them ("out of order", 0
// when ordering holds) and the orders whose final status is not the one the order API gave
// them. A repeated event (a lost acknowledgement's resend) is a duplicate, suppressed by the
// inbox on its eventId before the check; ordering promises that a repeat never reorders two
// events.
//
// -relay publishes through the binlog relay (module github.com/go-outbox/outbox/relay, see
// docs/relay.md) instead of by polling: each instance runs a relay beside its publisher,
// with the same sender. One relay leads (the first instance's: the example lets it lead
// before the other instances start), reading each event from the server's binary log as the
// order API commits it, sending it and marking it sent; the other relays stand by, to take
// over should it stop. The publishers' store names the relay's checkpoint table
// (MySQLConfig.RelayTable), so they stand by as well while a relay leads, and take the table
// over if its heartbeat goes silent. The instances start before the order API writes, for the
// relay to follow the binlog. The summary counts the events the relay sent and those the
// publishers sent, by the claim_owner their rows were marked with (a relay writes its
// InstanceID); the run fails if the relay sent none. -duplicate still loses the first
// instance's acknowledgements: its relay, the leader, sends those events again. The relay
// makes no send spans, so "linked by a send" counts the publishers' sends alone. The server
// needs its binary log on, in row format with full metadata: mariadbd --log-bin
// --binlog-format=ROW --binlog-row-metadata=FULL --sync-binlog=1 --server-id=1.
//
// -v logs every publisher event, every duplicate the inbox suppresses, and the RocketMQ
// client's own logs, which the example otherwise discards.
//
// -metrics-addr 127.0.0.1:9464 serves the publishers' and the inbox's metrics at /metrics
// while the example runs, in Prometheus's text format (see docs/operations.md, "Metrics and
// health", and docs/inbox.md).
//
// The example's tables are its own, in the database of -dsn, beside the inbox's tables
// (t_inbox and t_inbox_rejected, which consumer groups share, each with rows of its own). An
// outbox table left by an older version of this example (from before event ids, without the
// event_id column) is dropped and created again if all its events were sent; if some were
// not, the example stops and says how to upgrade the table instead.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/relay"
)

type options struct {
	dsn, namesrv, topic string
	table, group        string // the outbox table, the points service's consumer group
	orders, instances   int
	duplicate           int
	ordered             bool // per-key ordering: each order's life of events, kept in order
	relay               bool // each instance runs a binlog relay, which sends while the publishers stand by
	timeout             time.Duration
	verbose             bool
	out                 io.Writer // where the progress and the summary go
	metricsAddr         string    // where /metrics is served; "" for nowhere
	// metricsReady, if set, is called with the /metrics URL once every event is published,
	// before the publishers stop.
	metricsReady func(url string)
}

func main() {
	o := options{out: os.Stdout}
	flag.StringVar(&o.dsn, "dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	flag.StringVar(&o.namesrv, "namesrv", "127.0.0.1:9876", "RocketMQ name server")
	flag.StringVar(&o.topic, "topic", "ORDER_EVENT_TOPIC", "RocketMQ topic") // the store's Routes.Topic
	flag.StringVar(&o.table, "table", "t_event_record", "outbox table")      // the default MySQLConfig.Table
	flag.StringVar(&o.group, "group", "example_points_service", "the points service's consumer group")
	flag.IntVar(&o.orders, "orders", 1000, "orders to create")
	flag.IntVar(&o.instances, "instances", 3, "publisher instances")
	flag.IntVar(&o.duplicate, "duplicate", 5, "sends whose acknowledgement the first publisher loses, to show the consumer suppressing duplicates")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long")
	flag.BoolVar(&o.verbose, "v", false, "log every publisher event, and the RocketMQ client's own logs (discarded without -v)")
	flag.BoolVar(&o.ordered, "ordered", false, "per-key ordering: each order also gets ORDER_PAID and, one in five, ORDER_CANCELLED; the publishers keep each order's events in order, the consumer consumes orderly and counts events that arrive out of order")
	flag.BoolVar(&o.relay, "relay", false, "each instance also runs a binlog relay, which reads the events from the binlog and sends them while the publishers stand by (the server needs --log-bin --binlog-format=ROW --binlog-row-metadata=FULL)")
	flag.StringVar(&o.metricsAddr, "metrics-addr", "", "serve the publishers' and the inbox's metrics at http://ADDR/metrics (a loopback address, e.g. 127.0.0.1:9464)")
	flag.Parse()
	if o.orders < 1 || o.instances < 1 || o.duplicate < 0 {
		log.Fatal("-orders and -instances must be at least 1, -duplicate at least 0")
	}
	routeClientLogs(o.verbose)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	sum, err := run(ctx, o)
	if err != nil {
		log.Fatal(err)
	}
	if sum.lost() != 0 || sum.outOfOrder != 0 || sum.wrongStatus != 0 || (o.relay && sum.byRelay == 0) {
		os.Exit(1)
	}
}

// routeClientLogs routes the RocketMQ client's logs: with -v all of them, to stderr through
// slog; without it, nowhere. The client warns as a matter of course while a consumer group
// starts (it looks up the group's %RETRY% topic, and rebalances on it, before the broker has
// created it), which would open the example's output with warnings about nothing wrong. The
// client's logger is process-wide: route it once, before any producer or consumer starts.
func routeClientLogs(verbose bool) {
	if !verbose {
		outbox.RouteRocketMQClientLogs(nil) // nil discards them
		return
	}
	outbox.RouteRocketMQClientLogs(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})))
}

const schema = `
CREATE TABLE IF NOT EXISTS example_orders (
	order_no VARCHAR(64) NOT NULL PRIMARY KEY,
	user_id  BIGINT      NOT NULL,
	amount   INT         NOT NULL,
	status   VARCHAR(16) NOT NULL DEFAULT 'CREATED'
);
-- the business table's own unique key is the last line: one award per order and type
CREATE TABLE IF NOT EXISTS example_user_points (
	id       BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
	user_id  BIGINT      NOT NULL,
	order_no VARCHAR(64) NOT NULL,
	type     VARCHAR(32) NOT NULL,
	points   INT         NOT NULL,
	UNIQUE KEY uk_order_type (order_no, type)
);
-- with -ordered: each order's status as the points service saw its events arrive
CREATE TABLE IF NOT EXISTS example_order_status (
	order_no   VARCHAR(64) NOT NULL PRIMARY KEY,
	status     VARCHAR(16) NOT NULL, -- CREATED, PAID or CANCELLED: the last event's
	step       INT         NOT NULL, -- that event's place in the order's life, from 1
	updated_at DATETIME(3) NOT NULL
);
-- with -ordered: every event that arrived out of its order's life, by eventId
CREATE TABLE IF NOT EXISTS example_out_of_order (
	msg_id     VARCHAR(64) NOT NULL PRIMARY KEY,
	order_no   VARCHAR(64) NOT NULL,
	event_type VARCHAR(32) NOT NULL,
	found      VARCHAR(16) NOT NULL, -- the order's status when it arrived ('' for none)
	seen_at    DATETIME(3) NOT NULL,
	KEY idx_order_no (order_no)
)`

func openDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse -dsn: %w", err)
	}
	cfg.ParseTime, cfg.MultiStatements = true, true
	return sql.Open("mysql", cfg.FormatDSN())
}

// summary is what one run did.
type summary struct {
	prefix                     string // of this run's order numbers
	orders, published, awarded int
	events                     int   // the events the order API wrote: one per order, more with -ordered
	paid, cancelled            int   // with -ordered: orders paid, and cancelled after that
	outOfOrder                 int   // with -ordered: events that arrived out of their order's life
	wrongStatus                int   // with -ordered: orders whose final status the points service got wrong
	consumed, duplicates       int   // deliveries of this run's events, and those suppressed
	rejected                   int64 // messages the inbox rejected, whatever their run
	lostAcks                   int64 // acknowledgements the first instance dropped on purpose
	requests                   int   // the order API's requests: a trace each, with one event
	traced                     int   // requests whose trace the points service's span is in
	linkedSends                int   // requests whose trace a publisher's send span links to
	byRelay, byPublishers      int   // with -relay: this run's events the relays sent, and the publishers
	relaysLed                  int   // with -relay: the relays that led the table at some time
}

// lost is how many orders got no points.
func (s summary) lost() int { return s.orders - s.awarded }

func run(ctx context.Context, o options) (sum summary, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	db, err := openDB(o.dsn)
	if err != nil {
		return sum, err
	}
	defer db.Close()
	store, err := prepareTables(ctx, db, o)
	if err != nil {
		return sum, err
	}
	runID := strconv.FormatInt(time.Now().UnixMilli(), 36)
	prefix := "ORD-" + runID + "-"

	// The run's spans, kept in memory: the order API's, the publishers' and the points
	// service's.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	// The metrics: the publishers' and the inbox's on /metrics with -metrics-addr; the
	// inbox's read for the summary too, from inboxMetrics.
	inboxMetrics := sdkmetric.NewManualReader()
	var ms *metricsServer
	var mp *sdkmetric.MeterProvider
	if o.metricsAddr != "" {
		if ms, err = startMetrics(o.metricsAddr, inboxMetrics); err != nil {
			return sum, err
		}
		defer ms.close()
		fmt.Fprintf(o.out, "metrics: %s\n", ms.url)
		mp = ms.provider
	} else {
		mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(inboxMetrics))
		defer func() { _ = mp.Shutdown(context.Background()) }()
	}

	points, err := startPointsService(ctx, db, o, "points-"+runID, tp, mp)
	if err != nil {
		return sum, err
	}
	defer points.shutdown()

	var instances []*instance
	stopInstances := func() {
		// Close stops the relay, then the publisher's Run, which returns once its sends in
		// flight are recorded and what it claimed and did not send is released; only then
		// does it close the sender. The instances stop side by side.
		var wg sync.WaitGroup
		for _, in := range instances {
			wg.Go(in.close)
		}
		wg.Wait()
		instances = nil
	}
	defer stopInstances()
	var lostAcks atomic.Int64 // acknowledgements the first instance dropped on purpose
	startInstances := func() error {
		for i := range o.instances {
			in, err := newInstance(o, i, &lostAcks, tp, ms)
			if err != nil {
				return err
			}
			instances = append(instances, in)
			if err := in.start(ctx); err != nil {
				return err
			}
			if in.relay != nil && i == 0 {
				// The first instance's relay leads (with -duplicate, its sender is the one
				// that loses acknowledgements); the relays started after it stand by.
				if err := in.awaitLeading(ctx); err != nil {
					return err
				}
			}
		}
		if o.relay {
			fmt.Fprintf(o.out, "relay %s leads %s: the other %d relays stand by, and so do the %d publishers\n",
				instances[0].relayID, o.table, len(instances)-1, len(instances))
		}
		return nil
	}
	if o.relay {
		// The relay reads the events from the binlog as the order API commits them: the
		// instances start first.
		if err := startInstances(); err != nil {
			return sum, err
		}
	}

	start := time.Now()
	wrote, err := createOrders(ctx, store, prefix, o.orders, o.ordered, tp.Tracer("order-api"))
	if err != nil {
		return sum, err
	}
	if o.ordered {
		fmt.Fprintf(o.out, "order API: created %d orders, paid %d, cancelled %d: %d events, each in the transaction of its change\n",
			o.orders, wrote.paid, wrote.cancelled, wrote.events)
	} else {
		fmt.Fprintf(o.out, "order API: created %d orders, each with its event, in one transaction per order\n", o.orders)
	}
	if !o.relay {
		// The publishers start on the orders' backlog of events.
		if err := startInstances(); err != nil {
			return sum, err
		}
	}

	// Done when every order has its points, every event is published, and every delivery
	// (the duplicates included) has reached the points service and ended its span.
	awarded, published := 0, 0
	for ctx.Err() == nil {
		if awarded, err = countPrefix(ctx, db, "SELECT COUNT(*) FROM example_user_points WHERE order_no LIKE ?", prefix); err != nil {
			break
		}
		if published, err = countPrefix(ctx, db, "SELECT COUNT(*) FROM `"+o.table+"` WHERE status = 'SUCCESS' AND biz_no LIKE ?", prefix); err != nil {
			break
		}
		if err = points.failed(); err != nil {
			break
		}
		if err = failed(instances); err != nil {
			break
		}
		if awarded >= o.orders && published >= wrote.events && followTraces(spans.GetSpans()).deliveries >= wrote.events+int(lostAcks.Load()) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)
	if err == nil && ctx.Err() == nil && ms != nil && o.metricsReady != nil {
		o.metricsReady(ms.url)
	}
	relayIDs, relaysLed := map[string]bool{}, 0
	for _, in := range instances {
		if in.relay != nil {
			relayIDs[in.relayID] = true
			if in.relay.Stats().Terms > 0 {
				relaysLed++
			}
		}
	}
	stopInstances()
	if err != nil {
		return sum, err
	}

	traces := followTraces(spans.GetSpans())
	sum = summary{prefix: prefix, orders: o.orders, published: published, awarded: awarded,
		events: wrote.events, paid: wrote.paid, cancelled: wrote.cancelled,
		consumed: traces.deliveries, duplicates: traces.duplicates, lostAcks: lostAcks.Load(),
		requests: traces.requests, traced: traces.traced, linkedSends: traces.linkedSends, relaysLed: relaysLed}
	if o.relay {
		if sum.byRelay, sum.byPublishers, err = countSenders(ctx, db, o.table, prefix, relayIDs); err != nil {
			return sum, err
		}
	}
	if sum.rejected, err = rejectedCount(ctx, inboxMetrics); err != nil {
		return sum, err
	}
	if o.ordered {
		if sum.outOfOrder, sum.wrongStatus, err = checkLives(ctx, db, prefix, o.orders); err != nil {
			return sum, err
		}
	}
	instancesAre := "publisher instances"
	if o.relay {
		instancesAre = "instances, each a relay and a publisher"
	}
	mode := ""
	if o.ordered {
		mode = ", in key order"
	}
	fmt.Fprintf(o.out, "\nsummary (%d %s%s, %s)\n", o.instances, instancesAre, mode, elapsed.Round(time.Millisecond))
	fmt.Fprintf(o.out, "  orders created        %6d\n", sum.orders)
	if o.ordered {
		fmt.Fprintf(o.out, "  orders paid           %6d\n", sum.paid)
		fmt.Fprintf(o.out, "  orders cancelled      %6d\n", sum.cancelled)
	}
	fmt.Fprintf(o.out, "  events published      %6d\n", sum.published)
	if o.relay {
		fmt.Fprintf(o.out, "  sent by the relay     %6d   (%d of %d relays led, the others stood by)\n", sum.byRelay, sum.relaysLed, o.instances)
		fmt.Fprintf(o.out, "  sent by publishers    %6d   (they stand by while a relay leads)\n", sum.byPublishers)
	}
	fmt.Fprintf(o.out, "  messages consumed     %6d\n", sum.consumed)
	if o.relay {
		fmt.Fprintf(o.out, "  acks lost on purpose  %6d   (-duplicate: by the first instance's sender, which its relay sends with: sent again)\n", sum.lostAcks)
	} else {
		fmt.Fprintf(o.out, "  acks lost on purpose  %6d   (-duplicate: sent again)\n", sum.lostAcks)
	}
	fmt.Fprintf(o.out, "  duplicates suppressed %6d\n", sum.duplicates)
	fmt.Fprintf(o.out, "  messages rejected     %6d\n", sum.rejected)
	fmt.Fprintf(o.out, "  points awarded        %6d\n", sum.awarded)
	fmt.Fprintf(o.out, "  lost                  %6d\n", sum.lost())
	if o.ordered {
		fmt.Fprintf(o.out, "  out of order          %6d   (events that were not the next of their order's life)\n", sum.outOfOrder)
		fmt.Fprintf(o.out, "  wrong final status    %6d\n", sum.wrongStatus)
	}
	fmt.Fprintf(o.out, "  request traces        %6d   (one per order API request, each wrote one event)\n", sum.requests)
	if o.relay {
		fmt.Fprintf(o.out, "  linked by a send      %6d   (a publisher's send span links to the trace; the relay makes no spans)\n", sum.linkedSends)
	} else {
		fmt.Fprintf(o.out, "  linked by a send      %6d   (a publisher's send span links to the trace)\n", sum.linkedSends)
	}
	fmt.Fprintf(o.out, "  continued by consumer %6d   (the points service's span is in the trace)\n", sum.traced)
	if published < wrote.events {
		return sum, fmt.Errorf("%d events still unpublished after %s", wrote.events-published, o.timeout)
	}
	if o.relay && sum.byRelay == 0 {
		fmt.Fprintf(o.out, "the relay sent none of the events\n")
	}
	return sum, nil
}

// countSenders counts a run's sent events by who sent them, from the claim_owner their rows
// were marked SUCCESS with: a publisher's InstanceID, or a relay's (relayIDs).
func countSenders(ctx context.Context, db *sql.DB, table, prefix string, relayIDs map[string]bool) (byRelay, byPublishers int, err error) {
	rows, err := db.QueryContext(ctx, "SELECT claim_owner, COUNT(*) FROM `"+table+"` WHERE status = 'SUCCESS' AND biz_no LIKE ? GROUP BY claim_owner", prefix+"%")
	if err != nil {
		return 0, 0, fmt.Errorf("count the events by sender: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var owner string
		var n int
		if err := rows.Scan(&owner, &n); err != nil {
			return 0, 0, err
		}
		if relayIDs[owner] {
			byRelay += n
		} else {
			byPublishers += n
		}
	}
	return byRelay, byPublishers, rows.Err()
}

// prepareTables creates the example's tables where they are missing and returns the outbox
// store. An outbox table from before event ids is this example's old output: it is dropped
// and created again if every event in it was sent, and otherwise left alone with an error
// that says how to upgrade it, since its unsent events are still owed to someone. With
// -ordered, an outbox table made for unordered publishing is made ordered, online, as
// docs/ordering.md says.
func prepareTables(ctx context.Context, db *sql.DB, o options) (*outbox.MySQLStore, error) {
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: o.table, Ordering: ordering(o)})
	if err != nil {
		return nil, err
	}
	var columns, newer int
	err = db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(CASE WHEN column_name IN ('event_id', 'reclaim_count', 'trace_parent', 'trace_state') THEN 1 END)
	FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ?`, o.table).Scan(&columns, &newer)
	if err != nil {
		return nil, fmt.Errorf("look for the outbox table %s: %w", o.table, err)
	}
	if columns > 0 && newer < 4 {
		var unsent int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM `"+o.table+"` WHERE status IN ('WAIT', 'SENDING')").Scan(&unsent); err != nil {
			return nil, fmt.Errorf("count the unsent events of %s: %w", o.table, err)
		}
		if unsent > 0 {
			return nil, fmt.Errorf("the outbox table %s was made by an older version of this example (no event_id, reclaim_count or trace columns) "+
				"and still holds %d unsent events: upgrade it as docs/upgrading.md says, "+
				"or drop it to discard them", o.table, unsent)
		}
		if _, err := db.ExecContext(ctx, "DROP TABLE `"+o.table+"`"); err != nil {
			return nil, fmt.Errorf("drop the outdated outbox table %s: %w", o.table, err)
		}
		fmt.Fprintf(o.out, "the outbox table %s, made by an older version of this example, held only sent events: dropped and created again\n", o.table)
	}
	if o.ordered && columns > 0 && newer == 4 {
		if err := makeOrdered(ctx, db, o); err != nil {
			return nil, err
		}
	}
	if err := store.CreateSchema(ctx); err != nil {
		return nil, err
	}
	if o.relay {
		// The relay's checkpoint table: one row per relayed outbox table.
		if err := relay.CreateSchema(ctx, db, relay.Config{CheckpointTable: relayTable}); err != nil {
			return nil, err
		}
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return nil, fmt.Errorf("create example tables: %w", err)
	}
	// example_orders from before -ordered has no status column.
	var status int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.columns
	WHERE table_schema = DATABASE() AND table_name = 'example_orders' AND column_name = 'status'`).Scan(&status); err != nil {
		return nil, fmt.Errorf("look for example_orders.status: %w", err)
	}
	if status == 0 {
		_, err := db.ExecContext(ctx, "ALTER TABLE example_orders ADD COLUMN status VARCHAR(16) NOT NULL DEFAULT 'CREATED'")
		var me *mysql.MySQLError
		if err != nil && !(errors.As(err, &me) && me.Number == errDuplicateColumn) { // another run added it first
			return nil, fmt.Errorf("add example_orders.status: %w", err)
		}
	}
	return store, nil
}

const errDuplicateColumn = 1060

// makeOrdered makes the outbox table, made for unordered publishing, fit for ordered claims,
// with docs/ordering.md's statements: SKIPPED added to the status column (no row changes), and
// idx_biz_no replaced by idx_biz_no_status, built online. A table that has them already is
// left as it is.
func makeOrdered(ctx context.Context, db *sql.DB, o options) error {
	var skipped, index int
	err := db.QueryRowContext(ctx, `SELECT
	(SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = ?
		AND column_name = 'status' AND column_type LIKE '%''SKIPPED''%'),
	(SELECT COUNT(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND table_name = ?
		AND index_name = 'idx_biz_no_status')`, o.table, o.table).Scan(&skipped, &index)
	if err != nil {
		return fmt.Errorf("look at the outbox table %s: %w", o.table, err)
	}
	var alters []string
	if skipped == 0 {
		alters = append(alters, "ALTER TABLE `"+o.table+"` MODIFY status ENUM('WAIT', 'SENDING', 'SUCCESS', 'FAIL', 'SKIPPED') NOT NULL DEFAULT 'WAIT'")
	}
	if index == 0 {
		alters = append(alters, "ALTER TABLE `"+o.table+"` DROP INDEX idx_biz_no, ADD INDEX idx_biz_no_status (biz_no, status, id), ALGORITHM=INPLACE, LOCK=NONE")
	}
	for _, q := range alters {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("make the outbox table %s ordered: %s: %w", o.table, q, err)
		}
		fmt.Fprintf(o.out, "the outbox table %s was made for unordered publishing: %s\n", o.table, q)
	}
	return nil
}

// lives is what createOrders wrote.
type lives struct{ events, paid, cancelled int }

// payLag is how many requests after its creation an order is paid, and how many after that
// it is cancelled (when it is): the order API interleaves the lives of several orders, as
// customers would.
const payLag = 3

// createOrders is n orders' requests to the order API, each in a span of its own, as an
// HTTP handler's instrumentation would start it: each order created and, with ordered, paid
// payLag requests later and cancelled (see cancelled) payLag after that.
func createOrders(ctx context.Context, store *outbox.MySQLStore, prefix string, n int, ordered bool, tracer trace.Tracer) (lives, error) {
	var l lives
	request := func(name, orderNo string, fn func(ctx context.Context) error) error {
		ctx, span := tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
		err := fn(ctx)
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		if err != nil {
			return fmt.Errorf("%s %s: %w", name, orderNo, err)
		}
		l.events++
		return nil
	}
	steps := n
	if ordered {
		steps = n + 2*payLag
	}
	for step := range steps {
		if i := step; i < n {
			orderNo := fmt.Sprintf("%s%d", prefix, i)
			if err := request("POST /orders", orderNo, func(ctx context.Context) error {
				return createOrder(ctx, store, orderNo, 1000+i%50, 100+i%900)
			}); err != nil {
				return l, err
			}
		}
		if !ordered {
			continue
		}
		if i := step - payLag; i >= 0 && i < n {
			orderNo := fmt.Sprintf("%s%d", prefix, i)
			if err := request("POST /orders/{no}/pay", orderNo, func(ctx context.Context) error {
				return changeOrder(ctx, store, orderNo, "CREATED", "PAID", orderPaid{OrderNo: orderNo, Amount: 100 + i%900})
			}); err != nil {
				return l, err
			}
			l.paid++
		}
		if i := step - 2*payLag; i >= 0 && i < n && cancelled(i) {
			orderNo := fmt.Sprintf("%s%d", prefix, i)
			if err := request("POST /orders/{no}/cancel", orderNo, func(ctx context.Context) error {
				return changeOrder(ctx, store, orderNo, "PAID", "CANCELLED", orderCancelled{OrderNo: orderNo, Reason: "changed their mind"})
			}); err != nil {
				return l, err
			}
			l.cancelled++
		}
	}
	return l, nil
}

// cancelled says whether the i-th order of a run is cancelled after it is paid: one in five.
func cancelled(i int) bool { return i%5 == 2 }

// finalStatus is the status the order API leaves the i-th order of an ordered run in.
func finalStatus(i int) string {
	if cancelled(i) {
		return "CANCELLED"
	}
	return "PAID"
}

// traces is what a run's spans show.
type traces struct {
	requests    int // the order API's request traces
	traced      int // those the points service's span is in
	linkedSends int // those a publisher's send span links to
	// deliveries are the points service's deliveries in them, the inbox's consumer spans:
	// the deliveries of the run's events, every resend and redelivery included; duplicates
	// are those the inbox suppressed.
	deliveries, duplicates int
}

// outcomeKey is the attribute of the inbox's span that says what became of the delivery.
const outcomeKey = attribute.Key("outbox.inbox.outcome")

// followTraces reads a run's spans: the order API's request traces, those that reached the
// points service (the inbox's consumer spans in the same trace, and what became of each)
// and those that a publisher's send span links to.
func followTraces(spans tracetest.SpanStubs) traces {
	api := map[trace.TraceID]bool{}
	for _, s := range spans {
		if s.SpanKind == trace.SpanKindServer {
			api[s.SpanContext.TraceID()] = true
		}
	}
	var t traces
	consumed, sent := map[trace.TraceID]bool{}, map[trace.TraceID]bool{}
	for _, s := range spans {
		switch s.SpanKind {
		case trace.SpanKindConsumer:
			if id := s.SpanContext.TraceID(); api[id] {
				consumed[id] = true
				t.deliveries++
				for _, a := range s.Attributes {
					if a.Key == outcomeKey && a.Value.AsString() == inbox.Duplicate.String() {
						t.duplicates++
					}
				}
			}
		case trace.SpanKindProducer:
			for _, l := range s.Links {
				if id := l.SpanContext.TraceID(); api[id] {
					sent[id] = true
				}
			}
		}
	}
	t.requests, t.traced, t.linkedSends = len(api), len(consumed), len(sent)
	return t
}

// rejectedCount is how many messages the inbox has rejected, by its metrics (inbox.rejected,
// every reason).
func rejectedCount(ctx context.Context, r sdkmetric.Reader) (int64, error) {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(ctx, &rm); err != nil {
		return 0, fmt.Errorf("read the inbox's metrics: %w", err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "inbox.rejected" {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n, nil
}

// orderCreated is the ORDER_CREATED event's payload.
type orderCreated struct {
	OrderNo string `json:"orderNo"`
	UserID  int    `json:"userId"`
	Amount  int    `json:"amount"`
}

// orderPaid is the ORDER_PAID event's payload.
type orderPaid struct {
	OrderNo string `json:"orderNo"`
	Amount  int    `json:"amount"`
}

// orderCancelled is the ORDER_CANCELLED event's payload.
type orderCancelled struct {
	OrderNo string `json:"orderNo"`
	Reason  string `json:"reason"`
}

// life is the events of an order's life in the order they happen: an event's step is its
// place in it.
var life = map[string]struct {
	step   int
	status string // the order's status after it
}{
	"ORDER_CREATED":   {1, "CREATED"},
	"ORDER_PAID":      {2, "PAID"},
	"ORDER_CANCELLED": {3, "CANCELLED"},
}

// createOrder is the order API: the order row and its event commit or roll back together.
func createOrder(ctx context.Context, store *outbox.MySQLStore, orderNo string, userID, amount int) error {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO example_orders (order_no, user_id, amount) VALUES (?, ?, ?)",
		orderNo, userID, amount); err != nil {
		return err
	}
	payload, err := json.Marshal(orderCreated{OrderNo: orderNo, UserID: userID, Amount: amount})
	if err != nil {
		return err
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: orderNo, EventType: "ORDER_CREATED", Payload: payload}); err != nil {
		return err
	}
	return tx.Commit()
}

// changeOrder is the order API moving an order from one status to the next: the change and
// its event (ORDER_ and the new status) commit or roll back together. An order that is not
// in the status from is refused.
func changeOrder(ctx context.Context, store *outbox.MySQLStore, orderNo, from, to string, payload any) error {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	res, err := tx.ExecContext(ctx, "UPDATE example_orders SET status = ? WHERE order_no = ? AND status = ?", to, orderNo, from)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n != 1 {
		return fmt.Errorf("the order is not %s", from)
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: orderNo, EventType: "ORDER_" + to, Payload: body}); err != nil {
		return err
	}
	return tx.Commit()
}

// ordering is the outbox store's ordering: with -ordered, an order's events in commit order.
func ordering(o options) outbox.Ordering {
	if o.ordered {
		// An order's next event is claimed only once its last one is sent, by whichever
		// instance: never two of an order in flight, and none overtaking a retry. The
		// publishers tell the RocketMQ sender, which sends an order's events to one queue.
		return outbox.KeyOrder
	}
	return outbox.Unordered
}

// relayTable is the relay's checkpoint table, the default one: its rows are per outbox table.
const relayTable = relay.DefaultCheckpointTable

// instance is one instance of the order-service: its own connection pool, producer and
// publisher, and with -relay its relay, as a separate process would have.
type instance struct {
	pub      *outbox.Publisher
	db       *sql.DB
	relay    *relay.Relay // with -relay
	relayID  string       // the relay's InstanceID
	relayRan chan error   // the relay's Run, once it returns
}

// start runs the relay, if there is one, and the publisher, until they are closed. The
// publisher's Start returns what keeps it from running (its table unfit for the store's
// ordering, say) before anything runs.
func (in *instance) start(ctx context.Context) error {
	if in.relay != nil {
		go func() { in.relayRan <- in.relay.Run(ctx) }()
	}
	if err := in.pub.Start(ctx); err != nil {
		return fmt.Errorf("start the publisher: %w", err)
	}
	return nil
}

// failed returns the relay's error if it could not run: Run returns at once when the
// server cannot feed a relay (its binlog is off, say), with an error that names the fix.
// Other failures (the database or the broker down) it rides out, as a standby or leader.
func (in *instance) failed() error {
	select {
	case err := <-in.relayRan:
		in.relayRan <- err // for the next call
		return err         // nil once it was stopped
	default:
		return nil
	}
}

// failed returns the first failure of the instances' relays.
func failed(instances []*instance) error {
	for _, in := range instances {
		if err := in.failed(); err != nil {
			return err
		}
	}
	return nil
}

// awaitLeading waits until the instance's relay leads the table.
func (in *instance) awaitLeading(ctx context.Context) error {
	for !in.relay.Health().Leader {
		if err := in.failed(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("relay %s did not lead: %w (last error: %s)", in.relayID, ctx.Err(), in.relay.Health().LastError)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// close stops the relay (a leader hands the table back to the publishers), then the
// publisher (which closes the sender they share), then closes the pool.
func (in *instance) close() {
	if in.relay != nil {
		_ = in.relay.Close()
	}
	_ = in.pub.Close()
	_ = in.db.Close()
}

func newInstance(o options, i int, lostAcks *atomic.Int64, tp trace.TracerProvider, ms *metricsServer) (*instance, error) {
	db, err := openDB(o.dsn)
	if err != nil {
		return nil, err
	}
	storeCfg := outbox.MySQLConfig{Table: o.table, Ordering: ordering(o), Routes: outbox.Routes{Topic: o.topic}}
	if o.relay {
		// The publishers stand by while a relay leads, and take over if it goes silent.
		storeCfg.RelayTable = relayTable
	}
	store, err := outbox.NewMySQLStore(db, storeCfg)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	instanceID := fmt.Sprintf("order-%d-%s", i, outbox.DefaultInstanceID())
	rmq, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers:  []string{o.namesrv},
		InstanceName: instanceID,
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	var sender outbox.Sender = rmq
	if i == 0 && o.duplicate > 0 {
		sender = &lossyAcks{inner: rmq, left: int64(o.duplicate), lost: lostAcks}
	}
	level := slog.LevelError
	if o.verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("instance", i)
	backoff := func(int) time.Duration { return 200 * time.Millisecond } // a demo need not wait 5 s
	onDeadLetter := func(_ context.Context, ev outbox.Event, cause error) {
		fmt.Fprintf(os.Stderr, "ALERT: dead letter id=%d event_id=%s biz_no=%s: %v\n", ev.ID, ev.EventID, ev.BizNo, cause)
	}
	cfg := outbox.Config{
		InstanceID:     instanceID,
		TracerProvider: tp, // each send a span, linked to its orders' traces
		PollInterval:   100 * time.Millisecond,
		Backoff:        backoff,
		Logger:         logger,
		OnDeadLetter:   onDeadLetter,
	}
	if ms != nil {
		cfg.MeterProvider = ms.provider
	}
	p, err := outbox.NewPublisher(store, sender, cfg)
	if err != nil {
		_ = rmq.Close()
		_ = db.Close()
		return nil, err
	}
	in := &instance{pub: p, db: db}
	if o.relay {
		// The relay sends with the instance's sender; its InstanceID, distinct from the
		// publisher's, is what it writes to claim_owner. Its binlog connection registers
		// with a server id derived from it (relay.Config.ServerID).
		in.relayID = fmt.Sprintf("relay-%d-%s", i, outbox.DefaultInstanceID())
		in.relay, err = relay.New(o.dsn, sender, relay.Config{
			Table:           o.table,
			CheckpointTable: relayTable,
			InstanceID:      in.relayID,
			Ordering:        ordering(o), // the store's
			Backoff:         backoff,
			OnDeadLetter:    onDeadLetter,
			Logger:          logger.With("relay", in.relayID),
		})
		if err != nil {
			_ = p.Close()
			_ = db.Close()
			return nil, err
		}
		in.relayRan = make(chan error, 1)
	}
	return in, nil
}

// lossyAcks sends for real, then reports failure for the first few sends: the broker has the
// message but the publisher (with -relay, the relay) believes the send failed, so it sends
// the event again later (in key order, before any later event of its order). It sends one event at a time, through
// the RocketMQ sender, even in batch mode; in key order an order whose event "failed" goes no
// further in that batch. As a wrapper does, it passes Info on (the sender's topic and send
// timeout) and Close (the publisher's Close closes the RocketMQ sender through it).
type lossyAcks struct {
	inner *outbox.RocketMQSender
	left  int64
	lost  *atomic.Int64
	mu    sync.Mutex
}

func (l *lossyAcks) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		return l.sendOne(ctx, ev, keyOrder)
	}).Send(ctx, evs, keyOrder)
}

// sendOne sends ev alone, to its order's queue in key order.
func (l *lossyAcks) sendOne(ctx context.Context, ev outbox.Event, keyOrder bool) error {
	if err := l.inner.Send(ctx, []outbox.Event{ev}, keyOrder)[0]; err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.left > 0 && ev.RetryCount == 0 {
		l.left--
		l.lost.Add(1)
		return errors.New("acknowledgement lost (simulated)")
	}
	return nil
}

func (l *lossyAcks) Info() outbox.SenderInfo { return l.inner.Info() }

func (l *lossyAcks) Check(ctx context.Context, topics []string) error {
	return l.inner.Check(ctx, topics)
}

func (l *lossyAcks) Close() error { return l.inner.Close() }

// pointsService awards points for ORDER_CREATED, once per event; with -ordered it also
// follows each order's status through all its events. It is an inbox consumer: the inbox
// records each event's eventId in the transaction in which handle does the effect, and
// suppresses a second delivery of the event before handle runs.
type pointsService struct {
	in      *inbox.Inbox
	c       *inbox.Consumer
	ordered bool       // consume orderly, every event of an order's life
	ran     chan error // the consumer's Run, once it returns
}

// startPointsService creates the inbox's tables if they are missing and starts the points
// service's consumer. Its spans go to tp, its metrics to mp.
func startPointsService(ctx context.Context, db *sql.DB, o options, instance string, tp trace.TracerProvider, mp metric.MeterProvider) (*pointsService, error) {
	level := slog.LevelWarn // failed deliveries and rejected messages
	if o.verbose {
		level = slog.LevelDebug // and every duplicate suppressed
	}
	cfg := inbox.Config{
		// A fixed group, as a real service has: it resumes where the last run stopped, and
		// its inbox rows are its own.
		Group:          o.group,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("service", "points"),
		MeterProvider:  mp,
		TracerProvider: tp,
	}
	tags := "ORDER_CREATED"
	if o.ordered {
		// A failure that may pass holds the queue until it passes, rather than being rejected
		// after MaxDeliveries, after which the order's later events would overtake it.
		cfg.MaxDeliveries = outbox.RetryForever
		// READ COMMITTED: follow's locking read of an order's status row locks that row
		// only; at REPEATABLE READ it locks the gap where a new order's row goes too, and
		// the queues' transactions deadlock on the gaps. (It costs a statement per message,
		// the driver's SET TRANSACTION before BEGIN.)
		cfg.TxOptions = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		tags = "ORDER_CREATED || ORDER_PAID || ORDER_CANCELLED"
	}
	in, err := inbox.New(db, cfg)
	if err != nil {
		return nil, err
	}
	if err := in.CreateSchema(ctx); err != nil {
		return nil, err
	}
	s := &pointsService{in: in, ordered: o.ordered, ran: make(chan error, 1)}
	// With Orderly, one goroutine per queue, in queue order, while the broker grants this
	// consumer the queue's lock: an order's events, all in one queue, are handled one after
	// another.
	s.c, err = inbox.NewConsumer(in, s.handle, inbox.ConsumerConfig{
		NameServers:  []string{o.namesrv},
		Topic:        o.topic,
		Tags:         tags,
		Orderly:      o.ordered,
		InstanceName: instance,
	})
	if err != nil {
		return nil, err
	}
	go func() { s.ran <- s.c.Run(ctx) }()
	return s, nil
}

// failed returns the consumer's error if it could not start (the topic does not exist, say):
// Run returns it at once.
func (s *pointsService) failed() error {
	select {
	case err := <-s.ran:
		s.ran <- err // for the next call
		return err
	default:
		return nil
	}
}

// shutdown stops the consumer; a delivery in progress finishes first.
func (s *pointsService) shutdown() { _ = s.c.Close() }

const errDuplicateKey = 1062

// handle is the effect of one event, in tx, the transaction in which the inbox has recorded
// the event's eventId: the points row for ORDER_CREATED and, with -ordered, the order's
// status. The inbox commits them with its record, or neither. A message that can never be
// processed is refused with outbox.Permanent, and the inbox rejects it; any other error
// rolls back, and the message is delivered again.
func (s *pointsService) handle(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
	if _, ok := life[msg.EventType]; !ok {
		return outbox.Permanent(fmt.Errorf("event type %.64q is not one of an order's", msg.EventType))
	}
	var ev orderCreated // every event's payload has the orderNo; ORDER_CREATED's has all this
	if err := json.Unmarshal(msg.Body, &ev); err != nil {
		return outbox.Permanent(fmt.Errorf("body is not an %s payload: %w", msg.EventType, err))
	}
	if ev.OrderNo == "" {
		return outbox.Permanent(errors.New("body has no orderNo"))
	}
	if msg.EventType == "ORDER_CREATED" {
		// The business table's own unique key is the last line: an order awarded under
		// another eventId (another group's award in this shared table, say) is not awarded
		// twice.
		_, err := tx.ExecContext(ctx, "INSERT INTO example_user_points (user_id, order_no, type, points) VALUES (?, ?, 'ORDER_CREATED', ?)",
			ev.UserID, ev.OrderNo, ev.Amount/10)
		var me *mysql.MySQLError
		if err != nil && !(errors.As(err, &me) && me.Number == errDuplicateKey) {
			return err
		}
	}
	if s.ordered {
		return follow(ctx, tx, msg.EventID, ev.OrderNo, msg.EventType)
	}
	return nil
}

// follow moves an order's status on to the event's, in the transaction in which the inbox
// records the event, and records the event in example_out_of_order if it is not the next
// one of the order's life (an earlier one has not arrived, or a later one came first). A
// second delivery of an event never gets here: the inbox suppresses it, by its eventId.
func follow(ctx context.Context, tx *sql.Tx, eventID, orderNo, eventType string) error {
	next := life[eventType]
	var found string
	var step int
	err := tx.QueryRowContext(ctx, "SELECT status, step FROM example_order_status WHERE order_no = ? FOR UPDATE", orderNo).Scan(&found, &step)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if next.step != step+1 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO example_out_of_order (msg_id, order_no, event_type, found, seen_at) VALUES (?, ?, ?, ?, NOW(3))",
			eventID, orderNo, eventType, found); err != nil {
			return err
		}
		log.Printf("points service: %s of order %s arrived out of order: the order was %q", eventType, orderNo, found)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO example_order_status (order_no, status, step, updated_at) VALUES (?, ?, ?, NOW(3))
	ON DUPLICATE KEY UPDATE status = VALUES(status), step = VALUES(step), updated_at = VALUES(updated_at)`, orderNo, next.status, next.step)
	return err
}

// checkLives reads what the points service made of an ordered run's n orders: how many of
// their events arrived out of order, and how many orders it left in another status than the
// order API did.
func checkLives(ctx context.Context, db *sql.DB, prefix string, n int) (outOfOrder, wrong int, err error) {
	if outOfOrder, err = countPrefix(ctx, db, "SELECT COUNT(*) FROM example_out_of_order WHERE order_no LIKE ?", prefix); err != nil {
		return 0, 0, err
	}
	rows, err := db.QueryContext(ctx, "SELECT order_no, status FROM example_order_status WHERE order_no LIKE ?", prefix+"%")
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var orderNo, status string
		if err := rows.Scan(&orderNo, &status); err != nil {
			return 0, 0, err
		}
		got[orderNo] = status
	}
	if err := rows.Err(); err != nil {
		return 0, 0, err
	}
	for i := range n {
		if got[fmt.Sprintf("%s%d", prefix, i)] != finalStatus(i) {
			wrong++
		}
	}
	return outOfOrder, wrong, nil
}

func countPrefix(ctx context.Context, db *sql.DB, query, prefix string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, query, prefix+"%").Scan(&n)
	return n, err
}
