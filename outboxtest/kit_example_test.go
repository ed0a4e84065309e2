package outboxtest_test

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
	"github.com/go-outbox/outbox/outboxtest"
)

// placeOrder is the service's code under test: its business transaction writes the order's
// event (and, in a real service, the order itself).
func placeOrder(ctx context.Context, store *outbox.MySQLStore, orderNo string) error {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{
		BizNo: orderNo, EventType: "ORDER_CREATED", Payload: fmt.Appendf(nil, `{"orderNo":%q}`, orderNo),
	}); err != nil {
		return err
	}
	return tx.Commit()
}

// testConfig is a publisher's config for tests: it polls often, retries at once and logs
// nothing, so that a test waits for nothing but the events.
func testConfig() outbox.Config {
	return outbox.Config{
		PollInterval: 10 * time.Millisecond,
		Backoff:      func(int) time.Duration { return 0 },
		Logger:       slog.New(slog.DiscardHandler),
	}
}

// A service's test asserts that its transaction published the event: a real publisher over
// the real table sends to a MemorySender, and the test waits for what it sent.
func ExampleMemorySender() {
	store, drop := exampleStore() // test plumbing: a fresh outbox table on the tests' database
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sent := outboxtest.NewMemorySender()
	publisher, err := outbox.NewPublisher(store, sent, testConfig())
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close()

	if err := placeOrder(ctx, store, "ORD-1"); err != nil {
		log.Fatal(err)
	}
	evs, err := sent.WaitFor(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(evs[0].EventType, evs[0].BizNo, string(evs[0].Payload))
	// Output:
	// ORDER_CREATED ORD-1 {"orderNo":"ORD-1"}
}

// A test of a dead-letter alert: the broker refuses one order's event for good, the
// publisher dead-letters it at once and calls OnDeadLetter, which alerts.
func ExampleFaultySender_Refuse() {
	store, drop := exampleStore()
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	faulty := outboxtest.NewFaultySender(outboxtest.NewMemorySender())
	faulty.Refuse(func(ev outbox.Event) bool { return ev.BizNo == "ORD-2" })
	alerts := make(chan string, 1)
	cfg := testConfig()
	cfg.OnDeadLetter = func(_ context.Context, ev outbox.Event, cause error) {
		alerts <- fmt.Sprintf("alert: %s %s is %s (permanent: %t)", ev.EventType, ev.BizNo, ev.Status, outbox.IsPermanent(cause))
	}
	publisher, err := outbox.NewPublisher(store, faulty, cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close()

	for _, no := range []string{"ORD-1", "ORD-2"} {
		if err := placeOrder(ctx, store, no); err != nil {
			log.Fatal(err)
		}
	}
	select {
	case alert := <-alerts:
		fmt.Println(alert)
	case <-ctx.Done():
		log.Fatal("no alert")
	}
	fmt.Println("refused:", faulty.Counts().Refused)
	// Output:
	// alert: ORDER_CREATED ORD-2 is FAIL (permanent: true)
	// refused: 1
}

// A test of retries: the first two tries of every event fail; the third goes through, and
// the event carries the two retries it took.
func ExampleFaultySender_FailFirst() {
	store, drop := exampleStore()
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.FailFirst(2, nil)
	publisher, err := outbox.NewPublisher(store, faulty, testConfig()) // MaxAttempts 4, the default
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close()

	if err := placeOrder(ctx, store, "ORD-1"); err != nil {
		log.Fatal(err)
	}
	evs, err := sent.WaitFor(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent after", evs[0].RetryCount, "retries; tries failed:", faulty.Counts().Failed)
	// Output:
	// sent after 2 retries; tries failed: 2
}

// A duplicate: the broker takes the event but its answer is lost, so the publisher sends
// the event again. The consumer receives it twice, with one event id, and must suppress
// the second (see package inboxtest).
func ExampleFaultySender_LoseAnswer() {
	store, drop := exampleStore()
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.LoseAnswer(1, nil)
	publisher, err := outbox.NewPublisher(store, faulty, testConfig())
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer publisher.Close()

	if err := placeOrder(ctx, store, "ORD-1"); err != nil {
		log.Fatal(err)
	}
	evs, err := sent.WaitFor(ctx, 2)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("sent", len(evs), "times; one event:", evs[0].EventID == evs[1].EventID)
	// Output:
	// sent 2 times; one event: true
}

// A test of shutdown with a send in flight: the send blocks, Close waits for it, and
// returns once it is released and its outcome recorded.
func ExampleFaultySender_Block() {
	store, drop := exampleStore()
	defer drop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	sent := outboxtest.NewMemorySender()
	faulty := outboxtest.NewFaultySender(sent)
	faulty.Block(nil)
	publisher, err := outbox.NewPublisher(store, faulty, testConfig())
	if err != nil {
		log.Fatal(err)
	}
	if err := publisher.Start(ctx); err != nil {
		log.Fatal(err)
	}

	if err := placeOrder(ctx, store, "ORD-1"); err != nil {
		log.Fatal(err)
	}
	if err := faulty.WaitBlocked(ctx, 1); err != nil { // the send is in flight
		log.Fatal(err)
	}
	closed := make(chan error)
	go func() { closed <- publisher.Close() }()
	faulty.Release()
	fmt.Println("closed:", <-closed, "sent:", sent.Len())
	// Output:
	// closed: <nil> sent: 1
}

// exampleStore makes a fresh outbox table on the database the tests use
// (OUTBOX_TEST_MYSQL_DSN), and returns its store and a function that drops it.
func exampleStore() (*outbox.MySQLStore, func()) {
	dsn := os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	if dsn == "" {
		log.Fatal("set OUTBOX_TEST_MYSQL_DSN to a MySQL DSN, e.g. root@tcp(127.0.0.1:3306)/test?parseTime=true")
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		log.Fatal(err)
	}
	table := "t_example_" + strings.ToLower(rand.Text())
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.CreateSchema(context.Background()); err != nil {
		log.Fatal(err)
	}
	return store, func() {
		_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
		_ = db.Close()
	}
}
