package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// The whole life of an event: the order and its event are written in one transaction, and
// a Publisher, running in every instance of the service, sends the event once the
// transaction commits.
func Example() {
	db := exampleDB() // test plumbing: the server the tests use; a service opens its own
	defer db.Close()
	ctx := context.Background()

	// A table of its own, so that runs never collide; a service keeps the default name.
	suffix := time.Now().UnixNano()
	orders, events := fmt.Sprintf("orders_%d", suffix), fmt.Sprintf("events_%d", suffix)
	if _, err := db.ExecContext(ctx, "CREATE TABLE "+orders+" (order_no VARCHAR(64) PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	defer db.ExecContext(ctx, "DROP TABLE "+orders) //nolint:errcheck // the example's own tables
	defer db.ExecContext(ctx, "DROP TABLE "+events) //nolint:errcheck

	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: events})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	// At startup: publish until the service shuts down.
	sent := make(chan struct{}, 1)
	sender := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		fmt.Println("sent", ev.EventType, ev.BizNo) // a RocketMQSender in production
		sent <- struct{}{}
		return nil
	})
	publisher, err := outbox.NewPublisher(store, sender, outbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close() // stops the publisher, waits for its last sends, closes the sender

	// In the order API: the order and its event commit or roll back together.
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (order_no) VALUES (?)", "ORD-1"); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{
		BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{"orderNo":"ORD-1"}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil { // wakes the publisher
		log.Fatal(err)
	}

	// At shutdown: Close returns once the outcome of the last send is recorded.
	<-sent
	if err := publisher.Close(); err != nil {
		log.Fatal(err)
	}
	var status string
	if err := db.QueryRowContext(ctx, "SELECT status FROM "+events+" WHERE biz_no = ?", "ORD-1").Scan(&status); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ORD-1", status)
	// Output:
	// sent ORDER_CREATED ORD-1
	// ORD-1 SUCCESS
}

func ExampleDefaultBackoff() {
	for n := 1; n <= 3; n++ {
		fmt.Printf("retry %d after %s\n", n, outbox.DefaultBackoff(n))
	}
	// Output:
	// retry 1 after 5s
	// retry 2 after 20s
	// retry 3 after 45s
}

// A Sender marks the errors no retry can fix, so the event is dead-lettered at once.
func ExamplePermanent() {
	errTooLarge := errors.New("message body over 4 MiB")
	err := fmt.Errorf("send event 7: %w", outbox.Permanent(errTooLarge))
	fmt.Println(outbox.IsPermanent(err), errors.Is(err, errTooLarge))
	fmt.Println(outbox.IsPermanent(errors.New("broker busy")))
	// Output:
	// true true
	// false
}

// Zero fields take the article's defaults; a negative one is refused up front.
func ExampleNewPublisher_invalidConfig() {
	store := &outbox.MySQLStore{}
	sender := outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil })
	_, err := outbox.NewPublisher(store, sender, outbox.Config{Tuning: outbox.Tuning{Lease: 500 * time.Millisecond}})
	fmt.Println(err)
	// Output:
	// outbox: invalid config: Tuning.Lease must be at least 1s, got 500ms
}

// exampleDB opens the database the tests use (OUTBOX_TEST_MYSQL_DSN), for the examples.
func exampleDB() *sql.DB {
	dsn := os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	if dsn == "" {
		log.Fatal("set OUTBOX_TEST_MYSQL_DSN to a MySQL DSN, e.g. root@tcp(127.0.0.1:3306)/test?parseTime=true")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	return db
}
