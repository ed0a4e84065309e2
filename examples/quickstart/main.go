// Command quickstart writes orders and their events in one transaction and publishes the
// events with three publishers, printing each send. It needs only a MySQL or MariaDB server:
//
//	bash scripts/mariadb.sh start
//	go -C examples run ./quickstart -dsn "$(bash scripts/mariadb.sh dsn)"
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(127.0.0.1:3306)/outbox_test?parseTime=true", "MySQL DSN")
	orders := flag.Int("orders", 10, "orders to create")
	flag.Parse()
	if err := run(*dsn, *orders); err != nil {
		log.Fatal(err)
	}
}

func run(dsn string, orders int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: "quickstart_event_record"})
	if err != nil {
		return err
	}
	if err := store.CreateSchema(ctx); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS quickstart_orders (
		order_no VARCHAR(64) PRIMARY KEY, amount INT NOT NULL)`); err != nil {
		return err
	}

	runID := time.Now().UnixNano()
	for i := range orders {
		orderNo := fmt.Sprintf("ORD-%d-%d", runID, i)
		tx, err := store.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO quickstart_orders (order_no, amount) VALUES (?, ?)", orderNo, 100+i); err != nil {
			_ = tx.Rollback()
			return err
		}
		if _, err := tx.InsertEvent(ctx, outbox.EventInput{
			BizNo: orderNo, EventType: "ORDER_CREATED", Payload: fmt.Appendf(nil, `{"orderNo":%q,"amount":%d}`, orderNo, 100+i),
		}); err != nil {
			_ = tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	fmt.Printf("created %d orders with their events\n", orders)

	var mu sync.Mutex
	sent := 0
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := range 3 {
		id := fmt.Sprintf("quickstart-%d-%d", os.Getpid(), i)
		sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
			mu.Lock()
			defer mu.Unlock()
			sent++
			fmt.Printf("%s sent id=%d event_id=%s %s %s %s\n", id, ev.ID, ev.EventID, ev.EventType, ev.BizNo, ev.Payload)
			return nil
		})
		p, err := outbox.NewPublisher(store, sender, outbox.Config{
			InstanceID: id, PollInterval: 200 * time.Millisecond, Logger: logger,
		})
		if err != nil {
			return err
		}
		// Start reports what keeps the publisher from running, then publishes in the
		// background. The shutdown: Close stops it and waits for it (it records its sends in
		// flight and releases what it claimed and did not send), then closes the sender.
		if err := p.Start(ctx); err != nil {
			return err
		}
		defer p.Close()
	}
	for {
		var waiting int
		if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM quickstart_event_record WHERE status <> 'SUCCESS' AND biz_no LIKE ?",
			fmt.Sprintf("ORD-%d-%%", runID)).Scan(&waiting); err != nil {
			return err
		}
		if waiting == 0 {
			break
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("published %d events, none pending\n", sent)
	return nil
}

// sleep waits d, or until ctx ends (Ctrl-C).
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
