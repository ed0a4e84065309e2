package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/inbox"
)

// reject records msg as rejected through Handle (its handler refuses it for good) and
// returns its row.
func (f *fixture) reject(t *testing.T, in *inbox.Inbox, msg *inbox.Message) inbox.RejectedMessage {
	t.Helper()
	o, err := in.Handle(context.Background(), msg, f.failing(outbox.Permanent(errors.New("no such order"))))
	require.NoError(t, err)
	require.Equal(t, inbox.Rejected, o)
	for _, r := range rejectedRows(t, in) {
		if r.Message.MsgID == msg.MsgID {
			return r
		}
	}
	t.Fatalf("message %s not in the rejected table", msg.MsgID)
	return inbox.RejectedMessage{}
}

func TestRejectedPagesByID(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	other := f.other(t, f.db, "other_group")
	var want []int64
	for i := range 5 {
		want = append(want, f.reject(t, f.in, newMessage()).ID)
		if i%2 == 0 {
			f.reject(t, other, newMessage()) // rows of another group in between
		}
	}

	var got []int64
	after := int64(0)
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10)
		page, err := f.in.Rejected(ctx, after, 2)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		assert.LessOrEqual(t, len(page), 2)
		for _, r := range page {
			got = append(got, r.ID)
			after = r.ID
		}
	}
	assert.Equal(t, want, got, "every row of the group, by id, in pages")

	page, err := f.in.Rejected(ctx, want[2], 1000)
	require.NoError(t, err)
	require.Len(t, page, 2, "only ids above after")
	assert.Equal(t, want[3], page[0].ID)

	others, err := other.Rejected(ctx, 0, 1000)
	require.NoError(t, err)
	assert.Len(t, others, 3, "each group sees its own")

	// A page is a range of idx_group_id: the group's own rows, from after on.
	for range 40 {
		f.reject(t, other, newMessage())
	}
	_, err = f.db.Exec("ANALYZE TABLE " + f.table + "_rejected")
	require.NoError(t, err)
	q := strings.NewReplacer("id > ?", fmt.Sprintf("id > %d", want[1]), "LIMIT ?", "LIMIT 2").Replace(inbox.RejectedQueryForTest(f.in))
	plan := explain(t, f.db, q)
	assert.Equal(t, "idx_group_id", plan["key"], "%v", plan)
	assert.Equal(t, "range", plan["type"], "%v", plan)

	for _, limit := range []int{0, -1, 1001} {
		_, err := f.in.Rejected(ctx, 0, limit)
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "limit %d", limit)
	}
	page, err = f.in.Rejected(ctx, 0, 1)
	require.NoError(t, err)
	assert.Len(t, page, 1)
}

func TestReplayHandlesOnceAndDeletesRow(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	r := f.reject(t, f.in, msg)
	before := f.calls.Load()

	var seen *inbox.Message
	o, err := f.in.Replay(ctx, r.ID, func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
		seen = m
		return f.effect(ctx, tx, m)
	})
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o)
	assert.Equal(t, before+1, f.calls.Load(), "the handler ran once")
	require.NotNil(t, seen)
	assert.Equal(t, msg.EventID, seen.EventID, "with the message as it was delivered")
	assert.Equal(t, msg.Body, seen.Body)
	assert.Equal(t, msg.Properties, seen.Properties)
	assert.Equal(t, msg.BizNo, seen.BizNo)
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), msg.EventID), "recorded in the inbox")
	assert.Empty(t, rejectedRows(t, f.in), "the row is gone")

	// The row went with the effect: a second replay finds nothing, and a redelivery of
	// the event is a duplicate.
	_, err = f.in.Replay(ctx, r.ID, f.effect)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	o, err = f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Duplicate, o)
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
}

