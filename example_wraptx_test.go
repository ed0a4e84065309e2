package outbox_test

import (
	"context"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// A service that already has its transaction (from database/sql, or from an ORM) writes its
// events in it through WrapTx.
func ExampleMySQLStore_WrapTx() {
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
	sent := make(chan struct{}, 2)
	sender := outbox.SenderFunc(func(ctx context.Context, ev outbox.Event) error {
		fmt.Println("sent", ev.EventType, ev.BizNo)
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

	// The caller's own transaction, committed through the Tx WrapTx returns: the commit
	// wakes the publisher, as a commit of a transaction from BeginTx does.
	sqlTx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	// ... the business statements, through sqlTx ...
	tx := store.WrapTx(sqlTx)
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{
		BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte(`{"orderNo":"ORD-1"}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	<-sent

	// An ORM that commits the *sql.Tx itself: call Notify after its commit, or the event
	// waits for the publisher's next poll (Config.PollInterval, 5 s by default).
	sqlTx, err = db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	// ... the ORM's statements ...
	if _, err := store.WrapTx(sqlTx).InsertEvent(ctx, outbox.EventInput{
		BizNo: "ORD-1", EventType: "ORDER_PAID", Payload: []byte(`{"orderNo":"ORD-1"}`),
	}); err != nil {
		log.Fatal(err)
	}
	if err := sqlTx.Commit(); err != nil { // the ORM's commit
		log.Fatal(err)
	}
	store.Notify()
	<-sent
	// Output:
	// sent ORDER_CREATED ORD-1
	// sent ORDER_PAID ORD-1
}
