package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// An inbox table named by a reserved word, one that begins with a digit and one of digits
// only serve the inbox as any other name: it creates both tables, handles an event once,
// rejects a permanent failure into the rejected table, lists it, and purges under its lock.
// They run in a database of their own, where the names are free.
func TestInboxTableNamesReservedWordsAndLeadingDigits(t *testing.T) {
	db := testsvc.NewDatabase(t)
	ctx := context.Background()
	for _, table := range []string{"order", "1inbox", "2026"} {
		t.Run(table, func(t *testing.T) {
			in, err := inbox.New(db, inbox.Config{Group: "g", Table: table})
			require.NoError(t, err)
			require.NoError(t, in.CreateSchema(ctx))
			t.Cleanup(func() {
				_, _ = db.Exec("DROP TABLE IF EXISTS " + mysqldialect.Quote(table) + ", " + mysqldialect.Quote(table+"_rejected"))
			})
			ran := 0
			h := func(context.Context, *sql.Tx, *inbox.Message) error { ran++; return nil }
			msg := &inbox.Message{EventID: uuid.Must(uuid.NewV7()).String(), EventType: "E", BizNo: "B", Body: []byte("{}")}
			o, err := in.Handle(ctx, msg, h)
			require.NoError(t, err)
			assert.Equal(t, inbox.Handled, o)
			o, err = in.Handle(ctx, msg, h)
			require.NoError(t, err)
			assert.Equal(t, inbox.Duplicate, o)
			assert.Equal(t, 1, ran)

			bad := &inbox.Message{EventID: uuid.Must(uuid.NewV7()).String(), EventType: "E", BizNo: "B", Body: []byte("{}")}
			o, err = in.Handle(ctx, bad, func(context.Context, *sql.Tx, *inbox.Message) error {
				return outbox.Permanent(errors.New("no such customer"))
			})
			require.NoError(t, err)
			assert.Equal(t, inbox.Rejected, o)
			rejected, err := in.Rejected(ctx, 0, 10)
			require.NoError(t, err)
			require.Len(t, rejected, 1)
			assert.Equal(t, bad.EventID, rejected[0].Message.EventID)

			time.Sleep(20 * time.Millisecond) // older than the purge's 10 ms
			n, err := in.Purge(ctx, 10*time.Millisecond, 0)
			require.NoError(t, err)
			assert.EqualValues(t, 1, n, "the handled event's row")
		})
	}
}
