package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// The whole life of an event: written with the order in one transaction, then published by
// a Publisher running in every instance of the service.
func Example() {
	db, err := sql.Open("mysql", "root@tcp(127.0.0.1:3306)/shop?parseTime=true")
	if err != nil {
		log.Fatal(err)
	}
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	// In the order API: the order and its event commit or roll back together.
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (order_no, user_id) VALUES (?, ?)", "ORD-1", 42); err != nil {
		log.Fatal(err)
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{
		BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{"orderNo":"ORD-1","userId":42}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// At startup: publish until the service shuts down.
	sender := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		fmt.Println("send", ev.ID, ev.EventType) // a RocketMQ sender in production
		return nil
	})
	publisher, err := outbox.NewPublisher(store, sender, outbox.Config{
		Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil)),
		OnDeadLetter: func(ctx context.Context, ev outbox.Event, cause error) {
			log.Printf("ALERT: dead letter id=%d event_id=%s biz_no=%s: %v", ev.ID, ev.EventID, ev.BizNo, cause)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Run(ctx); err != nil {
		log.Fatal(err)
	}
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
	_, err := outbox.NewPublisher(store, sender, outbox.Config{Lease: time.Minute, SendTimeout: 10 * time.Second})
	fmt.Println(err)
	// Output:
	// outbox: invalid config: SendTimeout (10s) must be at most a tenth of Lease (1m0s), or a slow send outlives its lease and is sent twice
}
