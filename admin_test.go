package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// insertTyped commits one event of the given type and biz no and returns its id.
func (b *bundle) insertTyped(t testing.TB, eventType, bizNo string) int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: bizNo, EventType: eventType, Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	return id
}

// setState puts a row in status as a publisher would have left it, last updated and
// claimed age ago.
func (b *bundle) setState(t testing.TB, id int64, status outbox.Status, age time.Duration) {
	t.Helper()
	owner, claimed := "someone", fmt.Sprintf("DATE_SUB(UTC_TIMESTAMP(3), INTERVAL %d MICROSECOND)", age.Microseconds())
	if status == outbox.StatusWait {
		owner, claimed = "", "'1970-01-01'"
	}
	b.exec(t, "UPDATE {t} SET status = ?, claim_owner = ?, claimed_at = "+claimed+
		", retry_count = 4, reclaim_count = 1, last_error = 'boom', next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)"+
		", update_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND) WHERE id = ?",
		string(status), owner, age.Microseconds(), age.Microseconds(), id)
}

// snapshot is every column of every row but the payload, to check that a call changed
// nothing.
func (b *bundle) snapshot(t testing.TB) string {
	t.Helper()
	rows, err := b.db.Query("SELECT CONCAT_WS('|', id, event_id, biz_no, event_type, OCTET_LENGTH(payload), status, retry_count," +
		" reclaim_count, next_retry_time, claim_owner, claimed_at, last_error, create_time, update_time) FROM `" +
		outbox.TableForTest(b.store) + "` ORDER BY id")
	require.NoError(t, err)
	defer rows.Close()
	var out strings.Builder
	for rows.Next() {
		var row string
		require.NoError(t, rows.Scan(&row))
		out.WriteString(row + "\n")
	}
	require.NoError(t, rows.Err())
	return out.String()
}

func ids(evs []outbox.ListedEvent) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.ID
	}
	return out
}

func TestAdminListFilters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a1 := b.insertTyped(t, "A", "ORD-1")
	a2 := b.insertTyped(t, "A", "ORD-2")
	b1 := b.insertTyped(t, "B", "ORD-1")
	b2 := b.insertTyped(t, "B", "ORD-3")
	b.setState(t, a2, outbox.StatusFail, time.Minute)
	b.setState(t, b2, outbox.StatusSuccess, time.Minute)
	b.exec(t, "UPDATE {t} SET create_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 2 DAY) WHERE id = ?", a1)

	list := func(f outbox.Filter) []int64 {
		t.Helper()
		evs, err := b.admin().List(ctx, f)
		require.NoError(t, err)
		return ids(evs)
	}
	assert.Equal(t, []int64{b2, b1, a2, a1}, list(outbox.Filter{}), "newest first")
	assert.Equal(t, []int64{a2}, list(outbox.Filter{Status: outbox.StatusFail}))
	assert.Equal(t, []int64{a2, a1}, list(outbox.Filter{EventType: "A"}))
	assert.Equal(t, []int64{b1, a1}, list(outbox.Filter{BizNo: "ORD-1"}))
	assert.Equal(t, []int64{b1}, list(outbox.Filter{BizNo: "ORD-1", EventType: "B"}))
	assert.Equal(t, []int64{b1, a2}, list(outbox.Filter{MinID: a2, MaxID: b1}))
	assert.Equal(t, []int64{b2, b1}, list(outbox.Filter{MinID: b1}))
	assert.Equal(t, []int64{b1, a1}, list(outbox.Filter{IDs: []int64{a1, b1, 1 << 40}}))
	assert.Equal(t, []int64{a1}, list(outbox.Filter{CreatedUntil: time.Now().Add(-24 * time.Hour)}))
	assert.Equal(t, []int64{b2, b1, a2}, list(outbox.Filter{CreatedSince: time.Now().Add(-time.Hour)}))
	assert.Equal(t, []int64{b2, b1}, list(outbox.Filter{Limit: 2}))
	assert.Empty(t, list(outbox.Filter{EventType: "C"}))

	evs, err := b.admin().List(ctx, outbox.Filter{IDs: []int64{a2}})
	require.NoError(t, err)
	require.Len(t, evs, 1)
	ev := evs[0]
	assert.Equal(t, outbox.StatusFail, ev.Status)
	assert.Equal(t, 2, ev.PayloadSize)
	assert.Nil(t, ev.Payload, "a listing leaves payloads out")
	assert.Equal(t, "boom", ev.LastError)
	assert.Equal(t, 4, ev.RetryCount)
	assert.Equal(t, "someone", ev.ClaimOwner)
	assert.False(t, ev.ClaimedAt.IsZero())

	for name, f := range map[string]outbox.Filter{
		"unknown status": {Status: "DONE"},
		"lowercase":      {Status: "wait"},
		"empty range":    {MinID: 5, MaxID: 4},
		"negative id":    {MinID: -1},
		"negative limit": {Limit: -1},
		"huge limit":     {Limit: 10001},
		"empty period":   {CreatedSince: time.Now(), CreatedUntil: time.Now().Add(-time.Hour)},
		"zero id":        {IDs: []int64{0}},
	} {
		_, err := b.admin().List(ctx, f)
		assert.ErrorIs(t, err, outbox.ErrInvalidInput, name)
	}
}

func TestAdminRequeueFailedInBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var failedA, others []int64
	for i := range 7 {
		id := b.insertTyped(t, "A", fmt.Sprint("ORD-", i))
		b.setState(t, id, outbox.StatusFail, time.Hour)
		failedA = append(failedA, id)
	}
	failedB := b.insertTyped(t, "B", "ORD-B")
	b.setState(t, failedB, outbox.StatusFail, time.Hour)
	for _, st := range []outbox.Status{outbox.StatusWait, outbox.StatusSending, outbox.StatusSuccess} {
		id := b.insertTyped(t, "A", "ORD-X")
		b.setState(t, id, st, time.Hour)
		others = append(others, id)
	}
	before := map[int64]outbox.Event{}
	for _, id := range others {
		before[id] = b.get(t, id)
	}

	admin := b.admin()
	// A dry run counts what the requeue would change, and changes nothing.
	snapshot := b.snapshot(t)
	dry := func(f outbox.Filter) int64 {
		t.Helper()
		n, err := admin.RequeueFailed(ctx, f, outbox.RequeueOptions{DryRun: true, BatchRows: 2,
			OnBatch: func([]int64, int64) { t.Error("a dry run has no batches") }})
		require.NoError(t, err)
		return n
	}
	assert.EqualValues(t, 7, dry(outbox.Filter{EventType: "A"}))
	assert.EqualValues(t, 8, dry(outbox.Filter{}))
	assert.EqualValues(t, 5, dry(outbox.Filter{EventType: "A", Limit: 5}), "at most Limit")
	assert.EqualValues(t, 1, dry(outbox.Filter{Status: outbox.StatusFail, EventType: "B"}))
	assert.Zero(t, dry(outbox.Filter{IDs: others}), "rows that are not FAIL are not counted")
	assert.Equal(t, snapshot, b.snapshot(t), "a dry run changes nothing")

	for _, dryRun := range []bool{true, false} {
		_, err := admin.RequeueFailed(ctx, outbox.Filter{Status: outbox.StatusWait}, outbox.RequeueOptions{DryRun: dryRun})
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "only FAIL rows are requeued")
		_, err = admin.RequeueFailed(ctx, outbox.Filter{Status: "BOGUS"}, outbox.RequeueOptions{DryRun: dryRun})
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
		_, err = admin.RequeueFailed(ctx, outbox.Filter{MinID: 5, MaxID: 4}, outbox.RequeueOptions{DryRun: dryRun})
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
		_, err = admin.RequeueFailed(ctx, outbox.Filter{}, outbox.RequeueOptions{DryRun: dryRun, BatchRows: 10001})
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
	}
	assert.Equal(t, snapshot, b.snapshot(t), "nothing changed")

	type batch struct {
		ids      []int64
		requeued int64
	}
	var batches []batch
	n, err := admin.RequeueFailed(ctx, outbox.Filter{EventType: "A"}, outbox.RequeueOptions{
		BatchRows: 3,
		OnBatch:   func(ids []int64, requeued int64) { batches = append(batches, batch{ids, requeued}) },
	})
	require.NoError(t, err)
	assert.EqualValues(t, 7, n)
	require.Len(t, batches, 3)
	assert.Equal(t, failedA[:3], batches[0].ids)
	assert.Equal(t, failedA[3:6], batches[1].ids)
	assert.Equal(t, failedA[6:], batches[2].ids)
	assert.EqualValues(t, 3, batches[0].requeued)
	assert.EqualValues(t, 1, batches[2].requeued)

	for _, id := range failedA {
		ev := b.get(t, id)
		assert.Equal(t, outbox.StatusWait, ev.Status)
		assert.Zero(t, ev.RetryCount)
		assert.Zero(t, ev.ReclaimCount)
		assert.Empty(t, ev.ClaimOwner)
		assert.True(t, ev.ClaimedAt.IsZero(), "claim columns cleared")
		assert.LessOrEqual(t, b.secondsFromNow(t, id, "next_retry_time"), 0.0, "due now")
		assert.Greater(t, b.secondsFromNow(t, id, "next_retry_time"), -60.0, "due from the requeue on")
	}
	assert.Equal(t, outbox.StatusFail, b.get(t, failedB).Status, "the filter kept type B out")
	for _, id := range others {
		assert.Equal(t, before[id], b.get(t, id), "a row that was not FAIL is untouched")
	}

	// Nothing matches any more: a no-op, not an error, for the library (the CLI says so).
	n, err = admin.RequeueFailed(ctx, outbox.Filter{EventType: "A"}, outbox.RequeueOptions{})
	require.NoError(t, err)
	assert.Zero(t, n)

	// Requeue by hand clears the claim too.
	require.NoError(t, admin.Requeue(ctx, failedB))
	ev := b.get(t, failedB)
	assert.Empty(t, ev.ClaimOwner)
	assert.True(t, ev.ClaimedAt.IsZero())
	assert.Zero(t, ev.ReclaimCount)
}

