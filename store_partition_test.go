package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
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

// The partitioned table (MySQLConfig.PartitionIDs) and the purge's maintenance of it, on
// the real server. Partitions here hold 1,000 ids, the smallest PartitionIDs allowed.

const (
	partIDs   = 1000
	partAge   = 30 * 24 * time.Hour // the retention these tests purge with
	oldUpdate = 60 * 24 * time.Hour // the age of the rows written as history
)

// newPartitioned returns a partitioned table's bundle on db.
func newPartitioned(t *testing.T, db *sql.DB) *bundle {
	t.Helper()
	return &bundle{db: db, store: testsvc.NewStore(t, db, outbox.MySQLConfig{PartitionIDs: partIDs})}
}

// partitions lists the table's partitions in order.
func (b *bundle) partitions(t testing.TB) []string {
	t.Helper()
	rows, err := b.db.Query(`SELECT PARTITION_NAME FROM information_schema.PARTITIONS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY PARTITION_ORDINAL_POSITION`, outbox.TableForTest(b.store))
	require.NoError(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n sql.NullString
		require.NoError(t, rows.Scan(&n))
		out = append(out, n.String)
	}
	require.NoError(t, rows.Err())
	return out
}

// history writes the rows with ids from..to (inclusive) as SUCCESS events created, sent
// and acknowledged age ago, with explicit ids: the history a retention removes.
func (b *bundle) history(t testing.TB, from, to int64, age time.Duration) {
	t.Helper()
	at := fmt.Sprintf("DATE_SUB(UTC_TIMESTAMP(3), INTERVAL %d SECOND)", int64(age.Seconds()))
	for lo := from; lo <= to; lo += 500 {
		hi := min(lo+499, to)
		var q strings.Builder
		q.WriteString("INSERT INTO {t} (id, event_id, biz_no, event_type, payload, status, next_retry_time, claim_owner, claimed_at, create_time, update_time) VALUES ")
		args := make([]any, 0, 2*(hi-lo+1))
		for id := lo; id <= hi; id++ {
			if id > lo {
				q.WriteByte(',')
			}
			q.WriteString("(?, ?, 'ORD', 'ORDER_CREATED', '{}', 'SUCCESS', " + at + ", 'old', " + at + ", " + at + ", " + at + ")")
			args = append(args, id, uuid.Must(uuid.NewV7()).String())
		}
		_, err := b.db.Exec(strings.ReplaceAll(q.String(), "{t}", "`"+outbox.TableForTest(b.store)+"`"), args...)
		require.NoError(t, err)
	}
}

// count counts the table's rows that match where.
func (b *bundle) count(t testing.TB, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM `"+outbox.TableForTest(b.store)+"` WHERE "+where, args...).Scan(&n))
	return n
}

// statusOf reads one row's status.
func (b *bundle) statusOf(t testing.TB, id int64) string {
	t.Helper()
	var s string
	require.NoError(t, b.db.QueryRow("SELECT status FROM `"+outbox.TableForTest(b.store)+"` WHERE id = ?", id).Scan(&s))
	return s
}

// CreateSchema makes the partitioned layout: three partitions of PartitionIDs ids and the
// catch-all, event_id indexed but no longer unique (a unique key must contain id); the
// table takes events and claims as an unpartitioned one does.
func TestPartitionedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newPartitioned(t, testsvc.OpenDB(t))
	assert.Equal(t, []string{"p1000", "p2000", "p3000", "pmax"}, b.partitions(t))
	var uniques []string
	rows, err := b.db.Query(`SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND NON_UNIQUE = 0`, outbox.TableForTest(b.store))
	require.NoError(t, err)
	for rows.Next() {
		var n string
		require.NoError(t, rows.Scan(&n))
		uniques = append(uniques, n)
	}
	require.NoError(t, rows.Close())
	assert.Equal(t, []string{"PRIMARY"}, uniques)
	var cols string
	require.NoError(t, b.db.QueryRow(`SELECT GROUP_CONCAT(COLUMN_NAME) FROM information_schema.STATISTICS
	WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND INDEX_NAME = 'idx_event_id'`, outbox.TableForTest(b.store)).Scan(&cols))
	assert.Equal(t, "event_id", cols)

	require.NoError(t, b.store.CreateSchema(ctx), "an existing partitioned table is fine")
	_, err = b.store.Check(ctx)
	require.NoError(t, err)

	ids := b.insert(t, 3)
	evs, _, err := claimDue(ctx, b.store, "part-1", 10, 1<<20)
	require.NoError(t, err)
	require.Len(t, evs, 3)
	claimed := make([]int64, len(evs))
	for i, ev := range evs {
		claimed[i] = ev.ID
	}
	acked, err := b.store.MarkSuccess(ctx, claimed, "part-1")
	require.NoError(t, err)
	assert.Equal(t, int64(3), acked)
	assert.Equal(t, 3, b.count(t, "status = 'SUCCESS' AND id IN (?, ?, ?)", ids[0], ids[1], ids[2]))
}

