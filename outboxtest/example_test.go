package outboxtest_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/outboxtest"
)

// mysqlHarness is the [outboxtest.Harness] of [outbox.MySQLStore]: the store over a table
// of its own, and plain SQL on that table for what the Store interface does not do. Every
// time it writes is the database's UTC_TIMESTAMP(3), the clock the store itself uses.
type mysqlHarness struct {
	db       *sql.DB // opened with parseTime=true
	store    *outbox.MySQLStore
	table    string // quoted
	ordering outbox.Ordering
}

// newMySQLHarness creates a fresh outbox table on db, made for ordering, and drops it when
// t ends.
func newMySQLHarness(t *testing.T, db *sql.DB, ordering outbox.Ordering) *mysqlHarness {
	t.Helper()
	name := "t_conformance_" + strings.ToLower(rand.Text())
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: name, Ordering: ordering, Routes: outbox.Routes{Topics: harnessTopics}})
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(t.Context()))
	t.Cleanup(func() {
		_, err := db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+name+"`")
		require.NoError(t, err)
	})
	return &mysqlHarness{db: db, store: store, table: "`" + name + "`", ordering: ordering}
}

// harnessTopics are the topics the harness's store takes besides "": it is a
// [outboxtest.TopicHarness], so the suite's topic case runs too.
var harnessTopics = []string{"orders", "payments"}

func (h *mysqlHarness) Topics() []string { return harnessTopics }

func (h *mysqlHarness) Store() outbox.Store       { return h.store }
func (h *mysqlHarness) Ordering() outbox.Ordering { return h.ordering }

// Insert writes the events as a service does, then finds each row by the event id that
// InsertEvent returned.
func (h *mysqlHarness) Insert(t testing.TB, evs ...outbox.EventInput) []int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := h.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }() // a no-op once committed
	eventIDs := make([]string, len(evs))
	for i, ev := range evs {
		eventIDs[i], err = tx.InsertEvent(ctx, ev)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Commit())
	ids := make([]int64, len(evs))
	for i, eventID := range eventIDs {
		require.NoError(t, h.db.QueryRowContext(ctx, "SELECT id FROM "+h.table+" WHERE event_id = ?", eventID).Scan(&ids[i]))
	}
	return ids
}

func (h *mysqlHarness) Get(t testing.TB, id int64) (outbox.Event, bool) {
	t.Helper()
	var (
		ev      outbox.Event
		status  string
		claimed sql.NullTime
	)
	err := h.db.QueryRowContext(context.Background(), `SELECT id, event_id, biz_no, event_type, payload, status,
	       retry_count, reclaim_count, next_retry_time, claim_owner, NULLIF(claimed_at, '1970-01-01'),
	       COALESCE(last_error, ''), create_time, update_time, trace_parent, trace_state, topic
	FROM `+h.table+` WHERE id = ?`, id).Scan(&ev.ID, &ev.EventID, &ev.BizNo, &ev.EventType, &ev.Payload, &status,
		&ev.RetryCount, &ev.ReclaimCount, &ev.NextRetryTime, &ev.ClaimOwner, &claimed,
		&ev.LastError, &ev.CreateTime, &ev.UpdateTime, &ev.TraceParent, &ev.TraceState, &ev.Topic)
	if err == sql.ErrNoRows {
		return outbox.Event{}, false
	}
	require.NoError(t, err)
	ev.Status, ev.ClaimedAt = outbox.Status(status), claimed.Time
	// The failure history as the store's own reads parse it (the failures column).
	full, err := outbox.NewAdmin(h.store).Get(context.Background(), id)
	require.NoError(t, err)
	ev.Failures = full.Failures
	return ev, true
}

func (h *mysqlHarness) Now(t testing.TB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, h.db.QueryRowContext(context.Background(), "SELECT UTC_TIMESTAMP(3)").Scan(&now))
	return now
}

func (h *mysqlHarness) SetNextRetry(t testing.TB, id int64, d time.Duration) {
	t.Helper()
	h.update(t, id, "SET next_retry_time = UTC_TIMESTAMP(3) + INTERVAL ? MICROSECOND", d.Microseconds())
}

func (h *mysqlHarness) Backdate(t testing.TB, id int64, d time.Duration) {
	t.Helper()
	us := d.Microseconds()
	h.update(t, id, `SET create_time = create_time - INTERVAL ? MICROSECOND,
	    update_time = update_time - INTERVAL ? MICROSECOND,
	    next_retry_time = next_retry_time - INTERVAL ? MICROSECOND,
	    claimed_at = IF(claimed_at = '1970-01-01', claimed_at, claimed_at - INTERVAL ? MICROSECOND)`, us, us, us, us)
}

func (h *mysqlHarness) Skip(t testing.TB, id int64) {
	t.Helper()
	res, err := h.db.ExecContext(context.Background(),
		"UPDATE "+h.table+" SET status = 'SKIPPED', update_time = UTC_TIMESTAMP(3) WHERE id = ? AND status = 'FAIL'", id)
	require.NoError(t, err)
	n, err := res.RowsAffected()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "event %d is a dead letter", id)
}

// update runs UPDATE table set WHERE id = ? on a row that must exist. (An UPDATE that
// changes nothing affects no row, so the row's existence is checked apart.)
func (h *mysqlHarness) update(t testing.TB, id int64, set string, args ...any) {
	t.Helper()
	ctx := context.Background()
	_, err := h.db.ExecContext(ctx, "UPDATE "+h.table+" "+set+" WHERE id = ?", append(args, id)...)
	require.NoError(t, err)
	var n int
	require.NoError(t, h.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+h.table+" WHERE id = ?", id).Scan(&n))
	require.Equal(t, 1, n, "event %d exists", id)
}

// Example runs the suite against MySQLStore, in each ordering it supports: a test in the
// store's package hands RunStoreTests a function that makes a harness over a fresh table
// for each case. This module's own test does exactly this on its test database.
func Example() {
	testMySQLStore := func(t *testing.T, db *sql.DB) {
		for _, o := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder, outbox.KeyOrderSkipDeadLetters} {
			t.Run(o.String(), func(t *testing.T) {
				outboxtest.RunStoreTests(t, func(t *testing.T) outboxtest.Harness {
					return newMySQLHarness(t, db, o)
				})
			})
		}
	}
	_ = testMySQLStore // called by a Test function, with the test database
}
