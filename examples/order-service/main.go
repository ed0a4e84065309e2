// Command order-service is the outbox end to end: an order API that writes each order and its
// ORDER_CREATED event in one transaction, N publisher instances sending the events to
// RocketMQ, and a points service consuming them idempotently.
//
// On a fresh Debian machine, one command sets up MariaDB and RocketMQ and runs it:
//
//	bash scripts/run-example.sh -orders 1000 -instances 3
//
// With the services already running:
//
//	go run ./examples/order-service -dsn "$(bash scripts/mariadb.sh dsn)" -namesrv 127.0.0.1:9876
//
// -duplicate N makes the first publisher lose the acknowledgement of N sends (the broker got
// the message, the publisher records a failure), so those events are sent twice: the consumer
// must suppress the duplicates and still award each order's points exactly once.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

type options struct {
	dsn, namesrv, topic string
	orders, instances   int
	duplicate           int
	timeout             time.Duration
	verbose             bool
}

func main() {
	var o options
	flag.StringVar(&o.dsn, "dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	flag.StringVar(&o.namesrv, "namesrv", "127.0.0.1:9876", "RocketMQ name server")
	flag.StringVar(&o.topic, "topic", outbox.TopicDefault, "RocketMQ topic")
	flag.IntVar(&o.orders, "orders", 1000, "orders to create")
	flag.IntVar(&o.instances, "instances", 3, "publisher instances")
	flag.IntVar(&o.duplicate, "duplicate", 5, "sends whose acknowledgement the first publisher loses, to show the consumer suppressing duplicates")
	flag.DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long")
	flag.BoolVar(&o.verbose, "v", false, "log every publisher event")
	flag.Parse()
	if o.orders < 1 || o.instances < 1 || o.duplicate < 0 {
		log.Fatal("-orders and -instances must be at least 1, -duplicate at least 0")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	lost, err := run(ctx, o)
	if err != nil {
		log.Fatal(err)
	}
	if lost != 0 {
		os.Exit(1)
	}
}

const schema = `
CREATE TABLE IF NOT EXISTS example_orders (
	order_no VARCHAR(64) NOT NULL PRIMARY KEY,
	user_id  BIGINT      NOT NULL,
	amount   INT         NOT NULL
);
-- the points service's record of every message it has processed: uk_msg_id is the guard
-- against a second delivery of the same event
CREATE TABLE IF NOT EXISTS example_consumed_message (
	msg_id      VARCHAR(64) NOT NULL,
	consumed_at DATETIME(3) NOT NULL,
	UNIQUE KEY uk_msg_id (msg_id)
);
-- the business table's own unique key is the last line: one award per order and type
CREATE TABLE IF NOT EXISTS example_user_points (
	id       BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
	user_id  BIGINT      NOT NULL,
	order_no VARCHAR(64) NOT NULL,
	type     VARCHAR(32) NOT NULL,
	points   INT         NOT NULL,
	UNIQUE KEY uk_order_type (order_no, type)
)`

func openDB(dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse -dsn: %w", err)
	}
	cfg.ParseTime, cfg.MultiStatements = true, true
	return sql.Open("mysql", cfg.FormatDSN())
}

func run(ctx context.Context, o options) (lost int, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	db, err := openDB(o.dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{})
	if err != nil {
		return 0, err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return 0, err
	}
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return 0, fmt.Errorf("create example tables: %w", err)
	}
	runID := strconv.FormatInt(time.Now().UnixMilli(), 36)
	prefix := "ORD-" + runID + "-"

	points, err := startPointsService(ctx, db, o, prefix)
	if err != nil {
		return 0, err
	}
	defer points.shutdown()

	start := time.Now()
	if err := createOrders(ctx, store, prefix, o.orders); err != nil {
		return 0, err
	}
	fmt.Printf("order API: created %d orders, each with its event, in one transaction per order\n", o.orders)

	pubCtx, stopPublishers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var lostAcks atomic.Int64 // acknowledgements the first instance dropped on purpose
	for i := range o.instances {
		p, closeSender, err := newInstance(o, i, &lostAcks)
		if err != nil {
			stopPublishers()
			wg.Wait()
			return 0, err
		}
		wg.Go(func() {
			defer closeSender()
			_ = p.Run(pubCtx)
		})
	}

	// Done when every order has its points, every event is published, and every delivery
	// (the duplicates included) has reached the points service.
	awarded, published := 0, 0
	for ctx.Err() == nil {
		if awarded, err = countPrefix(ctx, db, "SELECT COUNT(*) FROM example_user_points WHERE order_no LIKE ?", prefix); err != nil {
			break
		}
		if published, err = countPrefix(ctx, db, "SELECT COUNT(*) FROM t_event_record WHERE status = 'SUCCESS' AND biz_no LIKE ?", prefix); err != nil {
			break
		}
		if awarded >= o.orders && published >= o.orders && points.consumed.Load() >= int64(o.orders)+lostAcks.Load() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(start)
	stopPublishers()
	wg.Wait()
	if err != nil {
		return 0, err
	}

	lost = o.orders - awarded
	fmt.Printf("\nsummary (%d publisher instances, %s)\n", o.instances, elapsed.Round(time.Millisecond))
	fmt.Printf("  orders created        %6d\n", o.orders)
	fmt.Printf("  events published      %6d\n", published)
	fmt.Printf("  messages consumed     %6d\n", points.consumed.Load())
	fmt.Printf("  duplicates suppressed %6d\n", points.duplicates.Load())
	fmt.Printf("  points awarded        %6d\n", awarded)
	fmt.Printf("  lost                  %6d\n", lost)
	if published < o.orders {
		return lost, fmt.Errorf("%d events still unpublished after %s", o.orders-published, o.timeout)
	}
	return lost, nil
}

func createOrders(ctx context.Context, store *outbox.MySQLStore, prefix string, n int) error {
	for i := range n {
		orderNo := fmt.Sprintf("%s%d", prefix, i)
		userID := 1000 + i%50
		if err := createOrder(ctx, store, orderNo, userID, 100+i%900); err != nil {
			return fmt.Errorf("create order %s: %w", orderNo, err)
		}
	}
	return nil
}

// orderCreated is the ORDER_CREATED event's payload.
type orderCreated struct {
	OrderNo string `json:"orderNo"`
	UserID  int    `json:"userId"`
	Amount  int    `json:"amount"`
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

// newInstance is one instance of the order-service: its own connection pool, producer and
// publisher, as a separate process would have.
func newInstance(o options, i int, lostAcks *atomic.Int64) (*outbox.Publisher, func(), error) {
	db, err := openDB(o.dsn)
	if err != nil {
		return nil, nil, err
	}
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{})
	if err != nil {
		return nil, nil, err
	}
	instanceID := fmt.Sprintf("order-%d-%s", i, outbox.DefaultInstanceID())
	rmq, err := outbox.NewRocketMQSender(outbox.RocketMQConfig{
		NameServers:  []string{o.namesrv},
		Topic:        o.topic,
		InstanceName: instanceID,
	})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	var sender outbox.Sender = rmq
	if i == 0 && o.duplicate > 0 {
		sender = &lossyAcks{Sender: rmq, left: int64(o.duplicate), lost: lostAcks}
	}
	level := slog.LevelError
	if o.verbose {
		level = slog.LevelDebug
	}
	p, err := outbox.NewPublisher(store, sender, outbox.Config{
		InstanceID:   instanceID,
		PollInterval: 100 * time.Millisecond,
		Backoff:      outbox.ConstantBackoff(200 * time.Millisecond), // a demo need not wait 5 s
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("instance", i),
		OnDeadLetter: func(_ context.Context, ev outbox.Event, cause error) {
			fmt.Fprintf(os.Stderr, "ALERT: event %d (%s) dead-lettered: %v\n", ev.ID, ev.BizNo, cause)
		},
	})
	if err != nil {
		_ = rmq.Close()
		_ = db.Close()
		return nil, nil, err
	}
	return p, func() { _ = rmq.Close(); _ = db.Close() }, nil
}

// lossyAcks sends for real, then reports failure for the first few sends: the broker has the
// message but the publisher believes the send failed, so it sends the event again later. It
// is a plain Sender, so its instance sends one event at a time even in batch mode.
type lossyAcks struct {
	outbox.Sender
	left int64
	lost *atomic.Int64
	mu   sync.Mutex
}

func (l *lossyAcks) Send(ctx context.Context, ev outbox.Event) error {
	if err := l.Sender.Send(ctx, ev); err != nil {
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

// pointsService awards points for ORDER_CREATED, idempotently.
type pointsService struct {
	db                   *sql.DB
	prefix               string
	consumed, duplicates atomic.Int64
	consumer             rocketmq.PushConsumer
}

func startPointsService(ctx context.Context, db *sql.DB, o options, prefix string) (*pointsService, error) {
	s := &pointsService{db: db, prefix: prefix}
	// A fixed group, as a real service has: it resumes where the last run stopped.
	c, err := rocketmq.NewPushConsumer(
		consumer.WithNameServer([]string{o.namesrv}),
		consumer.WithGroupName("example_points_service"),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	)
	if err != nil {
		return nil, err
	}
	err = c.Subscribe(o.topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "ORDER_CREATED"},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			for _, m := range msgs {
				if err := s.handle(ctx, m); err != nil {
					log.Printf("points service: %v (will be redelivered)", err)
					return consumer.ConsumeRetryLater, nil
				}
			}
			return consumer.ConsumeSuccess, nil
		})
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, fmt.Errorf("start consumer (is the topic %s created?): %w", o.topic, err)
	}
	s.consumer = c
	return s, nil
}

