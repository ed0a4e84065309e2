package inboxtest_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"fmt"
	"log"
	"log/slog"
	"os"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/inbox/inboxtest"
	"github.com/go-outbox/outbox/outboxtest"
)

// awardPoints is the consumer's handler under test: it awards an order's points in the
// inbox's transaction.
func awardPoints(ctx context.Context, tx *sql.Tx, msg *inbox.Message) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+pointsTable+" (order_no, points) VALUES (?, 10)", msg.BizNo)
	return err
}

// A consumer's handler against the real database: its first delivery is handled, the same
// message delivered again and the event sent again are duplicates, and the points are
// awarded once.
func ExampleDeliver() {
	db, drop := exampleInbox() // test plumbing: the inbox's and the points' tables on the tests' database
	defer drop()
	ctx := context.Background()
	in, err := inbox.New(db, inbox.Config{Group: "points_service", Table: inboxTable})
	if err != nil {
		log.Fatal(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	ev := outbox.Event{EventID: "0198c0de-0000-7000-8000-000000000001", BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{}`)}
	msg := inboxtest.Message(ev)
	fmt.Println(inboxtest.Deliver(ctx, in, awardPoints, msg).Outcome)
	fmt.Println(inboxtest.Deliver(ctx, in, awardPoints, inboxtest.Redelivery(msg)).Outcome)
	fmt.Println(inboxtest.Deliver(ctx, in, awardPoints, inboxtest.Message(ev)).Outcome)
	fmt.Println("points rows:", countRows(db, pointsTable))
	// Output:
	// handled
	// duplicate
	// duplicate
	// points rows: 1
}

// The whole path in one process, with no broker: the service's transaction writes the
// event, a real publisher sends it to a MemorySender whose first answer is lost (so it
// sends the event twice), and DeliverAll hands both copies to the consumer's handler.
func ExampleDeliverAll() {
	db, drop := exampleInbox()
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: eventsTable})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(db, inbox.Config{Group: "points_service", Table: inboxTable})
	if err != nil {
		log.Fatal(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.LoseAnswer(1, nil)
	publisher, err := outbox.NewPublisher(store, faulty, outbox.Config{
		PollInterval: 10 * time.Millisecond, Backoff: func(int) time.Duration { return 0 }, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close()

	tx, err := store.BeginTx(ctx, nil) // the service's transaction
	if err != nil {
		log.Fatal(err)
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	evs, err := sent.WaitFor(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	ds, err := inboxtest.DeliverAll(ctx, in, awardPoints, evs)
	if err != nil {
		log.Fatal(err)
	}
	for _, d := range ds {
		fmt.Println(d.Event.BizNo, d.Outcome)
	}
	fmt.Println("points rows:", countRows(db, pointsTable))
	// Output:
	// ORD-1 handled
	// ORD-1 duplicate
	// points rows: 1
}

// A consumer in the background: what the publisher sends is delivered to the handler as
// it is sent, and the test waits for the deliveries.
func ExampleConsume() {
	db, drop := exampleInbox()
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: eventsTable})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	in, err := inbox.New(db, inbox.Config{Group: "points_service", Table: inboxTable})
	if err != nil {
		log.Fatal(err)
	}
	if err := in.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	sent := outboxtest.NewMemorySender()
	publisher, err := outbox.NewPublisher(store, sent, outbox.Config{PollInterval: 10 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close()
	c := inboxtest.Consume(in, awardPoints, sent)
	defer c.Close()

	for _, no := range []string{"ORD-1", "ORD-2"} { // the service's transactions
		tx, err := store.BeginTx(ctx, nil)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: no, EventType: "ORDER_CREATED", Payload: []byte(`{}`)}); err != nil {
			log.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
	}

	ds, err := c.WaitFor(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(inboxtest.Count(ds, inbox.Handled), "handled; points rows:", countRows(db, pointsTable))
	// Output:
	// 2 handled; points rows: 2
}

// The examples' tables, of their own for each run of the tests.
var (
	suffix      = strings.ToLower(rand.Text())
	pointsTable = "t_points_" + suffix
	inboxTable  = "t_inbox_" + suffix
	eventsTable = "t_events_" + suffix
)

// exampleInbox opens the database the tests use (OUTBOX_TEST_MYSQL_DSN) and makes the
// points table; the function it returns drops every table of the example.
func exampleInbox() (*sql.DB, func()) {
	dsn := os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	if dsn == "" {
		log.Fatal("set OUTBOX_TEST_MYSQL_DSN to a MySQL DSN, e.g. root@tcp(127.0.0.1:3306)/test?parseTime=true")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE " + pointsTable + " (id BIGINT AUTO_INCREMENT PRIMARY KEY, order_no VARCHAR(64) NOT NULL, points INT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	return db, func() {
		for _, table := range []string{pointsTable, inboxTable, inboxTable + "_rejected", eventsTable} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + table)
		}
		_ = db.Close()
	}
}

func countRows(db *sql.DB, table string) int {
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}
