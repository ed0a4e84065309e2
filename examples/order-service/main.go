// Command order-service is a service built on the outbox: an order API that writes each
// order and its event in one transaction, publishers that send the events to RocketMQ, and a
// points service that consumes them through an inbox and awards each order's points once,
// however often an event is delivered.
//
//	bash scripts/run-example.sh -orders 1000 -instances 3   # on a fresh Debian machine: the services too
//	go -C examples run ./order-service -dsn "$(bash scripts/mariadb.sh dsn)" -namesrv 127.0.0.1:9876
//
// It runs -instances instances of the service's publishing half (each with its own
// connection pool, store, RocketMQ sender and publisher, as separate processes would have),
// places -orders orders through them, and serves until Ctrl-C. With -check it waits instead
// until the points service has handled every event, checks the run (check.go) and exits,
// with status 1 if anything is wrong.
//
// -ordered publishes in key order: each order is created, paid and shipped, each change
// committed with its event, and an order's events are sent in that order, across topics (the
// store routes ORDER_SHIPPED to a topic of its own). The points service consumes orderly.
//
// -relay publishes through the binlog relay (docs/relay.md): each instance runs a relay
// beside its publisher; one relay leads and sends the events as their transactions commit,
// the other relays and the publishers stand by. The server needs its binary log on:
// --log-bin --binlog-format=ROW --binlog-row-metadata=FULL.
//
// -metrics-addr 127.0.0.1:9464 serves the publishers', relays' and inbox's metrics at /metrics.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
	"go.opentelemetry.io/otel/metric"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/relay"
)

type options struct {
	dsn, namesrv        string
	topic, shippedTopic string // the order events' topic; with -ordered, ORDER_SHIPPED's
	table, group        string // the outbox table; the points service's consumer group
	orders, instances   int
	ordered, relay      bool
	check               bool
	runID               string               // the prefix of this run's order numbers
	meter               metric.MeterProvider // with -metrics-addr, for the publishers', relays' and inbox's metrics
	out                 io.Writer
}

func main() {
	o := options{runID: "ORD-" + strconv.FormatInt(time.Now().UnixMilli(), 36) + "-", out: os.Stdout}
	flag.StringVar(&o.dsn, "dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	flag.StringVar(&o.namesrv, "namesrv", "127.0.0.1:9876", "RocketMQ name server")
	flag.StringVar(&o.topic, "topic", "ORDER_EVENT_TOPIC", "the order events' topic")
	flag.StringVar(&o.shippedTopic, "shipped-topic", "ORDER_SHIPPED_TOPIC", "with -ordered, ORDER_SHIPPED's topic")
	flag.StringVar(&o.table, "table", "t_event_record", "the outbox table")
	flag.StringVar(&o.group, "group", "example_points_service", "the points service's consumer group")
	flag.IntVar(&o.orders, "orders", 1000, "orders to place")
	flag.IntVar(&o.instances, "instances", 3, "instances of the service, each with its own publisher")
	flag.BoolVar(&o.ordered, "ordered", false, "key order: each order created, paid and shipped, its events sent and consumed in order")
	flag.BoolVar(&o.relay, "relay", false, "publish through the binlog relay (the server needs --log-bin --binlog-format=ROW --binlog-row-metadata=FULL)")
	flag.BoolVar(&o.check, "check", false, "wait until every event is handled, check the run and exit (status 1 if anything is wrong)")
	metricsAddr := flag.String("metrics-addr", "", "serve the metrics at http://ADDR/metrics (a loopback address, e.g. 127.0.0.1:9464)")
	flag.Parse()
	if o.orders < 1 || o.instances < 1 {
		log.Fatal("-orders and -instances must be at least 1")
	}
	outbox.RouteRocketMQClientLogs(slog.Default()) // once, before any RocketMQ client starts
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *metricsAddr != "" {
		ms, err := startMetrics(*metricsAddr)
		if err != nil {
			log.Fatal(err)
		}
		defer ms.close()
		o.meter = ms.provider
		fmt.Fprintf(o.out, "metrics: %s\n", ms.url)
	}
	if err := run(ctx, o); err != nil {
		log.Fatal(err)
	}
}

// run runs the service: the points service, the instances, and the orders.
func run(ctx context.Context, o options) error {
	db, err := openDB(o.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := createTables(ctx, db, o); err != nil {
		return err
	}

	// The consuming half, as another service would run it.
	points, err := startPointsService(ctx, db, o)
	if err != nil {
		return err
	}
	defer points.Close()

	// The publishing half: in a real deployment, each instance is a process of its own.
	var instances []*instance
	defer func() {
		for _, in := range instances {
			in.close()
		}
	}()
	for i := range o.instances {
		in, err := startInstance(ctx, o, i)
		if err != nil {
			return err
		}
		instances = append(instances, in)
	}
	if o.relay {
		// A relay follows the binlog: one leads before the first order, or the publishers,
		// not yet standing by, would send it.
		if err := awaitLeader(ctx, instances); err != nil {
			return err
		}
	}

	// The order API: each order through one of the instances, as a load balancer would
	// spread the requests.
	start := time.Now()
	for i := range o.orders {
		if err := placeOrder(ctx, instances[i%len(instances)].store, o, i); err != nil {
			return err
		}
	}
	fmt.Fprintf(o.out, "placed %d orders through %d instances in %s\n", o.orders, len(instances), time.Since(start).Round(time.Millisecond))
	if o.check {
		return check(ctx, db, o, start)
	}
	fmt.Fprintln(o.out, "serving until Ctrl-C")
	<-ctx.Done()
	return nil
}

// openDB opens a connection pool on dsn, with parseTime, which the inbox needs.
func openDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse -dsn: %w", err)
	}
	cfg.ParseTime = true
	return sql.Open("mysql", cfg.FormatDSN())
}

