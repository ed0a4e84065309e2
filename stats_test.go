package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
)

// insertRows writes rows straight into the table: status, event type, next_retry_time and
// claimed_at as offsets from the database's now (seconds; positive is in the future).
type rawRow struct {
	status    string
	eventType string
	dueIn     int // next_retry_time - now, seconds
	claimedIn int // claimed_at - now, seconds; 0 leaves it at 1970 (unclaimed)
}

func (b *bundle) insertRaw(t testing.TB, rows []rawRow) {
	t.Helper()
	const chunk = 1000
	for len(rows) > 0 {
		n := min(chunk, len(rows))
		var sb strings.Builder
		args := make([]any, 0, n*6)
		for i, r := range rows[:n] {
			if i > 0 {
				sb.WriteString(",")
			}
			claimed := "'1970-01-01'"
			if r.claimedIn != 0 {
				claimed = fmt.Sprintf("DATE_ADD(UTC_TIMESTAMP(3), INTERVAL %d SECOND)", r.claimedIn)
			}
			fmt.Fprintf(&sb, "(?, ?, ?, '{}', ?, 0, DATE_ADD(UTC_TIMESTAMP(3), INTERVAL %d SECOND), ?, %s, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
				r.dueIn, claimed)
			owner := ""
			if r.claimedIn != 0 {
				owner = "x"
			}
			args = append(args, uuid.Must(uuid.NewV7()).String(), "ORD-raw", r.eventType, r.status, owner)
		}
		b.exec(t, "INSERT INTO {t} (event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES "+sb.String(), args...)
		rows = rows[n:]
	}
}

func repeatRow(r rawRow, n int) []rawRow {
	rows := make([]rawRow, n)
	for i := range rows {
		rows[i] = r
	}
	return rows
}

func TestStatsCountsEachState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	empty, err := b.store.Stats(ctx, outbox.StatsOptions{Lease: 10 * time.Minute})
	require.NoError(t, err)
	assert.Equal(t, outbox.TableStats{Success: -1, Skipped: -1, FailByType: map[string]int64{}}, empty)

	var rows []rawRow
	rows = append(rows, rawRow{status: "WAIT", eventType: "A", dueIn: -100}) // due for 100 s
	rows = append(rows, repeatRow(rawRow{status: "WAIT", eventType: "A", dueIn: -5}, 2)...)
	rows = append(rows, repeatRow(rawRow{status: "WAIT", eventType: "A", dueIn: 3600}, 4)...)    // backing off
	rows = append(rows, rawRow{status: "SENDING", eventType: "A", dueIn: -400, claimedIn: -400}) // past half of 10 min
	rows = append(rows, rawRow{status: "SENDING", eventType: "A", dueIn: -10, claimedIn: -10})
	rows = append(rows, repeatRow(rawRow{status: "FAIL", eventType: "ORDER_PAID", dueIn: -60, claimedIn: -60}, 2)...)
	rows = append(rows, rawRow{status: "FAIL", eventType: "ORDER_CREATED", dueIn: -60, claimedIn: -60})
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -60, claimedIn: -60}, 7)...)
	b.insertRaw(t, rows)

	st, err := b.store.Stats(ctx, outbox.StatsOptions{Lease: 10 * time.Minute})
	require.NoError(t, err)
	t.Logf("stats: %+v", st)
	assert.Equal(t, int64(7), st.Wait)
	assert.Equal(t, int64(3), st.Due)
	assert.Equal(t, int64(2), st.Sending)
	assert.Equal(t, int64(3), st.Fail)
	assert.Equal(t, int64(-1), st.Success, "SUCCESS is not counted unless asked")
	assert.Equal(t, int64(1), st.SendingPastHalfLease)
	assert.Equal(t, map[string]int64{"ORDER_PAID": 2, "ORDER_CREATED": 1}, st.FailByType)
	// Ages by the database clock: at least the offset written, and not much more (the
	// statements run within the test's lifetime; a minute is far more than they take).
	assert.GreaterOrEqual(t, st.OldestDueAge, 100*time.Second)
	assert.Less(t, st.OldestDueAge, 160*time.Second)
	assert.GreaterOrEqual(t, st.OldestClaimAge, 400*time.Second)
	assert.Less(t, st.OldestClaimAge, 460*time.Second)

	st, err = b.store.Stats(ctx, outbox.StatsOptions{CountSucceeded: true})
	require.NoError(t, err)
	assert.Equal(t, int64(7), st.Success)
	assert.Equal(t, int64(0), st.SendingPastHalfLease, "no lease, no judgement")

	_, err = b.store.Stats(ctx, outbox.StatsOptions{Lease: -time.Second})
	require.ErrorContains(t, err, "Lease must not be negative")
}

func TestStatsMissingTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.exec(t, "DROP TABLE {t}")
	_, err := b.store.Stats(context.Background(), outbox.StatsOptions{})
	require.ErrorContains(t, err, "does not exist")
}

// EXPLAIN the statistics statement on a table of 20,000 rows, nearly all SUCCESS: every part
// reads a range of idx_status_next_retry or idx_status_claimed_at, and none reads the
// SUCCESS rows; with CountSucceeded, one part does, from an index.
func TestStatsQueryUsesTheIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 20_000
	var rows []rawRow
	rows = append(rows, repeatRow(rawRow{status: "WAIT", eventType: "A", dueIn: -5}, 150)...)
	rows = append(rows, repeatRow(rawRow{status: "WAIT", eventType: "A", dueIn: 600}, 50)...)
	rows = append(rows, repeatRow(rawRow{status: "SENDING", eventType: "A", dueIn: -5, claimedIn: -5}, 100)...)
	rows = append(rows, repeatRow(rawRow{status: "FAIL", eventType: "B", dueIn: -5, claimedIn: -5}, 100)...)
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -5, claimedIn: -5}, total-len(rows))...)
	b.insertRaw(t, rows)
	b.exec(t, "ANALYZE TABLE {t}")

	type plan struct {
		table, typ, key string
		rows            int64
	}
	explain := func(query string) []plan {
		rs, err := b.db.Query("EXPLAIN "+query, (5 * time.Minute).Microseconds())
		require.NoError(t, err)
		defer rs.Close()
		cols, err := rs.Columns()
		require.NoError(t, err)
		var plans []plan
		for rs.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			require.NoError(t, rs.Scan(ptrs...))
			var p plan
			for i, c := range cols {
				s := ""
				if vals[i] != nil {
					s = fmt.Sprintf("%s", vals[i])
				}
				switch strings.ToLower(c) {
				case "table":
					p.table = s
				case "type":
					p.typ = s
				case "key":
					p.key = s
				case "rows":
					_, _ = fmt.Sscan(s, &p.rows)
				}
			}
			plans = append(plans, p)
		}
		require.NoError(t, rs.Err())
		return plans
	}

	parts := 0
	for _, p := range explain(outbox.StatsQueryForTest(b.store, false, false)) {
		t.Logf("stats part on %d rows: table=%s type=%s key=%s rows=%d", total, p.table, p.typ, p.key, p.rows)
		if strings.HasPrefix(p.table, "<union") {
			continue // the UNION's result, not a read
		}
		parts++
		assert.Contains(t, []string{"idx_status_next_retry", "idx_status_claimed_at"}, p.key)
		assert.Contains(t, []string{"range", "ref"}, p.typ)
		assert.Less(t, p.rows, int64(total/20), "a part reads the SUCCESS rows")
	}
	assert.Equal(t, 4, parts)

	parts = 0
	var successRows int64
	for _, p := range explain(outbox.StatsQueryForTest(b.store, true, false)) {
		t.Logf("stats part with CountSucceeded: table=%s type=%s key=%s rows=%d", p.table, p.typ, p.key, p.rows)
		if strings.HasPrefix(p.table, "<union") {
			continue
		}
		parts++
		assert.Contains(t, []string{"idx_status_next_retry", "idx_status_claimed_at"}, p.key)
		assert.Contains(t, []string{"range", "ref"}, p.typ)
		successRows = max(successRows, p.rows)
	}
	assert.Equal(t, 6, parts) // SUCCESS and SKIPPED
	assert.Greater(t, successRows, int64(total/4), "the SUCCESS part reads the SUCCESS rows, from an index")

	st, err := b.store.Stats(context.Background(), outbox.StatsOptions{Lease: 10 * time.Minute, CountSucceeded: true})
	require.NoError(t, err)
	assert.Equal(t, outbox.TableStats{Wait: 200, Due: 150, Sending: 100, Fail: 100, Success: total - 400, Skipped: 0,
		OldestDueAge: st.OldestDueAge, OldestClaimAge: st.OldestClaimAge, FailByType: map[string]int64{"B": 100}}, st)
}

