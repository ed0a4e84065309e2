// Command many-databases publishes the outbox tables of several databases, as a sharded
// service or one with a database per tenant does: one store and one publisher per
// database, each named (Config.StoreName) on its logs, metrics and Health, all sending
// through one shared sender that the program closes once, after every publisher. It writes
// orders into each database, waits until every event is sent, and prints each store's
// health. It needs only a MySQL or MariaDB server (two databases on it stand for two
// shards):
//
//	bash scripts/mariadb.sh start
//	go -C examples run ./many-databases \
//	  -store "shard-0=root@tcp(127.0.0.1:3306)/outbox_shard_0?parseTime=true" \
//	  -store "shard-1=root@tcp(127.0.0.1:3306)/outbox_shard_1?parseTime=true"
//
// A database that does not exist is created first.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/go-outbox/outbox"
)

// shard is one database: its name, as the logs and metrics show it, and its DSN.
type shard struct{ name, dsn string }

func main() {
	var shards []shard
	flag.Func("store", "a database, NAME=DSN; repeat for each", func(s string) error {
		name, dsn, ok := strings.Cut(s, "=")
		if !ok || name == "" || dsn == "" {
			return errors.New("want NAME=DSN")
		}
		shards = append(shards, shard{name, dsn})
		return nil
	})
	orders := flag.Int("orders", 10, "orders to create in each database")
	flag.Parse()
	if len(shards) == 0 {
		shards = []shard{
			{"shard-0", "root@tcp(127.0.0.1:3306)/outbox_shard_0?parseTime=true"},
			{"shard-1", "root@tcp(127.0.0.1:3306)/outbox_shard_1?parseTime=true"},
		}
	}
	if err := run(shards, *orders); err != nil {
		log.Fatal(err)
	}
}

// printer is the shared sender: it prints each event, and says when it is closed.
type printer struct {
	mu     sync.Mutex
	sent   map[string]int // by store (the biz no's prefix)
	closed bool
}

func (p *printer) Send(ctx context.Context, evs []outbox.Event, keyOrder bool) []error {
	return outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closed {
			return outbox.ErrClosed
		}
		store, _, _ := strings.Cut(ev.BizNo, "/")
		p.sent[store]++
		fmt.Printf("sent %s event_id=%s %s\n", ev.BizNo, ev.EventID, ev.Payload)
		return nil
	}).Send(ctx, evs, keyOrder)
}

func (p *printer) Info() outbox.SenderInfo { return outbox.SenderInfo{} }

func (p *printer) Check(context.Context, []string) error { return nil }

func (p *printer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	fmt.Println("the shared sender is closed, once")
	return nil
}

func run(shards []shard, orders int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sender := &printer{sent: map[string]int{}}
	defer sender.Close() // deferred first, so it runs last: after every publisher's Close

	var publishers []*outbox.Publisher
	dbs := map[string]*sql.DB{}
	for _, s := range shards {
		db, err := open(ctx, s.dsn)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		defer db.Close()
		dbs[s.name] = db
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: "many_event_record"})
		if err != nil {
			return err
		}
		if err := store.CreateSchema(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		for i := range orders {
			if err := order(ctx, store, fmt.Sprintf("%s/ORD-%d-%d", s.name, time.Now().UnixNano(), i)); err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
		}
		p, err := outbox.NewPublisher(store, sender, outbox.Config{
			StoreName:    s.name, // on every log line, metric and Health of this publisher
			SharedSender: true,   // its Close leaves the sender open: the defer above closes it
			PollInterval: 200 * time.Millisecond,
			Logger:       logger,
		})
		if err != nil {
			return err
		}
		if err := p.Start(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err) // e.g. a StoreName another store's publisher has
		}
		defer p.Close() // stops the publisher and waits for its last sends
		publishers = append(publishers, p)
	}
	fmt.Printf("created %d orders with their events in each of %d databases\n", orders, len(shards))

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for _, s := range shards {
		for {
			var waiting int
			if err := dbs[s.name].QueryRowContext(ctx, "SELECT COUNT(*) FROM many_event_record WHERE status <> 'SUCCESS'").Scan(&waiting); err != nil {
				return err
			}
			if waiting == 0 {
				break
			}
			select {
			case <-ctx.Done(): // Ctrl-C
				return ctx.Err()
			case <-tick.C:
			}
		}
	}
	for _, p := range publishers {
		h := p.Health()
		fmt.Printf("store %s: running=%v last round ok %s ago, last error %v\n",
			h.StoreName, h.Running, time.Since(h.LastRoundOK).Round(time.Millisecond), h.LastError)
	}
	sender.mu.Lock()
	for _, s := range shards {
		fmt.Printf("store %s: %d events published\n", s.name, sender.sent[s.name])
	}
	sender.mu.Unlock()
	return nil
}

// open opens the database of dsn, creating it if it does not exist.
func open(ctx context.Context, dsn string) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	cfg.ParseTime = true
	name := cfg.DBName
	cfg.DBName = ""
	server, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	defer server.Close()
	if _, err := server.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+strings.ReplaceAll(name, "`", "``")+"`"); err != nil {
		return nil, err
	}
	cfg.DBName = name
	return sql.Open("mysql", cfg.FormatDSN())
}

// order writes an order's event in one transaction (an order table of its own is left out).
func order(ctx context.Context, store *outbox.MySQLStore, bizNo string) error {
	tx, err := store.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if _, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: bizNo, EventType: "ORDER_CREATED", Payload: []byte(`{}`)}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