func TestReplayHandlerErrorLeavesRow(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	r := f.reject(t, f.in, msg)
	boom := errors.New("still no such order")

	for name, h := range map[string]inbox.Handler{
		"error":     f.failing(boom),
		"permanent": f.failing(outbox.Permanent(boom)),
		"panic": func(ctx context.Context, tx *sql.Tx, m *inbox.Message) error {
			_ = f.effect(ctx, tx, m)
			panic(boom)
		},
	} {
		o, err := f.in.Replay(ctx, r.ID, h)
		assert.Equal(t, inbox.Failed, o, name)
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), boom.Error(), name)
	}
	rows := rejectedRows(t, f.in)
	require.Len(t, rows, 1, "the row stays")
	assert.Equal(t, r, rows[0], "as it was")
	assert.Equal(t, 0, f.effectsOf(t, msg.EventID), "no effect")
	assert.Equal(t, 0, f.recorded(t, f.in.Group(), msg.EventID), "not recorded")

	o, err := f.in.Replay(ctx, r.ID, f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o, "once the cause is fixed")
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
}

// The event handled after its rejection (resent by the publisher, say, and handled then):
// the replay is a duplicate, the handler does not run, and the row goes.
func TestReplayOfEventHandledSinceIsDuplicate(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	msg := newMessage()
	r := f.reject(t, f.in, msg)
	o, err := f.in.Handle(ctx, redelivery(msg), f.effect)
	require.NoError(t, err)
	require.Equal(t, inbox.Handled, o)
	calls := f.calls.Load()

	o, err = f.in.Replay(ctx, r.ID, f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Duplicate, o)
	assert.Equal(t, calls, f.calls.Load(), "the handler did not run")
	assert.Empty(t, rejectedRows(t, f.in), "the row is gone")
	assert.Equal(t, 1, f.effectsOf(t, msg.EventID))
}

func TestReplayRefusals(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()

	for _, eventID := range []string{"", "ORD-1"} {
		msg := messageFor(eventID)
		o, err := f.in.Handle(ctx, msg, f.effect)
		require.NoError(t, err)
		require.Equal(t, inbox.Rejected, o)
	}
	rows := rejectedRows(t, f.in)
	require.Len(t, rows, 2)
	for _, r := range rows {
		o, err := f.in.Replay(ctx, r.ID, f.effect)
		assert.Equal(t, inbox.Failed, o)
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "%s cannot be replayed", r.ReasonClass)
		assert.Contains(t, err.Error(), "no valid event id")
	}
	assert.Len(t, rejectedRows(t, f.in), 2, "the rows stay")
	assert.Zero(t, f.calls.Load())

	// A missing id, and another group's row.
	_, err := f.in.Replay(ctx, 1<<40, f.effect)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	other := f.other(t, f.db, "other_group")
	r := f.reject(t, other, newMessage())
	_, err = f.in.Replay(ctx, r.ID, f.effect)
	require.ErrorIs(t, err, outbox.ErrNotFound, "another group's row is not this group's to replay")
	assert.Len(t, rejectedRows(t, other), 1)

	_, err = f.in.Replay(ctx, r.ID, nil)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
}

// ageRows makes n of the table's rows look recorded age ago.
func ageRows(t *testing.T, db *sql.DB, table, group string, n int, age time.Duration) {
	t.Helper()
	res, err := db.Exec("UPDATE `"+table+"` SET consumed_at = UTC_TIMESTAMP(3) - INTERVAL ? SECOND "+
		"WHERE consumer_group = ? ORDER BY event_id LIMIT ?", int(age.Seconds()), group, n)
	require.NoError(t, err)
	got, err := res.RowsAffected()
	require.NoError(t, err)
	require.EqualValues(t, n, got)
}

// insertRows records n events of group in table, as handled, directly.
func insertRows(t *testing.T, db *sql.DB, table, group string, n int) {
	t.Helper()
	_, err := db.Exec("INSERT INTO `"+table+"` (consumer_group, event_id, consumed_at) "+
		"SELECT ?, UUID(), UTC_TIMESTAMP(3) FROM seq_1_to_"+strconv.Itoa(n), group)
	require.NoError(t, err)
}