// A key-ordered table can be partitioned too: its index idx_biz_no_status and the
// partitions together.
func TestPartitionedOrderedSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := &bundle{db: testsvc.OpenDB(t)}
	b.store = testsvc.NewStore(t, b.db, outbox.MySQLConfig{PartitionIDs: partIDs, Ordering: outbox.KeyOrder})
	assert.Equal(t, []string{"p1000", "p2000", "p3000", "pmax"}, b.partitions(t))
	info, err := b.store.Check(ctx)
	require.NoError(t, err)
	assert.Equal(t, outbox.KeyOrder, info.Ordering)
}

func TestPartitionIDsValidated(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	for _, n := range []int64{-1, 1, 999, 1 << 62} {
		_, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{PartitionIDs: n})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, "PartitionIDs %d", n)
		assert.ErrorContains(t, err, "PartitionIDs")
	}
}

// The purge drops a partition only when every row in it is SUCCESS or SKIPPED and older
// than the retention, and only once an id at or above its bound exists. A partition
// holding a WAIT, a SENDING or a FAIL row, or a final row updated since, is kept; its old
// final rows are deleted in batches. It adds partitions ahead of the ids, moving the rows
// that had reached the catch-all partition into partitions of their own.
func TestPurgeDropsOnlyFinalPartitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newPartitioned(t, testsvc.OpenDB(t))
	b.history(t, 1, 5500, oldUpdate) // ids 3000 and up are in the catch-all partition
	b.exec(t, "UPDATE {t} SET status = 'WAIT', next_retry_time = UTC_TIMESTAMP(3) + INTERVAL 1 DAY WHERE id = 1500")
	b.exec(t, "UPDATE {t} SET status = 'SENDING', claim_owner = 'stuck' WHERE id = 2500")
	b.exec(t, "UPDATE {t} SET status = 'FAIL' WHERE id = 3500")
	b.exec(t, "UPDATE {t} SET status = 'SKIPPED', update_time = UTC_TIMESTAMP(3) WHERE id = 4500") // skipped just now

	var batches []int64
	n, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{BatchRows: 300, OnBatch: func(d int64) { batches = append(batches, d) }})
	require.NoError(t, err)
	// p1000 (ids 1..999) dropped; p2000 to p5000 keep their kept row, the rest deleted;
	// p6000's rows (5000..5500) wait: no id at or above 6000 exists yet.
	assert.Equal(t, int64(999+4*999), n)
	assert.Equal(t, int64(999), batches[0], "the dropped partition's rows, first")
	assert.Equal(t, []string{"p2000", "p3000", "p4000", "p5000", "p6000", "p7000", "p8000", "pmax"}, b.partitions(t))
	assert.Equal(t, "WAIT", b.statusOf(t, 1500))
	assert.Equal(t, "SENDING", b.statusOf(t, 2500))
	assert.Equal(t, "FAIL", b.statusOf(t, 3500))
	assert.Equal(t, "SKIPPED", b.statusOf(t, 4500))
	assert.Equal(t, 4+501, b.count(t, "TRUE"))
	assert.Equal(t, 501, b.count(t, "id >= 5000"))
	_, err = b.store.Check(ctx)
	require.NoError(t, err)

	n, err = b.store.Purge(ctx, partAge, outbox.PurgeOptions{})
	require.NoError(t, err)
	assert.Zero(t, n, "nothing more is old and final")
	n, err = b.store.Purge(ctx, partAge, outbox.PurgeOptions{DryRun: true})
	require.NoError(t, err)
	assert.Zero(t, n)

	// The WAIT row sent long ago: its partition goes whole.
	b.exec(t, "UPDATE {t} SET status = 'SUCCESS', update_time = UTC_TIMESTAMP(3) - INTERVAL 40 DAY WHERE id = 1500")
	n, err = b.store.Purge(ctx, partAge, outbox.PurgeOptions{DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, int64(1), n, "dry run")
	n, err = b.store.Purge(ctx, partAge, outbox.PurgeOptions{})
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	assert.Equal(t, []string{"p3000", "p4000", "p5000", "p6000", "p7000", "p8000", "pmax"}, b.partitions(t))
}

