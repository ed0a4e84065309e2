package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// claimIDs runs one batch claim and returns the ids it took and whether more may be due.
func claimIDs(t *testing.T, store *outbox.MySQLStore, limit int) ([]int64, bool) {
	t.Helper()
	res, err := store.ClaimDue(context.Background(), outbox.ClaimRequest{Owner: "floor", Limit: limit, MaxBytes: 1 << 20})
	require.NoError(t, err)
	ids := make([]int64, len(res.Events))
	for i, ev := range res.Events {
		ids[i] = ev.ID
	}
	return ids, res.More
}

// steadyBundle is a bundle whose store has claimed once, so that its claims are steady
// ones with a floor, and never read from the start on a timer.
func steadyBundle(t *testing.T) *bundle {
	t.Helper()
	b := setup(t)
	outbox.SetFullScanEveryForTest(b.store, time.Hour)
	first := b.insert(t, 1)
	ids, more := claimIDs(t, b.store, 10)
	require.Equal(t, first, ids)
	require.False(t, more)
	return b
}

// A steady claim starts at its floor: a row made due behind it, as only a program writing
// the table directly can, is read once something says so (Notify) or a claim reads from the
// start, never lost.
func TestSteadyClaimStartsAtItsFloor(t *testing.T) {
	t.Parallel()
	b := steadyBundle(t)
	behind := b.insert(t, 1)[0]
	b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", behind)
	ids, _ := claimIDs(t, b.store, 10)
	assert.Empty(t, ids, "the claim read from its floor")

	b.store.Notify()
	ids, _ = claimIDs(t, b.store, 10)
	assert.Equal(t, []int64{behind}, ids)

	// With ScanFromStart every claim reads from the start.
	plain := newStoreLike(t, b, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), ScanFromStart: true})
	outbox.SetFullScanEveryForTest(plain, time.Hour)
	again := b.insert(t, 1)[0]
	ids, _ = claimIDs(t, plain, 10)
	require.Equal(t, []int64{again}, ids)
	b.exec(t, "UPDATE {t} SET status = 'WAIT', next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", again)
	ids, _ = claimIDs(t, plain, 10)
	assert.Equal(t, []int64{again}, ids)

	// And a claim from the start comes on its own at least every so often.
	timed := newStoreLike(t, b, outbox.MySQLConfig{Table: outbox.TableForTest(b.store)})
	outbox.SetFullScanEveryForTest(timed, 200*time.Millisecond)
	last := b.insert(t, 1)[0]
	ids, _ = claimIDs(t, timed, 10)
	require.Equal(t, []int64{last}, ids)
	b.exec(t, "UPDATE {t} SET status = 'WAIT', next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", last)
	var got []int64
	require.Eventually(t, func() bool {
		got, _ = claimIDs(t, timed, 10)
		return len(got) > 0
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, []int64{last}, got)
}

// newStoreLike opens another store on b's table with cfg.
func newStoreLike(t *testing.T, b *bundle, cfg outbox.MySQLConfig) *outbox.MySQLStore {
	t.Helper()
	s, err := outbox.NewMySQLStore(b.db, cfg)
	require.NoError(t, err)
	return s
}

// A transaction that commits long after its insert may commit behind the floor of claims
// that ran meanwhile: Tx.Commit says so, and the next claim reaches back to it. Committed
// directly, a wrapped transaction is behind the floor until Notify.
func TestLateCommitIsNotLeftBehindTheFloor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			b := steadyBundle(t)
			var tx *outbox.Tx
			if direct {
				sqlTx, err := b.db.BeginTx(ctx, nil)
				require.NoError(t, err)
				tx = b.store.WrapTx(sqlTx)
			} else {
				var err error
				tx, err = b.store.BeginTx(ctx, nil)
				require.NoError(t, err)
			}
			late, err := outbox.InsertForTest(ctx, tx, outbox.EventInput{BizNo: "LATE", EventType: "ORDER_CREATED", Payload: []byte("{}")})
			require.NoError(t, err)
			time.Sleep(100 * time.Millisecond)
			// A claim meanwhile moves the floor past the late event's due time.
			other := b.insert(t, 1)
			ids, _ := claimIDs(t, b.store, 10)
			require.Equal(t, other, ids)

			if direct {
				require.NoError(t, tx.Tx.Commit())
				ids, _ = claimIDs(t, b.store, 10)
				assert.Empty(t, ids, "behind the floor, and nobody said")
				b.store.Notify()
			} else {
				require.NoError(t, tx.Commit())
			}
			ids, _ = claimIDs(t, b.store, 10)
			assert.Equal(t, []int64{late}, ids)
		})
	}
}