func (s *pointsService) shutdown() { _ = s.consumer.Shutdown() }

const errDuplicateKey = 1062

// handle awards the order's points once, whatever the number of deliveries: the eventId
// pre-check, the consumed-message row (uk_msg_id) and the points row (uk_order_type) are
// written in one transaction, and either unique key turns a duplicate into a no-op.
func (s *pointsService) handle(ctx context.Context, m *primitive.MessageExt) error {
	msgID, orderNo := m.GetProperty(outbox.PropertyEventID), m.GetProperty(outbox.PropertyBizNo)
	mine := len(orderNo) >= len(s.prefix) && orderNo[:len(s.prefix)] == s.prefix
	if mine {
		s.consumed.Add(1)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var seen int
	if err := tx.QueryRowContext(ctx, "SELECT COUNT(*) FROM example_consumed_message WHERE msg_id = ?", msgID).Scan(&seen); err != nil {
		return err
	}
	if seen > 0 {
		if mine {
			s.duplicates.Add(1)
		}
		return nil
	}
	var me *mysql.MySQLError
	_, err = tx.ExecContext(ctx, "INSERT INTO example_consumed_message (msg_id, consumed_at) VALUES (?, NOW(3))", msgID)
	if errors.As(err, &me) && me.Number == errDuplicateKey { // a concurrent duplicate won
		if mine {
			s.duplicates.Add(1)
		}
		return nil
	}
	if err != nil {
		return err
	}
	var ev orderCreated
	if err := json.Unmarshal(m.Body, &ev); err != nil {
		return fmt.Errorf("message %s: bad body %q: %w", msgID, m.Body, err)
	}
	_, err = tx.ExecContext(ctx, "INSERT INTO example_user_points (user_id, order_no, type, points) VALUES (?, ?, 'ORDER_CREATED', ?)",
		ev.UserID, ev.OrderNo, ev.Amount/10)
	if errors.As(err, &me) && me.Number == errDuplicateKey {
		if mine {
			s.duplicates.Add(1)
		}
		return nil
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

func countPrefix(ctx context.Context, db *sql.DB, query, prefix string) (int, error) {
	var n int
	err := db.QueryRowContext(ctx, query, prefix+"%").Scan(&n)
	return n, err
}