// Requeue returns a dead letter to WAIT, due now, and refuses every other id, changing
// nothing: a missing one with ErrNotFound, a row in any other status with ErrNotDeadLetter.
func TestAdminRequeue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	admin := b.admin()
	failed := b.insertTyped(t, "A", "ORD-F")
	b.setState(t, failed, outbox.StatusFail, time.Hour)
	b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", failed)
	other := map[outbox.Status]int64{}
	for _, st := range []outbox.Status{outbox.StatusWait, outbox.StatusSending, outbox.StatusSuccess, outbox.StatusSkipped} {
		other[st] = b.insertTyped(t, "A", "ORD-"+string(st))
		b.setState(t, other[st], st, time.Hour)
	}
	missing := failed + 1000
	snapshot := b.snapshot(t)

	err := admin.Requeue(ctx, missing)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	assert.NotErrorIs(t, err, outbox.ErrNotDeadLetter)
	assert.Contains(t, err.Error(), fmt.Sprintf("id %d", missing))
	for st, id := range other {
		err := admin.Requeue(ctx, id)
		require.ErrorIs(t, err, outbox.ErrNotDeadLetter, "%s", st)
		assert.NotErrorIs(t, err, outbox.ErrNotFound)
		assert.Contains(t, err.Error(), fmt.Sprintf("id %d is %s", id, st))
	}
	require.ErrorIs(t, admin.Requeue(ctx, 0), outbox.ErrInvalidInput)
	require.ErrorIs(t, admin.Requeue(ctx, -1), outbox.ErrInvalidInput)
	assert.Equal(t, snapshot, b.snapshot(t), "a refused requeue changes nothing")

	// Requeue wakes this process's publishers, as a commit does.
	wake, unsubscribe := b.store.Subscribe()
	defer unsubscribe()
	require.NoError(t, admin.Requeue(ctx, failed))
	select {
	case <-wake:
	default:
		t.Error("the requeue woke no subscriber")
	}
	got := b.get(t, failed)
	assert.Equal(t, outbox.StatusWait, got.Status)
	assert.Zero(t, got.RetryCount)
	assert.Zero(t, got.ReclaimCount)
	assert.Empty(t, got.ClaimOwner)
	assert.True(t, got.ClaimedAt.IsZero())
	assert.LessOrEqual(t, b.secondsFromNow(t, failed, "next_retry_time"), 0.0, "due now")
	for st, id := range other {
		assert.Equal(t, st, b.get(t, id).Status, "untouched")
	}

	// Once WAIT, it is no dead letter any more.
	require.ErrorIs(t, admin.Requeue(ctx, failed), outbox.ErrNotDeadLetter)
	select {
	case <-wake:
		t.Error("a refused requeue woke a subscriber")
	default:
	}

	// RequeueFailed wakes them too, when it changes rows.
	b.setState(t, failed, outbox.StatusFail, time.Hour)
	n, err := admin.RequeueFailed(ctx, outbox.Filter{}, outbox.RequeueOptions{})
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	select {
	case <-wake:
	default:
		t.Error("RequeueFailed woke no subscriber")
	}
}

func TestMySQLStorePurgeOnlyOldSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var old, keep []int64
	for i := range 11 {
		id := b.insertTyped(t, "A", fmt.Sprint("ORD-", i))
		b.setState(t, id, outbox.StatusSuccess, 48*time.Hour)
		old = append(old, id)
	}
	recent := b.insertTyped(t, "A", "ORD-recent")
	b.setState(t, recent, outbox.StatusSuccess, time.Hour)
	keep = append(keep, recent)
	// Claimed long ago but acknowledged recently: update_time decides.
	lateAck := b.insertTyped(t, "A", "ORD-late")
	b.setState(t, lateAck, outbox.StatusSuccess, 48*time.Hour)
	b.exec(t, "UPDATE {t} SET update_time = UTC_TIMESTAMP(3) WHERE id = ?", lateAck)
	keep = append(keep, lateAck)
	for _, st := range []outbox.Status{outbox.StatusWait, outbox.StatusSending, outbox.StatusFail} {
		id := b.insertTyped(t, "A", "ORD-X")
		b.setState(t, id, st, 48*time.Hour)
		keep = append(keep, id)
	}

	for _, dryRun := range []bool{true, false} {
		_, err := b.store.Purge(ctx, 0, outbox.PurgeOptions{DryRun: dryRun})
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
		_, err = b.store.Purge(ctx, time.Hour, outbox.PurgeOptions{BatchRows: -1, DryRun: dryRun})
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
		_, err = b.store.Purge(ctx, time.Hour, outbox.PurgeOptions{Limit: -1, DryRun: dryRun})
		require.ErrorIs(t, err, outbox.ErrInvalidInput)
	}

	// A dry run counts what the purge would delete, and deletes nothing.
	snapshot := b.snapshot(t)
	for _, c := range []struct {
		olderThan time.Duration
		opts      outbox.PurgeOptions
		want      int64
	}{
		{24 * time.Hour, outbox.PurgeOptions{DryRun: true}, 11},
		{24 * time.Hour, outbox.PurgeOptions{DryRun: true, Limit: 4}, 4},
		{24 * time.Hour, outbox.PurgeOptions{DryRun: true, Exclusive: true, BatchRows: 2}, 11},
		{30 * time.Minute, outbox.PurgeOptions{DryRun: true}, 12},
		{72 * time.Hour, outbox.PurgeOptions{DryRun: true}, 0},
	} {
		opts := c.opts
		opts.OnBatch = func(int64) { t.Error("a dry run has no batches") }
		n, err := b.store.Purge(ctx, c.olderThan, opts)
		require.NoError(t, err)
		assert.Equal(t, c.want, n, "older than %s, %+v", c.olderThan, c.opts)
	}
	assert.Equal(t, snapshot, b.snapshot(t), "a dry run deletes nothing")

	var batches []int64
	n, err := b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{BatchRows: 4, Pause: time.Millisecond,
		OnBatch: func(d int64) { batches = append(batches, d) }})
	require.NoError(t, err)
	assert.EqualValues(t, 11, n)
	assert.Equal(t, []int64{4, 4, 3}, batches, "at most BatchRows per DELETE")
	for _, id := range old {
		_, err := b.admin().Get(ctx, id)
		assert.ErrorIs(t, err, outbox.ErrNotFound)
	}
	for _, id := range keep {
		_, err := b.admin().Get(ctx, id)
		assert.NoError(t, err, "row %d kept", id)
	}

	// Limit stops early; a purge with nothing to do deletes nothing.
	for i := range 5 {
		id := b.insertTyped(t, "A", fmt.Sprint("ORD-L", i))
		b.setState(t, id, outbox.StatusSuccess, 48*time.Hour)
	}
	n, err = b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{BatchRows: 2, Limit: 3})
	require.NoError(t, err)
	assert.EqualValues(t, 3, n)
	_, err = b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{Pause: -time.Millisecond})
	require.ErrorIs(t, err, outbox.ErrInvalidInput, "a negative pause is refused")
	n, err = b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{})
	require.NoError(t, err)
	assert.EqualValues(t, 2, n)
	n, err = b.store.Purge(ctx, 24*time.Hour, outbox.PurgeOptions{})
	require.NoError(t, err)
	assert.Zero(t, n)
}