// A reclaimed row keeps its old due time, far behind the floor: the reclaim makes the next
// claim read from the start.
func TestReclaimedRowIsNotLeftBehindTheFloor(t *testing.T) {
	t.Parallel()
	b := steadyBundle(t)
	stalled := b.insert(t, 1)[0]
	ids, _ := claimIDs(t, b.store, 10)
	require.Equal(t, []int64{stalled}, ids)
	b.ageClaim(t, stalled, time.Hour)
	b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 HOUR) WHERE id = ?", stalled)
	n, dead, err := b.store.ReclaimExpired(context.Background(), time.Minute, 3)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Empty(t, dead)
	ids, _ = claimIDs(t, b.store, 10)
	assert.Equal(t, []int64{stalled}, ids)
}

// A steady claim counts the due rows another claim holds: it takes fewer than it found, and
// says more may be due, so that the next claim reads on (locking as it reads).
func TestSteadyClaimCountsRowsHeldByOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := steadyBundle(t)
	ids := b.insert(t, 3)
	held, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	require.NoError(t, err)
	defer func() { _ = held.Rollback() }()
	var id int64
	require.NoError(t, held.QueryRowContext(ctx, "SELECT id FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ? FOR UPDATE", ids[0]).Scan(&id))

	got, more := claimIDs(t, b.store, 2)
	assert.Equal(t, ids[1:2], got, "the first is held, and counted")
	assert.True(t, more)
	got, more = claimIDs(t, b.store, 2)
	assert.Equal(t, ids[2:], got)
	assert.False(t, more)

	// The holder rolls back, as another instance's claim may: no store of this process hears
	// of it, so the row is claimed by the next claim that reads from the start (at most
	// fullScanEvery later; the floor may have passed it once the claims' reads were more than
	// floorSlack after its insert). Here that interval has passed.
	require.NoError(t, held.Rollback())
	outbox.SetFullScanEveryForTest(b.store, time.Nanosecond)
	got, _ = claimIDs(t, b.store, 2)
	assert.Equal(t, ids[:1], got)
}