// A limit smaller than a droppable partition's rows removes that many of them in batches
// instead of dropping it (or nothing at all); the partition goes whole once the limit
// allows what is left of it.
func TestPurgeLimitBelowAPartitionDeletesInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := newPartitioned(t, testsvc.OpenDB(t))
	b.history(t, 1, 1500, oldUpdate) // p1000 (ids 1..999) is droppable: an id above it exists

	n, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{Limit: 400, DryRun: true})
	require.NoError(t, err)
	assert.Equal(t, int64(400), n, "dry run")
	n, err = b.store.Purge(ctx, partAge, outbox.PurgeOptions{Limit: 400, BatchRows: 150})
	require.NoError(t, err)
	assert.Equal(t, int64(400), n)
	assert.Equal(t, 999-400, b.count(t, "id < 1000"), "the oldest 400 deleted")
	assert.Zero(t, b.count(t, "id <= 400"), "oldest first")
	assert.Contains(t, b.partitions(t), "p1000", "not dropped: the limit is below its rows")

	n, err = b.store.Purge(ctx, partAge, outbox.PurgeOptions{Limit: 599})
	require.NoError(t, err)
	assert.Equal(t, int64(599), n)
	assert.NotContains(t, b.partitions(t), "p1000", "what is left of it fits the limit: dropped whole")
	assert.Zero(t, b.count(t, "id < 1000"))
}

// One instance maintains the partitions at a time: a second purge, exclusive or not, while
// the first holds the purge lock, returns ErrPurgeBusy and changes nothing.
func TestPartitionMaintenanceOneAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	b := newPartitioned(t, db)
	b.history(t, 1, 1500, oldUpdate)
	other, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), PartitionIDs: partIDs})
	require.NoError(t, err)

	holding, resume := make(chan struct{}), make(chan struct{})
	outbox.SetPartitionHookForTest(b.store, func(step string) {
		if step == "lock" {
			close(holding)
			<-resume
		}
	})
	var wg sync.WaitGroup
	var first int64
	var firstErr error
	wg.Go(func() { first, firstErr = b.store.Purge(ctx, partAge, outbox.PurgeOptions{Exclusive: true}) })
	<-holding
	for _, exclusive := range []bool{true, false} {
		n, err := other.Purge(ctx, partAge, outbox.PurgeOptions{Exclusive: exclusive})
		require.ErrorIs(t, err, outbox.ErrPurgeBusy, "exclusive %v", exclusive)
		assert.Zero(t, n)
	}
	assert.Equal(t, []string{"p1000", "p2000", "p3000", "p4000", "pmax"}, b.partitions(t), "the first purge's partitions ahead, and nothing more")
	close(resume)
	wg.Wait()
	require.NoError(t, firstErr)
	assert.Equal(t, int64(999), first)
	assert.Equal(t, []string{"p2000", "p3000", "p4000", "pmax"}, b.partitions(t))
}

// openInsertIntoOldPartition writes old sent rows around id 999 (p1000 then looks
// droppable), adds the partitions ahead with a purge that drops nothing (so that the next
// purge has no statement to run before its drop), and returns a transaction, still open,
// that has inserted row 999 (WAIT) into p1000.
func (b *bundle) openInsertIntoOldPartition(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	ctx := context.Background()
	b.history(t, 1, 998, oldUpdate)
	b.history(t, 1000, 1200, oldUpdate)
	n, err := b.store.Purge(ctx, 90*24*time.Hour, outbox.PurgeOptions{})
	require.NoError(t, err)
	require.Zero(t, n)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.Exec("INSERT INTO `"+outbox.TableForTest(b.store)+"` (id, event_id, biz_no, event_type, payload, next_retry_time, create_time, update_time) "+
		"VALUES (999, ?, 'late', 'ORDER_CREATED', '{}', UTC_TIMESTAMP(3), UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))", uuid.Must(uuid.NewV7()).String())
	require.NoError(t, err)
	return tx
}