// SentPerMinute counts the SUCCESS events by the minute their send began, over the last
// hour, newest minute last, from a range of idx_status_claimed_at that holds the last hour's
// sends only: the older history and the dead letters are not counted, nor read.
func TestStatsSentPerMinute(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const history = 5000
	var rows []rawRow
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -7200, claimedIn: -7200}, history)...)
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -30, claimedIn: -20}, 100)...)
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -700, claimedIn: -10*60 - 20}, 200)...)
	rows = append(rows, repeatRow(rawRow{status: "SUCCESS", eventType: "A", dueIn: -3580, claimedIn: -59*60 - 20}, 7)...)
	rows = append(rows, repeatRow(rawRow{status: "FAIL", eventType: "B", dueIn: -30, claimedIn: -20}, 5)...)
	b.insertRaw(t, rows)
	b.exec(t, "ANALYZE TABLE {t}")

	st, err := b.store.Stats(context.Background(), outbox.StatsOptions{SentPerMinute: true})
	require.NoError(t, err)
	require.Len(t, st.SentPerMinute, 60)
	want := make([]int64, 60)
	want[59], want[49], want[0] = 100, 200, 7
	assert.Equal(t, want, st.SentPerMinute)
	assert.Equal(t, int64(-1), st.Success, "SentPerMinute counts no history")

	st, err = b.store.Stats(context.Background(), outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Nil(t, st.SentPerMinute, "not asked for")
	assert.Equal(t, int64(-1), st.Skipped, "not asked for")

	b.exec(t, "UPDATE {t} SET status = 'SKIPPED' WHERE status = 'FAIL' LIMIT 2")
	st, err = b.store.Stats(context.Background(), outbox.StatsOptions{CountSkipped: true})
	require.NoError(t, err)
	assert.Equal(t, int64(2), st.Skipped, "CountSkipped counts the SKIPPED rows")
	assert.Equal(t, int64(-1), st.Success, "and not the SUCCESS ones")
	assert.Equal(t, int64(3), st.Fail)

	rs, err := b.db.Query("EXPLAIN "+outbox.StatsQueryForTest(b.store, false, true), 0)
	require.NoError(t, err)
	defer rs.Close()
	cols, err := rs.Columns()
	require.NoError(t, err)
	found := false
	for rs.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rs.Scan(ptrs...))
		row := map[string]string{}
		for i, c := range cols {
			row[strings.ToLower(c)] = vals[i].String
		}
		if row["key"] != "idx_status_claimed_at" || !strings.Contains(row["extra"], "index") {
			continue
		}
		var n int64
		_, _ = fmt.Sscan(row["rows"], &n)
		if n < history/4 && row["type"] == "range" {
			found = true
		}
	}
	require.NoError(t, rs.Err())
	assert.True(t, found, "the sent-per-minute part is a range of idx_status_claimed_at, read from the index, short of the history")
}