// What the steady claim is for: the index entries of rows earlier claims took stay in the
// WAIT range until InnoDB's purge removes them, and a claim that locks as it reads checks
// each one for a lock, looking its row up. Here purge is held back (a snapshot stays open,
// as a long report would hold it), 3,000 taken rows' entries wait to be purged, and 5 rows
// are due: the page reads of one claim, from the private server's own counters.
func TestSteadyClaimPassesTheEntriesOfTakenRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.PrivateMySQL(t)
	db := srv.OpenDB(t)
	counters := srv.OpenDB(t)
	steady := testsvc.NewStore(t, db, outbox.MySQLConfig{})
	outbox.SetFullScanEveryForTest(steady, time.Hour)
	b := &bundle{db: db, store: steady}
	plain := newStoreLike(t, b, outbox.MySQLConfig{Table: outbox.TableForTest(steady), ScanFromStart: true})

	snapshot, err := db.Conn(ctx)
	require.NoError(t, err)
	defer snapshot.Close()
	_, err = snapshot.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
	require.NoError(t, err)
	defer func() { _, _ = snapshot.ExecContext(ctx, "ROLLBACK") }()

	for range 6 {
		b.insert(t, 500)
	}
	var acked []int64
	for {
		res, err := plain.ClaimDue(ctx, outbox.ClaimRequest{Owner: "taken", Limit: 500, MaxBytes: 64 << 20, Succeeded: acked})
		require.NoError(t, err)
		if len(res.Events) == 0 {
			break
		}
		acked = acked[:0]
		for _, ev := range res.Events {
			acked = append(acked, ev.ID)
		}
	}
	require.Equal(t, 3000, b.countStatus(t, outbox.StatusSuccess)+b.countStatus(t, outbox.StatusSending))

	reads := func(store *outbox.MySQLStore) (int64, int) {
		b.insert(t, 5)
		before := statusCounts(t, counters, "Innodb_buffer_pool_read_requests")["Innodb_buffer_pool_read_requests"]
		ids, more := claimIDs(t, store, 100)
		after := statusCounts(t, counters, "Innodb_buffer_pool_read_requests")["Innodb_buffer_pool_read_requests"]
		require.False(t, more)
		return after - before, len(ids)
	}
	// The steady store claims once to set its floor (and once more so that its claims are
	// steady ones), then from it.
	claimIDs(t, steady, 100)
	b.insert(t, 1)
	claimIDs(t, steady, 100)
	fromFloor, n := reads(steady)
	require.Equal(t, 5, n)
	steady.Notify()
	fromStart, n := reads(steady)
	require.Equal(t, 5, n)
	locking, n := reads(plain)
	require.Equal(t, 5, n)
	t.Logf("page reads of a claim of 5 rows behind 3,000 taken rows: steady from its floor %d, steady from the start %d, locking as it reads %d",
		fromFloor, fromStart, locking)
	assert.Less(t, fromFloor*10, locking, "the claim from its floor passes the taken rows' entries")
}

// A claim that fails leaves the rows it had locked WAIT, wherever they are in the range: the
// next claim reads from the start. Here the claim's UPDATE never reaches the server (its
// connection is lost), and a row moved behind the floor beforehand is claimed next.
func TestFailedClaimResetsTheFloor(t *testing.T) {
	t.Parallel()
	c := &faultyConnector{}
	db := openFaulty(t, c)
	b := &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{})}
	outbox.SetFullScanEveryForTest(b.store, time.Hour)
	first := b.insert(t, 1)
	ids, _ := claimIDs(t, b.store, 10)
	require.Equal(t, first, ids)
	behind := b.insert(t, 1)[0]
	b.exec(t, "UPDATE {t} SET next_retry_time = DATE_SUB(UTC_TIMESTAMP(3), INTERVAL 1 MINUTE) WHERE id = ?", behind)
	ids, _ = claimIDs(t, b.store, 10)
	require.Empty(t, ids, "behind the floor")

	var armed atomic.Bool
	armed.Store(true)
	c.beforeExec = func(q string) error {
		if strings.Contains(q, "claimed_at = IF(status = 'WAIT'") && armed.CompareAndSwap(true, false) {
			return errors.New("connection lost")
		}
		return nil
	}
	locked := b.insert(t, 1)[0]
	_, err := b.store.ClaimDue(context.Background(), outbox.ClaimRequest{Owner: "floor", Limit: 10, MaxBytes: 1 << 20})
	require.Error(t, err)
	require.False(t, armed.Load(), "the claim's UPDATE failed")

	// The lost connection's transaction ends when the server notices; its locks hold until
	// then (rows another claim holds are skipped, and a rollback of theirs is a case for the
	// timed claim from the start, not this test's).
	require.Eventually(t, func() bool {
		tx, err := db.BeginTx(context.Background(), nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		rows, err := tx.Query("SELECT id FROM `"+outbox.TableForTest(b.store)+"` WHERE id IN (?, ?) FOR UPDATE NOWAIT", behind, locked)
		if err != nil {
			return false
		}
		defer rows.Close()
		for rows.Next() {
		}
		return rows.Err() == nil
	}, 30*time.Second, 10*time.Millisecond)
	ids, _ = claimIDs(t, b.store, 10)
	assert.ElementsMatch(t, []int64{behind, locked}, ids)
}
