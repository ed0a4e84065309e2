package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// With MySQLConfig.Ordering set to KeyOrder, the events of one biz no go in the order they
// were written, even when a send fails: the later events of the order wait for its retry.
func ExampleMySQLConfig_ordering() {
	db := exampleDB() // test plumbing: the server the tests use; a service opens its own
	defer db.Close()
	ctx := context.Background()

	// A table of its own, so that runs never collide; a service keeps the default name.
	table := fmt.Sprintf("events_%d", time.Now().UnixNano())
	defer db.ExecContext(ctx, "DROP TABLE "+table) //nolint:errcheck // the example's own table
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table, Ordering: outbox.KeyOrder})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil { // with the index ordered claims need
		log.Fatal(err)
	}

	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	for _, typ := range []string{"ORDER_CREATED", "ORDER_PAID", "ORDER_SHIPPED"} {
		if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-7", EventType: typ, Payload: []byte(`{}`)}); err != nil {
			log.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	// The first send of ORDER_PAID fails; ORDER_SHIPPED is not sent before it.
	failed := false
	sent := make(chan struct{}, 3)
	sender := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		if ev.EventType == "ORDER_PAID" && !failed {
			failed = true
			fmt.Println("failed", ev.EventType, ev.BizNo)
			return errors.New("send timed out")
		}
		fmt.Println("sent", ev.EventType, ev.BizNo)
		sent <- struct{}{}
		return nil
	})
	publisher, err := outbox.NewPublisher(store, sender, outbox.Config{
		Backoff:      func(int) time.Duration { return 100 * time.Millisecond }, // retry soon, for the example
		PollInterval: 100 * time.Millisecond,                                    // and look for due events as often
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close() // stops the publisher, waits for its last sends, closes the sender
	for range 3 {
		<-sent
	}
	// Output:
	// sent ORDER_CREATED ORD-7
	// failed ORDER_PAID ORD-7
	// sent ORDER_PAID ORD-7
	// sent ORDER_SHIPPED ORD-7
}