// A row that a transaction still open inserts into a partition that looks droppable (all
// its committed rows old and final) keeps the partition: the drop locks the table, which
// waits for the transaction, and looks again.
func TestPartitionDropWaitsForOpenInserts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	b := newPartitioned(t, db)
	tx := b.openInsertIntoOldPartition(t, db)
	committed := make(chan error, 1)
	outbox.SetPartitionHookForTest(b.store, func(step string) {
		if step != "lock" {
			return
		}
		// The transaction commits once the drop's LOCK TABLES waits for it.
		go func() {
			for range 2000 {
				var waiting int
				if err := db.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
				WHERE INFO LIKE 'LOCK TABLES%' AND STATE LIKE '%metadata lock%'`).Scan(&waiting); err != nil || waiting > 0 {
					break
				}
				time.Sleep(2 * time.Millisecond)
			}
			committed <- tx.Commit()
		}()
	})
	n, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{})
	require.NoError(t, err)
	require.NoError(t, <-committed)
	assert.Equal(t, int64(998), n, "the partition's old rows deleted in batches instead")
	assert.Contains(t, b.partitions(t), "p1000")
	assert.Equal(t, "WAIT", b.statusOf(t, 999))
}

// A row that a transaction still open during the plan inserts into a partition that looks
// droppable, and that is sent before the drop locks the table, keeps the partition too: it
// is final, but younger than the retention. The drop looks for such rows with the table
// locked, and the partition's old rows are deleted in batches instead.
func TestPartitionDropKeepsRowsSentSinceThePlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	b := newPartitioned(t, db)
	tx := b.openInsertIntoOldPartition(t, db)
	var hookErr error
	outbox.SetPartitionHookForTest(b.store, func(step string) {
		if step != "lock" {
			return
		}
		// After the plan, before the lock: the transaction commits and its event is sent,
		// as a publisher's claim and acknowledgement write it.
		if hookErr = tx.Commit(); hookErr == nil {
			_, hookErr = db.Exec("UPDATE `" + outbox.TableForTest(b.store) + "` SET status = 'SUCCESS', claim_owner = 'publisher', " +
				"claimed_at = UTC_TIMESTAMP(3), update_time = UTC_TIMESTAMP(3) WHERE id = 999 AND status = 'WAIT'")
		}
	})
	n, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{})
	require.NoError(t, err)
	require.NoError(t, hookErr)
	assert.Equal(t, int64(998), n, "the partition's old rows deleted in batches instead")
	assert.Contains(t, b.partitions(t), "p1000")
	assert.Equal(t, "SUCCESS", b.statusOf(t, 999), "the row sent just now stays for the retention")
}

// A purge of a partitioned table fails, and loses nothing, when the database goes down
// before one of its partition statements; the next purge, once it is back, does the work.
func TestPartitionMaintenanceDatabaseDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.PrivateMySQL(t)
	b := newPartitioned(t, srv.OpenDB(t))
	b.history(t, 1, 4500, oldUpdate)
	b.exec(t, "UPDATE {t} SET status = 'WAIT' WHERE id = 2500")
	for _, step := range []string{"reorganize", "lock", "drop"} {
		var once sync.Once
		outbox.SetPartitionHookForTest(b.store, func(s string) {
			if s == step {
				once.Do(func() { srv.Kill(t) })
			}
		})
		_, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{Exclusive: true})
		require.Error(t, err, "the database went down before %s", step)
		srv.Start(t)
		outbox.SetPartitionHookForTest(b.store, nil)
		require.Eventually(t, func() bool { return b.db.PingContext(ctx) == nil }, time.Minute, 100*time.Millisecond)
		_, err = b.store.Check(ctx)
		require.NoError(t, err, "the layout after a crash before %s", step)
		require.Equal(t, "WAIT", b.statusOf(t, 2500))
	}
	n, err := b.store.Purge(ctx, partAge, outbox.PurgeOptions{Exclusive: true})
	require.NoError(t, err)
	assert.Positive(t, n)
	assert.NotContains(t, b.partitions(t), "p1000")
	assert.Contains(t, b.partitions(t), "p3000", "the partition of the WAIT row")
	assert.Equal(t, "WAIT", b.statusOf(t, 2500))
}

// A server that cannot partition (MariaDB without its partition plugin) gets a clear
// error from CreateSchema and Check, never a half-made table.
func TestPartitionsOnAServerWithoutPartitioning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := testsvc.PrivateMySQL(t, "--skip-partition")
	db := srv.OpenDB(t)
	table := testsvc.UniqueTable("t_event")
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: table, PartitionIDs: partIDs})
	require.NoError(t, err)
	err = store.CreateSchema(ctx)
	t.Logf("CreateSchema: %v", err)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.ErrorContains(t, err, "partition plugin")
	var n int
	require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?", table).Scan(&n))
	assert.Zero(t, n, "no table made")

	testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table}) // the table without partitions
	_, err = store.Check(ctx)
	t.Logf("Check: %v", err)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.ErrorContains(t, err, "cannot partition tables")
}

// Upgrading an existing table as docs/upgrading.md says: the ALTER TABLE that Check names
// (the one the page shows) partitions it, keeps every row and event id, and the store of
// a partitioned table works on it.
func TestUpgradeToPartitionedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	old := setup(t)
	old.insert(t, 5)
	old.history(t, 100, 1400, oldUpdate)
	before := old.eventIDs(t)
	table := outbox.TableForTest(old.store)

	store, err := outbox.NewMySQLStore(old.db, outbox.MySQLConfig{Table: table, PartitionIDs: partIDs})
	require.NoError(t, err)
	_, err = store.Check(ctx)
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	require.ErrorIs(t, store.CreateSchema(ctx), outbox.ErrInvalidConfig)
	msg := err.Error()
	i, j := strings.Index(msg, "run: "), strings.Index(msg, "; (a copy")
	require.True(t, i >= 0 && j > i, msg)
	alter := msg[i+len("run: ") : j]
	want := "ALTER TABLE `" + table + "` DROP INDEX uk_event_id, ADD INDEX idx_event_id (event_id) PARTITION BY RANGE (id) (" +
		"PARTITION p2000 VALUES LESS THAN (2000), PARTITION p3000 VALUES LESS THAN (3000), PARTITION p4000 VALUES LESS THAN (4000), " +
		"PARTITION pmax VALUES LESS THAN MAXVALUE)"
	assert.Equal(t, want, alter)
	page, err := os.ReadFile("docs/upgrading.md")
	require.NoError(t, err)
	assert.Contains(t, string(page), "DROP INDEX uk_event_id, ADD INDEX idx_event_id (event_id) PARTITION BY RANGE (id) (",
		"docs/upgrading.md shows the statement")

	_, err = old.db.Exec(alter)
	require.NoError(t, err)
	_, err = store.Check(ctx)
	require.NoError(t, err)
	require.NoError(t, store.CreateSchema(ctx))
	up := &bundle{db: old.db, store: store}
	assert.Equal(t, before, up.eventIDs(t), "every row and event id kept")
	assert.Equal(t, []string{"p2000", "p3000", "p4000", "pmax"}, up.partitions(t))
	up.insert(t, 2)
	evs, _, err := claimDue(ctx, store, "up-1", 100, 1<<20)
	require.NoError(t, err)
	assert.Len(t, evs, 7, "the events from before the upgrade and after")
	n, err := store.Purge(ctx, partAge, outbox.PurgeOptions{})
	require.NoError(t, err)
	assert.Zero(t, n, "the old rows share their partition with WAIT rows and new ones: they wait for it")
}

// The publishers' retention loop maintains a partitioned table: two instances with
// Retention set drop the old partition of sent events, add partitions ahead, keep the
// partition of an unsent event, never purge side by side, and publish meanwhile.
func TestRetentionLoopDropsPartitions(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	b := newPartitioned(t, db)
	b.history(t, 1, 2500, oldUpdate)
	b.exec(t, "UPDATE {t} SET status = 'WAIT', next_retry_time = UTC_TIMESTAMP(3) + INTERVAL 1 DAY WHERE id = 1500")
	var holding, maxHolding atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	rec := newRecorder()
	for i := range 2 {
		store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), PartitionIDs: partIDs})
		require.NoError(t, err)
		outbox.SetPurgeHookForTest(store, func(h bool) {
			if !h {
				holding.Add(-1)
				return
			}
			n := holding.Add(1)
			for m := maxHolding.Load(); n > m && !maxHolding.CompareAndSwap(m, n); m = maxHolding.Load() {
			}
		})
		cfg := fastConfig(fmt.Sprint("part-retain-", i), &logSink{})
		cfg.Retention = partAge
		cfg.Tuning.RetentionInterval = 5 * time.Millisecond
		p := newPublisher(t, store, rec, cfg)
		wg.Go(func() { _ = p.Run(ctx) })
	}
	ids := b.insert(t, 20)
	require.Eventually(t, func() bool {
		parts := b.partitions(t)
		return len(parts) > 0 && parts[0] == "p2000" && slices.Contains(parts, "p4000") && b.count(t, "id BETWEEN 1000 AND 1999") == 1
	}, 30*time.Second, 20*time.Millisecond, "p1000 dropped, p4000 added, the old sent rows of p2000 deleted")
	require.Eventually(t, func() bool { return rec.total() >= len(ids) }, 30*time.Second, 5*time.Millisecond)
	cancel()
	wg.Wait()
	assert.EqualValues(t, 1, maxHolding.Load(), "never two purges at once")
	assert.Equal(t, "WAIT", b.statusOf(t, 1500))
}
