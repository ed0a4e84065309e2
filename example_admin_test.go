package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// An operator's repair: the consumer rejected an event, which was dead-lettered at once;
// once the consumer is fixed, the operator finds the dead letters and requeues them.
func ExampleAdmin_Requeue() {
	db := exampleDB() // test plumbing: the server the tests use; a service opens its own
	defer db.Close()
	ctx := context.Background()

	// A table of its own, so that runs never collide; a service keeps the default name.
	table := fmt.Sprintf("events_%d", time.Now().UnixNano())
	defer db.ExecContext(ctx, "DROP TABLE "+table) //nolint:errcheck // the example's own table
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}

	var fixed atomic.Bool // whether the consumer takes ORDER_PAID yet
	sent := make(chan struct{}, 1)
	sender := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		if !fixed.Load() {
			// No retry can fix this: the event is dead-lettered at once.
			return outbox.Permanent(errors.New("consumer rejected the payload"))
		}
		fmt.Println("sent", ev.EventType, ev.BizNo)
		sent <- struct{}{}
		return nil
	})
	dead := make(chan struct{}, 1)
	publisher, err := outbox.NewPublisher(store, sender, outbox.Config{
		OnDeadLetter: func(ctx context.Context, ev outbox.Event, cause error) {
			fmt.Println("dead letter", ev.EventType, ev.BizNo, ev.Status) // alert a person here
			dead <- struct{}{}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close() // stops the publisher, waits for its last sends, closes the sender

	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-9", EventType: "ORDER_PAID", Payload: []byte(`{}`)}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	<-dead

	// The operator, once the consumer is fixed (outboxctl does the same from a shell).
	fixed.Store(true)
	admin := outbox.NewAdmin(store)
	failed, err := admin.List(ctx, outbox.Filter{Status: outbox.StatusFail})
	if err != nil {
		log.Fatal(err)
	}
	for _, ev := range failed {
		fmt.Println("requeue", ev.EventType, ev.BizNo)
		if err := admin.Requeue(ctx, ev.ID); err != nil { // wakes the publisher
			log.Fatal(err)
		}
	}
	<-sent
	// Output:
	// dead letter ORDER_PAID ORD-9 FAIL
	// requeue ORDER_PAID ORD-9
	// sent ORDER_PAID ORD-9
}

// An operator holds the event id a consumer logged (its eventId property, what InsertEvent
// returned) and finds the event by it; its ID then names it to Requeue and Skip.
func ExampleAdmin_GetByEventID() {
	db := exampleDB() // test plumbing: the server the tests use; a service opens its own
	defer db.Close()
	ctx := context.Background()

	table := fmt.Sprintf("events_%d", time.Now().UnixNano())
	defer db.ExecContext(ctx, "DROP TABLE "+table) //nolint:errcheck // the example's own table
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(ctx); err != nil {
		log.Fatal(err)
	}
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	eventID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-9", EventType: "ORDER_PAID", Payload: []byte(`{}`)})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	admin := outbox.NewAdmin(store)
	ev, err := admin.GetByEventID(ctx, eventID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ev.EventType, ev.BizNo, ev.Status) // a FAIL one: admin.Requeue(ctx, ev.ID)

	_, err = admin.GetByEventID(ctx, "0190b1d2-7c4e-7a3b-9f00-1c2d3e4f5a6b")
	fmt.Println("unknown:", errors.Is(err, outbox.ErrNotFound))
	_, err = admin.GetByEventID(ctx, "ORD-9")
	fmt.Println("not an event id:", errors.Is(err, outbox.ErrInvalidInput))
	// Output:
	// ORDER_PAID ORD-9 WAIT
	// unknown: true
	// not an event id: true
}