func TestPurgeDeletesOnlyOldRows(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	insertRows(t, f.db, f.table, f.in.Group(), 1300)
	ageRows(t, f.db, f.table, f.in.Group(), 1100, 3*time.Hour)
	recent := newMessage()
	_, err := f.in.Handle(ctx, recent, f.effect)
	require.NoError(t, err)
	for range 3 {
		f.reject(t, f.in, newMessage())
	}
	old := newMessage()
	f.reject(t, f.in, old)
	_, err = f.db.Exec("UPDATE `" + f.table + "_rejected` SET first_rejected = first_rejected - INTERVAL 30 DAY, " +
		"last_rejected = last_rejected - INTERVAL 30 DAY")
	require.NoError(t, err)

	n, err := f.in.Purge(ctx, 2*time.Hour, time.Millisecond)
	require.NoError(t, err)
	assert.EqualValues(t, 1100, n, "the rows older than 2 h, over three batches")
	assert.Equal(t, 201, count(t, f.db, f.table), "the newer ones stay")
	assert.Equal(t, 1, f.recorded(t, f.in.Group(), recent.EventID))
	assert.Len(t, rejectedRows(t, f.in), 4, "rejected messages are never purged")

	n, err = f.in.Purge(ctx, 2*time.Hour, 0)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing more is old enough")

	for _, bad := range [][2]time.Duration{{0, 0}, {-time.Hour, 0}, {time.Hour, -time.Second}} {
		_, err := f.in.Purge(ctx, bad[0], bad[1])
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "%v", bad)
	}
	assert.Equal(t, 201, count(t, f.db, f.table))
}

// Retention is the table's: one purge of a table at a time, whichever group's inbox runs
// it, and it deletes every group's old rows.
func TestPurgeOneAtATime(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	other := f.other(t, f.db, "other_group")
	insertRows(t, f.db, f.table, f.in.Group(), 30)
	insertRows(t, f.db, f.table, other.Group(), 20)
	ageRows(t, f.db, f.table, f.in.Group(), 30, 48*time.Hour)
	ageRows(t, f.db, f.table, other.Group(), 20, 48*time.Hour)

	// Another instance's purge holds the lock.
	holder, err := f.db.Conn(ctx)
	require.NoError(t, err)
	defer holder.Close()
	var got int
	require.NoError(t, holder.QueryRowContext(ctx, "SELECT GET_LOCK("+inbox.RetentionLockForTest(f.in)+", 0)").Scan(&got))
	require.Equal(t, 1, got)
	for _, in := range []*inbox.Inbox{f.in, other} {
		n, err := in.Purge(ctx, time.Hour, 0)
		require.ErrorIs(t, err, outbox.ErrPurgeBusy, "group %s: another purge of the table runs", in.Group())
		assert.Zero(t, n)
	}
	assert.Equal(t, 50, count(t, f.db, f.table), "nothing deleted")

	_, err = holder.ExecContext(ctx, "DO RELEASE_LOCK("+inbox.RetentionLockForTest(f.in)+")")
	require.NoError(t, err)
	n, err := other.Purge(ctx, time.Hour, 0)
	require.NoError(t, err)
	assert.EqualValues(t, 50, n, "the table's old rows, every group's")
	assert.Zero(t, count(t, f.db, f.table))

	// A purge gives the lock back: another session takes it at once.
	require.NoError(t, holder.QueryRowContext(ctx, "SELECT GET_LOCK("+inbox.RetentionLockForTest(f.in)+", 0)").Scan(&got))
	assert.Equal(t, 1, got)
}