func TestMySQLStorePurgeExclusive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := b.insertTyped(t, "A", "ORD-1")
	b.setState(t, id, outbox.StatusSuccess, 48*time.Hour)

	// Another session holds the purge lock: an exclusive purge does nothing.
	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	name := strings.Replace(outbox.ClaimLockNameForTest(b.store), "outbox-claim:", "outbox-purge:", 1)
	var got int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT GET_LOCK("+name+", 0)").Scan(&got))
	require.Equal(t, 1, got)
	_, err = b.store.Purge(ctx, time.Hour, outbox.PurgeOptions{Exclusive: true})
	require.ErrorIs(t, err, outbox.ErrPurgeBusy)
	_, err = b.admin().Get(ctx, id)
	require.NoError(t, err, "nothing purged while another holds the lock")

	// A plain purge ignores the lock; once it is free, an exclusive one runs and lets it go.
	_, err = conn.ExecContext(ctx, "DO RELEASE_LOCK("+name+")")
	require.NoError(t, err)
	n, err := b.store.Purge(ctx, time.Hour, outbox.PurgeOptions{Exclusive: true})
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	var free int
	require.NoError(t, b.db.QueryRow("SELECT IS_FREE_LOCK("+name+")").Scan(&free))
	assert.Equal(t, 1, free, "the purge let its lock go")
}

// EXPLAIN the purge's scan on a table of 12,000 rows, most of them SUCCESS: it uses
// idx_status_claimed_at, in its order, whether few or most rows are old.
func TestPurgeQueryUsesAnIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const total = 12_000
	values := strings.TrimSuffix(strings.Repeat("(?, ?, 'ORDER_CREATED', '{}', ?, 0, UTC_TIMESTAMP(3), 'x', ?, UTC_TIMESTAMP(3), ?),", 1000), ",")
	for chunk := range total / 1000 {
		args := make([]any, 0, 5000)
		for i := range 1000 {
			n := chunk*1000 + i
			status, age := "SUCCESS", time.Duration(n)*time.Minute // up to 8 days old
			switch n % 40 {
			case 0:
				status = "WAIT"
			case 1:
				status = "FAIL"
			}
			at := time.Now().UTC().Add(-age)
			args = append(args, uuid.Must(uuid.NewV7()).String(), fmt.Sprint("ORD-", n), status, at, at)
		}
		b.exec(t, "INSERT INTO {t} (event_id, biz_no, event_type, payload, status, retry_count, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES "+values, args...)
	}
	b.exec(t, "ANALYZE TABLE {t}")
	q := outbox.PurgeQueryForTest(b.store)
	for _, olderThan := range []time.Duration{7 * 24 * time.Hour, time.Hour} {
		rows, err := b.db.Query("EXPLAIN "+q, "SUCCESS", olderThan.Microseconds(), olderThan.Microseconds(), 500)
		require.NoError(t, err)
		cols, err := rows.Columns()
		require.NoError(t, err)
		require.True(t, rows.Next())
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		require.NoError(t, rows.Close())
		got := map[string]string{}
		for i, c := range cols {
			got[strings.ToLower(c)] = fmt.Sprintf("%s", vals[i])
		}
		t.Logf("purge scan, older than %s, on %d rows: type=%s key=%s rows=%s extra=%s", olderThan, total, got["type"], got["key"], got["rows"], got["extra"])
		assert.Equal(t, "idx_status_claimed_at", got["key"])
		// range, or ref on status = 'SUCCESS' read in claimed_at order: either way the scan
		// stops at the LIMIT, never reading the table.
		assert.Contains(t, []string{"range", "ref"}, got["type"])
		assert.NotContains(t, got["extra"], "filesort", "the index gives the order")
	}
}

