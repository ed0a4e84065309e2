package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
	"github.com/go-outbox/outbox/relay"
)

// sendRecorder is a SenderFunc that counts the sends of each event id.
type sendRecorder struct {
	mu   sync.Mutex
	sent map[string]int
}

func (r *sendRecorder) send(_ context.Context, ev outbox.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent[ev.EventID]++
	return nil
}

func (r *sendRecorder) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.sent))
	for k, v := range r.sent {
		out[k] = v
	}
	return out
}

// Outbox and checkpoint tables named by reserved words (order, select), or beginning with
// a digit, or of digits only, serve the relay and the store's relay gate as any other
// names: the relay checks them, takes the table over, sends what it sweeps and what it
// reads from the binlog once each and marks it, and hands the table back, after which a
// polling publisher of the store (whose claims read the checkpoint row) sends the rest.
func TestRelayTableNamesReservedWordsAndLeadingDigits(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	for _, names := range [][2]string{{"order", "t_outbox_relay"}, {"group", "select"}, {"1events", "2026"}} {
		t.Run(names[0]+"+"+names[1], func(t *testing.T) {
			ctx := context.Background()
			table, cpTable := names[0], names[1]
			db := srv.OpenDB(t)
			store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table, RelayTable: cpTable})
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(ctx))
			require.NoError(t, relay.CreateSchema(ctx, db, relay.Config{Table: table, CheckpointTable: cpTable}))
			insert := func(n int, prefix string) []string {
				var ids []string
				for i := range n {
					tx, err := store.BeginTx(ctx, nil)
					require.NoError(t, err)
					id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: fmt.Sprintf("%s-%d", prefix, i), EventType: "E", Payload: []byte("{}")})
					require.NoError(t, err)
					require.NoError(t, tx.Commit())
					ids = append(ids, id)
				}
				return ids
			}
			success := func() int {
				var n int
				require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM "+mysqldialect.Quote(table)+" WHERE status = 'SUCCESS'").Scan(&n))
				return n
			}

			rec := &sendRecorder{sent: map[string]int{}}
			ids := insert(10, "swept")
			cfg := relay.Config{Table: table, CheckpointTable: cpTable, InstanceID: "relay-" + table,
				CheckpointInterval: 200 * time.Millisecond, FallbackAfter: 3 * time.Second, Logger: testLogger()}
			r, stop := start(t, srv.DSN(), outbox.SenderFunc(rec.send), cfg)
			waitLeader(t, r)
			ids = append(ids, insert(10, "streamed")...)
			waitFor(t, 20*time.Second, "the relay's events SUCCESS", func() bool { return success() == len(ids) })
			sent := rec.counts()
			for _, id := range ids {
				assert.Equal(t, 1, sent[id], "event %s", id)
			}
			stop()
			var mode string
			require.NoError(t, db.QueryRow("SELECT mode FROM "+mysqldialect.Quote(cpTable)+" WHERE outbox_table = ?", table).Scan(&mode))
			assert.Equal(t, "polling", mode, "the relay handed the table back")

			p, err := outbox.NewPublisher(store, outbox.SenderFunc(rec.send), outbox.Config{InstanceID: "poller-" + table,
				Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			defer p.Close()
			polled := insert(5, "polled")
			for round := 0; round < 20 && success() < len(ids)+len(polled); round++ {
				_, err := p.PublishPending(ctx)
				require.NoError(t, err)
			}
			assert.Equal(t, len(ids)+len(polled), success(), "the publisher sent the rest")
			sent = rec.counts()
			for _, id := range polled {
				assert.Equal(t, 1, sent[id], "event %s", id)
			}
		})
	}
}

// A bad or over-long table name is refused by the relay (Table and CheckpointTable), the
// store and the inbox alike: ErrInvalidConfig, with the same words for the same name.
func TestTableNamesRefusedAlikeByRelayStoreAndInbox(t *testing.T) {
	t.Parallel()
	dsn := "root@tcp(127.0.0.1:3306)/outbox_test"
	db, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	defer db.Close()
	for _, name := range []string{strings.Repeat("t", 65), "t-1", "order`s", "évents"} {
		reason := mysqldialect.CheckTable(name)
		require.Error(t, reason, name)
		for what, err := range map[string]error{
			"relay Table":           relayErr(dsn, relay.Config{Table: name}),
			"relay CheckpointTable": relayErr(dsn, relay.Config{CheckpointTable: name}),
			"relay CreateSchema":    relay.CreateSchema(context.Background(), db, relay.Config{CheckpointTable: name}),
			"store Table":           storeErr(outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: name})),
			"store RelayTable":      storeErr(outbox.NewMySQLStore(db, outbox.MySQLConfig{RelayTable: name})),
			"inbox Table":           inboxErr(inbox.New(db, inbox.Config{Group: "g", Table: name})),
		} {
			require.ErrorIs(t, err, outbox.ErrInvalidConfig, what)
			assert.ErrorContains(t, err, reason.Error(), what)
		}
	}
}

func relayErr(dsn string, cfg relay.Config) error {
	r, err := relay.New(dsn, outbox.SenderFunc(nil), cfg)
	if err == nil {
		_ = r.Close()
	}
	return err
}

func storeErr(_ *outbox.MySQLStore, err error) error { return err }
func inboxErr(_ *inbox.Inbox, err error) error       { return err }

// Run refuses an outbox table that lacks a column of schema.sql, naming it, whether or not
// the relay reads that column itself (it writes last_error; the publishers it hands the
// table to read reclaim_count).
func TestRelayRefusesAnOutboxTableWithoutAColumn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, newServer(t), outbox.Unordered)
	for _, col := range []string{"last_error", "reclaim_count"} { // the first missing is named {
		_, err := e.db.Exec("ALTER TABLE " + mysqldialect.Quote(e.table) + " DROP COLUMN " + col)
		require.NoError(t, err)
		r, err := relay.New(e.dsn, outbox.SenderFunc(func(context.Context, outbox.Event) error { return nil }), e.config("relay-1"))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a relay that accepts the table runs
		err = r.Run(ctx)
		cancel()
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.Contains(t, err.Error(), "has no column "+col)
		require.NoError(t, r.Close())
	}
}