// An operator holds the event id (consumers log it, InsertEvent returned it): the rejected
// message is found by it, in its own group only, through the rejected table's unique key,
// and its row id is the one Replay takes.
func TestRejectedByEventID(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	other := f.other(t, f.db, "other_group")
	var rows []inbox.RejectedMessage
	for range 20 {
		rows = append(rows, f.reject(t, f.in, newMessage()))
		f.reject(t, other, newMessage())
	}
	mine := rows[7]
	theirs := f.reject(t, other, newMessage())

	got, err := f.in.RejectedByEventID(ctx, mine.Message.EventID)
	require.NoError(t, err)
	assert.Equal(t, mine.ID, got.ID)
	assert.Equal(t, mine.Message.EventID, got.Message.EventID)
	assert.Equal(t, mine.Message.Body, got.Message.Body)
	assert.Equal(t, "permanent", got.ReasonClass)

	_, err = f.in.RejectedByEventID(ctx, theirs.Message.EventID)
	require.ErrorIs(t, err, outbox.ErrNotFound, "another group's rejected message")
	_, err = f.in.RejectedByEventID(ctx, newMessage().EventID)
	require.ErrorIs(t, err, outbox.ErrNotFound, "an event never rejected")
	assert.Contains(t, err.Error(), f.in.Group())
	_, err = f.in.RejectedByEventID(ctx, "not-a-uuid")
	require.ErrorIs(t, err, outbox.ErrInvalidInput)

	// The lookup is one row by a unique key.
	q := strings.Replace(inbox.RejectedByEventIDQueryForTest(f.in), "?", "'"+mine.Message.EventID+"'", 1)
	plan := explain(t, f.db, q)
	assert.Equal(t, "const", plan["type"], "one row by a unique key: %v", plan)
	assert.Equal(t, "uk_group_msg_key", plan["key"])

	// Replay by the event id: its row id.
	o, err := f.in.Replay(ctx, got.ID, f.effect)
	require.NoError(t, err)
	assert.Equal(t, inbox.Handled, o)
	assert.Equal(t, 1, f.effectsOf(t, mine.Message.EventID))
	_, err = f.in.RejectedByEventID(ctx, mine.Message.EventID)
	require.ErrorIs(t, err, outbox.ErrNotFound, "replayed: the row is gone")
}

// explain is the one row of EXPLAIN q's plan, by column.
func explain(t *testing.T, db *sql.DB, q string) map[string]string {
	t.Helper()
	rows, err := db.Query("EXPLAIN " + q)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	require.True(t, rows.Next())
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	require.NoError(t, rows.Scan(ptrs...))
	require.False(t, rows.Next(), "one table, one row of plan")
	got := map[string]string{}
	for i, c := range cols {
		got[c] = vals[i].String
	}
	return got
}

// A rejected table made before idx_group_id pages as well (reading the other groups' rows of
// its range); the ALTER of docs/upgrading.md adds the index online, and the page uses it.
func TestRejectedTableWithoutTheGroupIndex(t *testing.T) {
	t.Parallel()
	f := setup(t, inbox.Config{})
	ctx := context.Background()
	rejected := "`" + f.table + "_rejected`"
	_, err := f.db.Exec("ALTER TABLE " + rejected + " DROP INDEX idx_group_id") // as made before it
	require.NoError(t, err)
	first := f.reject(t, f.in, newMessage())
	page, err := f.in.Rejected(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, page, 1)
	assert.Equal(t, first.ID, page[0].ID)

	other := f.other(t, f.db, "other_group")
	for range 40 {
		f.reject(t, other, newMessage())
		f.reject(t, f.in, newMessage())
	}
	_, err = f.db.Exec("ALTER TABLE " + rejected + " ADD INDEX idx_group_id (consumer_group, id), ALGORITHM=INPLACE, LOCK=NONE")
	require.NoError(t, err, "the upgrade's ALTER, online")
	_, err = f.db.Exec("ANALYZE TABLE " + rejected)
	require.NoError(t, err)
	plan := explain(t, f.db, strings.NewReplacer("id > ?", fmt.Sprintf("id > %d", first.ID), "LIMIT ?", "LIMIT 10").Replace(inbox.RejectedQueryForTest(f.in)))
	assert.Equal(t, "idx_group_id", plan["key"], "%v", plan)
	page, err = f.in.Rejected(ctx, first.ID, 10)
	require.NoError(t, err)
	assert.Len(t, page, 10)
}