// Several publishers with retention on: the old SUCCESS rows go, in batches, by one
// instance at a time; nothing else is touched.
func TestRetentionPurgesOldSuccessOneInstanceAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const oldRows = 60
	var old []int64
	for i := range oldRows {
		id := b.insertTyped(t, "A", fmt.Sprint("ORD-", i))
		b.setState(t, id, outbox.StatusSuccess, 48*time.Hour)
		old = append(old, id)
	}
	recent := b.insertTyped(t, "A", "ORD-recent")
	b.setState(t, recent, outbox.StatusSuccess, time.Minute)
	// Old in update_time, but a publisher must leave each alone: a WAIT row not yet due, a
	// SENDING row within its lease, a dead letter.
	wait := b.insertTyped(t, "A", "ORD-wait")
	b.setState(t, wait, outbox.StatusWait, 48*time.Hour)
	b.exec(t, "UPDATE {t} SET next_retry_time = DATE_ADD(UTC_TIMESTAMP(3), INTERVAL 1 DAY) WHERE id = ?", wait)
	sending := b.insertTyped(t, "A", "ORD-sending")
	b.setState(t, sending, outbox.StatusSending, 48*time.Hour)
	b.exec(t, "UPDATE {t} SET claimed_at = UTC_TIMESTAMP(3) WHERE id = ?", sending)
	failed := b.insertTyped(t, "A", "ORD-fail")
	b.setState(t, failed, outbox.StatusFail, 48*time.Hour)
	keep := map[int64]outbox.Event{}
	for _, id := range []int64{recent, wait, sending, failed} {
		keep[id] = b.get(t, id)
	}

	var (
		holding, maxHolding, runs atomic.Int64
		mu                        sync.Mutex
		purgers                   = map[int]int{}
	)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range 3 {
		store := newStoreOn(t, b, i, func(h bool) {
			if h {
				n := holding.Add(1)
				for {
					m := maxHolding.Load()
					if n <= m || maxHolding.CompareAndSwap(m, n) {
						break
					}
				}
				runs.Add(1)
				mu.Lock()
				purgers[i]++
				mu.Unlock()
				return
			}
			holding.Add(-1)
		})
		cfg := fastConfig(fmt.Sprint("retain-", i), &logSink{})
		cfg.Retention = 24 * time.Hour
		cfg.Tuning.RetentionInterval = 5 * time.Millisecond
		cfg.Tuning.RetentionBatch = 4
		cfg.Tuning.RetentionPause = 10 * time.Millisecond // a purge lasts ~150 ms: long enough to overlap, were it not for the lock
		p := newPublisher(t, store, newRecorder(), cfg)
		wg.Go(func() { _ = p.Run(ctx) })
	}
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE id BETWEEN ? AND ?", old[0], old[len(old)-1]).Scan(&n))
		return n == 0 && runs.Load() >= 6
	}, 30*time.Second, 20*time.Millisecond)
	cancel()
	wg.Wait()
	assert.EqualValues(t, 1, maxHolding.Load(), "never two purges at once")
	t.Logf("purge runs by instance: %v", purgers)
	for id, ev := range keep {
		assert.Equal(t, ev, b.get(t, id), "row %d untouched", id)
	}

	_, err := outbox.NewPublisher(b.store, newRecorder(), outbox.Config{Retention: -time.Hour})
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)

	// A store that cannot purge: retention says so, and publishing goes on.
	logs := &logSink{}
	cfg := fastConfig("no-purge", logs)
	cfg.Retention = time.Hour
	rec := newRecorder()
	runPublisher(t, newPublisher(t, nonPurger{b.store}, rec, cfg))
	id := b.insert(t, 1)[0]
	require.Eventually(t, func() bool { return rec.count(id) == 1 }, 20*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return logs.count(slog.LevelWarn, "the store cannot purge") >= 1 }, 20*time.Second, 5*time.Millisecond)
}

// nonPurger is a store that cannot purge.
type nonPurger struct{ outbox.Store }

func (nonPurger) Purge(context.Context, time.Duration, outbox.PurgeOptions) (int64, error) {
	return 0, fmt.Errorf("purge: %w", errors.ErrUnsupported)
}

func newStoreOn(t *testing.T, b *bundle, _ int, hook func(bool)) *outbox.MySQLStore {
	t.Helper()
	s, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store)})
	require.NoError(t, err)
	outbox.SetPurgeHookForTest(s, hook)
	return s
}

// Operators find an event by the event id they hold (the eventId consumers log, what
// InsertEvent returns, or a plain SQL INSERT's UUID() default), through the table's index on
// event_id, on a plain, a key-order and a partitioned table alike; a missing one is
// ErrNotFound and a malformed one ErrInvalidInput, and neither changes anything.
func TestAdminByEventID(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		setup func(*testing.T) *bundle
		index string
	}{
		{"plain", setup, "uk_event_id"},
		{"key order", orderedSetup, "uk_event_id"},
		{"partitioned", func(t *testing.T) *bundle { return newPartitioned(t, testsvc.OpenDB(t)) }, "idx_event_id"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testAdminByEventID(t, c.setup(t), c.index)
		})
	}
}

