package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// InsertEvent is one statement on the wire for a payload of up to 64 KiB: its values in its
// text, with no PREPARE and CLOSE around it (go-sql-driver prepares every statement with
// parameters unless the DSN sets interpolateParams), which saves the business transaction a
// round trip. A longer payload goes as a parameter of a prepared statement, which the driver
// sends in pieces. Either way every byte and character arrives as written. Counted by a
// private server's own counters.
func TestInsertEventIsOneStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	counters := srv.OpenDB(t)
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{MaxPayloadBytes: 1 << 20})
	for _, c := range []struct {
		size     int
		prepared int64
	}{{1, 0}, {64 << 10, 0}, {64<<10 + 1, 1}, {1 << 20, 1}} {
		t.Run(fmt.Sprint(c.size), func(t *testing.T) {
			payload := make([]byte, c.size)
			for i := range payload {
				payload[i] = "\x00'\"\\%?\xff"[i%7]
			}
			in := outbox.EventInput{BizNo: "O'Brien\\订单-7", EventType: "E'%s?\"", Payload: payload}
			before := statusCounts(t, counters, "Com_stmt_prepare", "Com_insert")
			tx, err := store.BeginTx(ctx, nil)
			require.NoError(t, err)
			id, err := outbox.InsertForTest(ctx, tx, in)
			require.NoError(t, err)
			require.NoError(t, tx.Commit())
			after := statusCounts(t, counters, "Com_stmt_prepare", "Com_insert")
			assert.Equal(t, c.prepared, after["Com_stmt_prepare"]-before["Com_stmt_prepare"], "statements prepared")
			assert.Equal(t, int64(1), after["Com_insert"]-before["Com_insert"], "INSERTs, prepared or not")

			got, err := outbox.NewAdmin(store).Get(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, in.BizNo, got.BizNo)
			assert.Equal(t, in.EventType, got.EventType)
			assert.Equal(t, payload, got.Payload)
			assert.Len(t, got.EventID, 36)
		})
	}
}
