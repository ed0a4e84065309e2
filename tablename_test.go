package outbox_test

import (
	"context"
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
	"github.com/go-outbox/outbox/internal/testsvc"
)

// A table named by a reserved word, one that begins with a digit and one of digits only
// serve the store as any other name: it creates the table, writes, claims, sends through a
// SenderFunc, records the successes, takes its claim turns and its exclusive purge lock,
// and purges, in batch and per-row claims, in key order, and partitioned. They run in a
// database of their own, where the names are free.
func TestStoreTableNamesReservedWordsAndLeadingDigits(t *testing.T) {
	db := testsvc.NewDatabase(t)
	ctx := context.Background()
	for _, tc := range []struct {
		table  string
		cfg    outbox.MySQLConfig
		perRow bool
	}{
		{"order", outbox.MySQLConfig{}, false},
		{"1events", outbox.MySQLConfig{Ordering: outbox.KeyOrder}, true},
		{"2026", outbox.MySQLConfig{PartitionIDs: 1000}, false},
		{"select", outbox.MySQLConfig{Ordering: outbox.KeyOrderSkipDeadLetters}, false},
	} {
		t.Run(tc.table, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Table = tc.table
			store, err := outbox.NewMySQLStore(db, cfg)
			require.NoError(t, err)
			require.NoError(t, store.CreateSchema(ctx))
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + mysqldialect.Quote(tc.table)) })
			_, err = store.Check(ctx)
			require.NoError(t, err)

			var want []string
			for i := range 5 {
				tx, err := store.BeginTx(ctx, nil)
				require.NoError(t, err)
				id, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: []string{"A", "B"}[i%2], EventType: "ORDER_CREATED", Payload: []byte(`{}`)})
				require.NoError(t, err)
				require.NoError(t, tx.Commit())
				want = append(want, id)
			}
			var mu sync.Mutex
			var sent []string
			sender := outbox.SenderFunc(func(_ context.Context, ev outbox.Event) error {
				mu.Lock()
				defer mu.Unlock()
				sent = append(sent, ev.EventID)
				return nil
			})
			p, err := outbox.NewPublisher(store, sender, outbox.Config{InstanceID: "names-" + tc.table,
				Logger: slog.New(slog.DiscardHandler), Tuning: outbox.Tuning{ClaimPerRow: tc.perRow}})
			require.NoError(t, err)
			defer p.Close()
			admin := outbox.NewAdmin(store)
			// A round sends what it claims; the batch claim records the successes with the
			// next round's claim.
			var succeeded []outbox.ListedEvent
			for round := 0; round < 20 && len(succeeded) < len(want); round++ {
				_, err := p.PublishPending(ctx)
				require.NoError(t, err)
				succeeded, err = admin.List(ctx, outbox.Filter{Status: outbox.StatusSuccess, Limit: 10})
				require.NoError(t, err)
			}
			require.Len(t, succeeded, len(want), "every event SUCCESS")
			mu.Lock()
			assert.ElementsMatch(t, want, sent, "each event sent once")
			mu.Unlock()

			time.Sleep(20 * time.Millisecond) // older than the purge's 10 ms
			n, err := store.Purge(ctx, 10*time.Millisecond, outbox.PurgeOptions{Exclusive: true})
			require.NoError(t, err)
			if tc.cfg.PartitionIDs == 0 {
				assert.EqualValues(t, len(want), n, "the purge deletes the sent events")
			} // partitioned, it keeps the partition of the highest id (and adds partitions ahead)
		})
	}
}

// A bad or over-long table name is refused by the store (Table and RelayTable) and the
// inbox alike: ErrInvalidConfig, with the same words for the same name (the relay's test
// TestTableNamesRefusedAlike holds the relay to them too).
func TestTableNamesRefusedAlike(t *testing.T) {
	db := testsvc.OpenDB(t)
	for _, name := range []string{strings.Repeat("t", 65), "t-1", "order`s", "évents", "t.e"} {
		reason := mysqldialect.CheckTable(name)
		require.Error(t, reason, name)
		_, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: name})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.ErrorContains(t, err, reason.Error())
		_, err = outbox.NewMySQLStore(db, outbox.MySQLConfig{RelayTable: name})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.ErrorContains(t, err, reason.Error())
		_, err = inbox.New(db, inbox.Config{Group: "g", Table: name})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig)
		assert.ErrorContains(t, err, reason.Error())
	}
}

// The outbox table's column list the relay checks a table against is the table
// CreateSchema makes (schema.sql), column for column, in order.
func TestOutboxColumnsAreSchemaSQLs(t *testing.T) {
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_columns")
	testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table})
	rows, err := db.Query(`SELECT COLUMN_NAME FROM information_schema.COLUMNS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, table)
	require.NoError(t, err)
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		require.NoError(t, rows.Scan(&c))
		cols = append(cols, strings.ToLower(c))
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, cols, mysqldialect.OutboxColumns())
}