func testAdminByEventID(t *testing.T, b *bundle, index string) {
	ctx := context.Background()
	admin := b.admin()
	ctxInsert := context.Background()
	tx, err := b.store.BeginTx(ctxInsert, nil)
	require.NoError(t, err)
	insertedID, err := tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "A", Payload: []byte(`{"n":1}`)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	other := b.insertTyped(t, "A", "ORD-2")
	// Another program's plain INSERT: event_id is the server's UUID(), a version-1 UUID.
	res, err := b.db.Exec("INSERT INTO `" + outbox.TableForTest(b.store) + "` (biz_no, event_type, payload) VALUES ('ORD-3', 'B', '{}')")
	require.NoError(t, err)
	plain, err := res.LastInsertId()
	require.NoError(t, err)
	plainEventID := b.get(t, plain).EventID
	require.EqualValues(t, 1, uuid.MustParse(plainEventID).Version(), "UUID() writes version 1")

	ev, err := admin.GetByEventID(ctx, insertedID)
	require.NoError(t, err)
	assert.Equal(t, insertedID, ev.EventID)
	assert.Equal(t, "ORD-1", ev.BizNo)
	assert.Equal(t, []byte(`{"n":1}`), ev.Payload, "whole, payload and all")
	inserted := ev.ID
	ev, err = admin.GetByEventID(ctx, plainEventID)
	require.NoError(t, err)
	assert.Equal(t, plain, ev.ID)
	ev, err = admin.GetByEventID(ctx, strings.ToUpper(plainEventID))
	require.NoError(t, err, "an id copied in upper case")
	assert.Equal(t, plain, ev.ID)

	evs, err := admin.List(ctx, outbox.Filter{EventIDs: []string{insertedID, plainEventID}})
	require.NoError(t, err)
	assert.Equal(t, []int64{plain, inserted}, ids(evs))
	evs, err = admin.List(ctx, outbox.Filter{EventIDs: []string{insertedID}, BizNo: "ORD-2"})
	require.NoError(t, err)
	assert.Empty(t, evs, "fields are ANDed")

	// The lookup is served by the index on event_id.
	q := outbox.EventIDQueryForTest(b.store, 2)
	rows, err := b.db.Query("EXPLAIN "+q, plainEventID, strings.ToUpper(plainEventID))
	require.NoError(t, err)
	cols, err := rows.Columns()
	require.NoError(t, err)
	for rows.Next() {
		vals, ptrs := make([]any, len(cols)), make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		got := map[string]string{}
		for i, col := range cols {
			got[strings.ToLower(col)] = fmt.Sprintf("%s", vals[i])
		}
		t.Logf("event id lookup: type=%s key=%s rows=%s extra=%s", got["type"], got["key"], got["rows"], got["extra"])
		assert.Equal(t, index, got["key"])
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())

	// Missing and malformed ids change nothing.
	b.setState(t, inserted, outbox.StatusFail, time.Hour)
	b.setState(t, plain, outbox.StatusFail, time.Hour)
	snapshot := b.snapshot(t)
	missing := uuid.NewString()
	_, err = admin.GetByEventID(ctx, missing)
	require.ErrorIs(t, err, outbox.ErrNotFound)
	assert.Contains(t, err.Error(), missing)
	for _, bad := range []string{"", "not-a-uuid", fmt.Sprint(inserted), insertedID + "0"} {
		_, err := admin.GetByEventID(ctx, bad)
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "%q", bad)
		assert.NotErrorIs(t, err, outbox.ErrNotFound)
		_, err = admin.List(ctx, outbox.Filter{EventIDs: []string{insertedID, bad}})
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "%q", bad)
		_, err = admin.RequeueFailed(ctx, outbox.Filter{EventIDs: []string{bad}}, outbox.RequeueOptions{})
		require.ErrorIs(t, err, outbox.ErrInvalidInput, "%q", bad)
	}
	_, err = admin.GetByEventID(ctx, "")
	assert.ErrorContains(t, err, "the event id is empty")
	_, err = admin.GetByEventID(ctx, "not-a-uuid")
	assert.ErrorContains(t, err, `event id "not-a-uuid" is not a UUID`)
	n, err := admin.RequeueFailed(ctx, outbox.Filter{EventIDs: []string{missing}}, outbox.RequeueOptions{})
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Equal(t, snapshot, b.snapshot(t), "a refused call changes nothing")

	// Found by event id, requeued and skipped by the id it gives; a requeue by filter takes
	// event ids too.
	ev, err = admin.GetByEventID(ctx, insertedID)
	require.NoError(t, err)
	require.NoError(t, admin.Requeue(ctx, ev.ID))
	assert.Equal(t, outbox.StatusWait, b.get(t, inserted).Status)
	assert.Equal(t, outbox.StatusFail, b.get(t, plain).Status, "only the event named")
	ev, err = admin.GetByEventID(ctx, plainEventID)
	require.NoError(t, err)
	require.NoError(t, admin.Skip(ctx, ev.ID))
	assert.Equal(t, outbox.StatusSkipped, b.get(t, plain).Status)
	b.setState(t, inserted, outbox.StatusFail, time.Hour)
	b.setState(t, other, outbox.StatusFail, time.Hour)
	n, err = admin.RequeueFailed(ctx, outbox.Filter{EventIDs: []string{insertedID}}, outbox.RequeueOptions{})
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	assert.Equal(t, outbox.StatusWait, b.get(t, inserted).Status)
	assert.Equal(t, outbox.StatusFail, b.get(t, other).Status)
}