// storeConfig is the outbox store's configuration, the same in every instance.
func storeConfig(o options) outbox.MySQLConfig {
	cfg := outbox.MySQLConfig{Table: o.table, Routes: outbox.Routes{Topic: o.topic}}
	if o.ordered {
		// Each order's events sent in the order they were committed, whatever their topics.
		cfg.Ordering = outbox.KeyOrder
		cfg.Routes.Topics = []string{o.shippedTopic}
		cfg.Routes.ByType = map[string]string{"ORDER_SHIPPED": o.shippedTopic}
	}
	if o.relay {
		// The publishers stand by while a relay leads, and take over should it go silent.
		cfg.RelayTable = relay.DefaultCheckpointTable
	}
	return cfg
}

// createTables creates what is missing: the relay's checkpoint table with -relay, the
// outbox table, the orders and the points service's ledger (the inbox's tables are the
// points service's to create).
func createTables(ctx context.Context, db *sql.DB, o options) error {
	if o.relay {
		if err := relay.CreateSchema(ctx, db, relay.Config{}); err != nil {
			return err
		}
	}
	store, err := outbox.NewMySQLStore(db, storeConfig(o))
	if err != nil {
		return err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return err
	}
	for _, q := range []string{
		`CREATE TABLE IF NOT EXISTS example_orders (order_no VARCHAR(64) NOT NULL PRIMARY KEY,
			user_id BIGINT NOT NULL, amount INT NOT NULL, status VARCHAR(16) NOT NULL)`,
		// A row per award, and no unique key on the order: the inbox alone makes each award
		// once in a consumer group, and -check counts the rows. (Another group is another
		// points service, which awards the orders whose events it consumes again.)
		`CREATE TABLE IF NOT EXISTS example_points (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
			order_no VARCHAR(64) NOT NULL, user_id BIGINT NOT NULL, points INT NOT NULL,
			paid BOOLEAN NOT NULL DEFAULT FALSE, KEY idx_order_no (order_no))`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("create the example's tables: %w", err)
		}
	}
	return nil
}

// instance is one instance of the publishing half: a connection pool, the outbox store, a
// RocketMQ sender and a publisher, and with -relay a relay beside the publisher.
type instance struct {
	db    *sql.DB
	store *outbox.MySQLStore
	pub   *outbox.Publisher
	relay *relay.Relay
}