// A partitioned table's index on event_id is not unique (MySQL needs the partitioning
// column in every unique key), so a plain INSERT can repeat an event id there: a lookup by
// it then says so and names the rows, and changes nothing.
func TestAdminByEventIDSharedByTwoRows(t *testing.T) {
	t.Parallel()
	b := newPartitioned(t, testsvc.OpenDB(t))
	ctx := context.Background()
	first := b.insertTyped(t, "A", "ORD-1")
	eventID := b.get(t, first).EventID
	b.exec(t, "INSERT INTO {t} (event_id, biz_no, event_type, payload) VALUES (?, 'ORD-2', 'A', '{}')", eventID)
	b.setState(t, first, outbox.StatusFail, time.Hour)
	snapshot := b.snapshot(t)
	_, err := b.admin().GetByEventID(ctx, eventID)
	require.ErrorIs(t, err, outbox.ErrInvalidInput)
	assert.ErrorContains(t, err, fmt.Sprintf("is held by more than one row (ids %d and %d", first, first+1))
	assert.Equal(t, snapshot, b.snapshot(t))
}

// SkipFailed marks the FAIL events a filter selects SKIPPED, in batches, and nothing else;
// its dry run counts them and changes nothing.
func TestAdminSkipFailed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var failedA, others []int64
	for i := range 5 {
		id := b.insertTyped(t, "A", fmt.Sprint("ORD-", i))
		b.setState(t, id, outbox.StatusFail, time.Hour)
		failedA = append(failedA, id)
	}
	failedB := b.insertTyped(t, "B", "ORD-B")
	b.setState(t, failedB, outbox.StatusFail, time.Hour)
	for _, st := range []outbox.Status{outbox.StatusWait, outbox.StatusSending, outbox.StatusSuccess} {
		id := b.insertTyped(t, "A", "ORD-X")
		b.setState(t, id, st, time.Hour)
		others = append(others, id)
	}
	admin := b.admin()
	snapshot := b.snapshot(t)
	n, err := admin.SkipFailed(ctx, outbox.Filter{EventType: "A"}, outbox.RequeueOptions{DryRun: true})
	require.NoError(t, err)
	assert.EqualValues(t, 5, n)
	_, err = admin.SkipFailed(ctx, outbox.Filter{Status: outbox.StatusWait}, outbox.RequeueOptions{})
	require.ErrorIs(t, err, outbox.ErrInvalidInput, "only FAIL rows are skipped")
	assert.Equal(t, snapshot, b.snapshot(t), "a dry run and a refused filter change nothing")

	var batches [][]int64
	n, err = admin.SkipFailed(ctx, outbox.Filter{EventType: "A", MaxID: failedA[3], Limit: 3}, outbox.RequeueOptions{
		BatchRows: 2, OnBatch: func(ids []int64, _ int64) { batches = append(batches, ids) }})
	require.NoError(t, err)
	assert.EqualValues(t, 3, n, "at most Limit")
	assert.Equal(t, [][]int64{failedA[:2], failedA[2:3]}, batches)
	for i, id := range failedA {
		want := outbox.StatusSkipped
		if i >= 3 {
			want = outbox.StatusFail
		}
		assert.Equal(t, want, b.get(t, id).Status, "event %d", id)
	}
	assert.Equal(t, outbox.StatusFail, b.get(t, failedB).Status, "another type")
	for _, id := range others {
		assert.NotEqual(t, outbox.StatusSkipped, b.get(t, id).Status, "not a dead letter")
	}
}