// startInstance starts the i-th instance. A publisher's and a relay's Start return what
// keeps them from running (a table that cannot serve the store, a topic that does not exist,
// a server without the binlog a relay needs) before anything runs.
func startInstance(ctx context.Context, o options, i int) (*instance, error) {
	in := &instance{}
	if err := in.start(ctx, o, i); err != nil {
		in.close()
		return nil, err
	}
	return in, nil
}

func (in *instance) start(ctx context.Context, o options, i int) error {
	var err error
	if in.db, err = openDB(o.dsn); err != nil {
		return err
	}
	cfg := storeConfig(o)
	if in.store, err = outbox.NewMySQLStore(in.db, cfg); err != nil {
		return err
	}
	id := fmt.Sprintf("order-%d-%s", i, outbox.DefaultInstanceID()) // unique per publisher
	sender, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{NameServers: []string{o.namesrv}, InstanceName: id})
	if err != nil {
		return err
	}
	if in.pub, err = outbox.NewPublisher(in.store, sender, outbox.Config{InstanceID: id, MeterProvider: o.meter}); err != nil {
		_ = sender.Close() // given to no publisher
		return err
	}
	if o.relay {
		// The relay sends through the publisher's sender, with the store's ordering and
		// routes, and marks the rows it sends with its own InstanceID.
		in.relay, err = relay.New(o.dsn, sender, relay.Config{Table: o.table, Ordering: cfg.Ordering, Routes: cfg.Routes,
			InstanceID: fmt.Sprintf("relay-%d-%s", i, outbox.DefaultInstanceID()), MeterProvider: o.meter})
		if err != nil {
			return err
		}
		if err := in.relay.Start(ctx); err != nil {
			return err
		}
	}
	return in.pub.Start(ctx)
}

// close stops the relay (a leader hands the table back to the publishers), then the
// publisher, which records its sends in flight and closes the sender.
func (in *instance) close() {
	if in.relay != nil {
		_ = in.relay.Close()
	}
	if in.pub != nil {
		_ = in.pub.Close()
	}
	if in.db != nil {
		_ = in.db.Close()
	}
}

// awaitLeader waits until one of the instances' relays leads the table.
func awaitLeader(ctx context.Context, instances []*instance) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		for _, in := range instances {
			if in.relay.Health().Leader {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no relay leads: %w (last error: %s)", ctx.Err(), instances[0].relay.Health().LastError)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// order is an order as the order API keeps it, and the payload of its events.
type order struct {
	OrderNo string `json:"orderNo"`
	UserID  int    `json:"userId"`
	Amount  int    `json:"amount"`
	Status  string `json:"status"`
}

// placeOrder is the i-th order's requests to the order API: it is created and, with
// -ordered, paid and shipped.
func placeOrder(ctx context.Context, store *outbox.MySQLStore, o options, i int) error {
	ord := order{OrderNo: o.runID + strconv.Itoa(i), UserID: 1000 + i%50, Amount: 100 + i%900}
	statuses := []string{"CREATED"}
	if o.ordered {
		statuses = append(statuses, "PAID", "SHIPPED")
	}
	for _, status := range statuses {
		ord.Status = status
		if err := saveOrder(ctx, store, ord); err != nil {
			return fmt.Errorf("order %s, %s: %w", ord.OrderNo, ord.Status, err)
		}
	}
	return nil
}

// saveOrder writes the order in its new status and the event that says so (ORDER_CREATED,
// ORDER_PAID, ORDER_SHIPPED) in one transaction: both or neither.
func saveOrder(ctx context.Context, store *outbox.MySQLStore, ord order) error {
	payload, err := json.Marshal(ord)
	if err != nil {
		return err
	}
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, `INSERT INTO example_orders (order_no, user_id, amount, status) VALUES (?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE status = VALUES(status)`, ord.OrderNo, ord.UserID, ord.Amount, ord.Status); err != nil {
		return err
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: ord.OrderNo, EventType: "ORDER_" + ord.Status, Payload: payload}); err != nil {
		return err
	}
	return tx.Commit() // wakes this store's publisher: the event goes within milliseconds
}
