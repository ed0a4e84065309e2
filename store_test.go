package outbox_test

import (
	"context"
	"database/sql"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

func TestMySQLStoreRequeueDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.admin().Get(context.Background(), 424242)
	require.ErrorIs(t, err, outbox.ErrNotFound)
}

// Each event gets a UUIDv7 at insert, in canonical form, different from every other, in the
// order of the inserts (so that uk_event_id grows at its end), and Get shows it.
func TestMySQLStoreEventIDIsAUUIDv7(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := append(b.insert(t, 50), b.insert(t, 50)...)
	seen := map[string]int64{}
	eventIDs := make([]string, len(ids))
	for i, id := range ids {
		ev := b.get(t, id)
		u, err := uuid.Parse(ev.EventID)
		require.NoError(t, err, "event %d: %q", id, ev.EventID)
		assert.Equal(t, uuid.Version(7), u.Version(), "event %d: %s", id, ev.EventID)
		assert.Equal(t, uuid.RFC4122, u.Variant(), "event %d: %s", id, ev.EventID)
		assert.Equal(t, u.String(), ev.EventID, "canonical: lowercase, with hyphens")
		if prev, dup := seen[ev.EventID]; dup {
			t.Errorf("events %d and %d share event id %s", prev, id, ev.EventID)
		}
		seen[ev.EventID] = id
		eventIDs[i] = ev.EventID
	}
	assert.True(t, slices.IsSorted(eventIDs), "event ids ascend with the inserts")
	assert.Equal(t, b.eventIDs(t)[ids[0]], eventIDs[0], "Get shows the stored id")
}

// Row ids repeat between tables and when a table is recreated; event ids never do. This is
// the case a consumer deduplicating on the row id gets wrong: the second table's events, or
// the recreated table's, look like the first one's and are dropped.
func TestMySQLStoreEventIDsNeverRepeatAcrossTablesOrRecreation(t *testing.T) {
	t.Parallel()
	a, other := setup(t), setup(t)
	ctx := context.Background()
	rowIDs := a.insert(t, 10)
	require.Equal(t, rowIDs, other.insert(t, 10), "two tables: the same row ids")
	first, second := a.eventIDs(t), other.eventIDs(t)
	for id, eid := range first {
		assert.NotContains(t, slices.Collect(maps.Values(second)), eid, "event %d", id)
	}

	// Recreated: DROP and CreateSchema, as a reset or a restore from an empty backup would.
	a.exec(t, "DROP TABLE {t}")
	require.NoError(t, a.store.CreateSchema(ctx))
	require.Equal(t, rowIDs, a.insert(t, 10), "the recreated table: the same row ids again")
	recreated := a.eventIDs(t)
	for id, eid := range recreated {
		assert.NotEqual(t, first[id], eid, "row %d got its predecessor's event id", id)
		assert.NotContains(t, slices.Collect(maps.Values(first)), eid, "row %d", id)
	}

	// uk_event_id: a row that repeats an event id, a copy say, is refused.
	_, err := a.db.Exec("INSERT INTO `"+outbox.TableForTest(a.store)+"` (event_id, biz_no, event_type, payload, next_retry_time, create_time, update_time) "+
		"SELECT event_id, biz_no, event_type, payload, next_retry_time, create_time, update_time FROM `"+outbox.TableForTest(a.store)+"` WHERE id = ?", rowIDs[0])
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	assert.Equal(t, uint16(1062), me.Number, "duplicate key")
}

// A table made before event ids: CreateSchema says so at startup, and so does every
// statement that needs the column, naming the fix. docs/upgrading.md's upgrade then makes it
// usable, with an id for every row it already had.
func TestMySQLStoreTableWithoutEventIDNamesTheUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.insert(t, 3)
	b.exec(t, "ALTER TABLE {t} DROP INDEX uk_event_id, DROP COLUMN event_id, DROP COLUMN reclaim_count") // the old layout

	err := b.store.CreateSchema(ctx)
	require.Error(t, err)
	t.Logf("CreateSchema: %v", err)
	assert.Contains(t, err.Error(), "lacks the event_id, reclaim_count columns")
	assert.Contains(t, err.Error(), "docs/upgrading.md")
	tx, err := b.store.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = tx.InsertEvent(ctx, outbox.EventInput{BizNo: "ORD-1", EventType: "ORDER_CREATED", Payload: []byte("{}")})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no event_id column")
	require.NoError(t, tx.Rollback())
	_, err = b.store.Candidates(ctx, 10)
	require.Error(t, err)
	t.Logf("Candidates: %v", err)
	assert.Contains(t, err.Error(), "docs/upgrading.md")

	// docs/upgrading.md's statements.
	b.exec(t, "ALTER TABLE {t} ADD COLUMN event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL AFTER id")
	b.exec(t, "UPDATE {t} SET event_id = UUID() WHERE event_id IS NULL")
	b.exec(t, "ALTER TABLE {t} MODIFY event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL, "+
		"ADD UNIQUE KEY uk_event_id (event_id), ADD COLUMN reclaim_count INT NOT NULL DEFAULT 0 AFTER retry_count")

	require.NoError(t, b.store.CreateSchema(ctx))
	ids := append(slices.Sorted(maps.Keys(b.eventIDs(t))), b.insert(t, 1)...)
	seen := map[string]bool{}
	for _, id := range ids {
		ev := b.get(t, id)
		_, err := uuid.Parse(ev.EventID)
		require.NoError(t, err, "event %d: %q", id, ev.EventID)
		assert.False(t, seen[ev.EventID], "event %d repeats %s", id, ev.EventID)
		seen[ev.EventID] = true
	}
	assert.Len(t, seen, 4)
}

func TestMySQLStoreMissingTableNamesTheFix(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	store, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{Table: testsvc.UniqueTable("t_missing")})
	require.NoError(t, err)
	_, err = store.Candidates(context.Background(), 1)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CreateSchema")
}

func TestMySQLStoreCreateSchemaIsIdempotentAndIndexed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.NoError(t, b.store.CreateSchema(context.Background()), "a second CreateSchema is a no-op")

	rows, err := b.db.Query("SELECT index_name, column_name, seq_in_index FROM information_schema.statistics "+
		"WHERE table_schema = DATABASE() AND table_name = ? ORDER BY index_name, seq_in_index", outbox.TableForTest(b.store))
	require.NoError(t, err)
	defer rows.Close()
	got := map[string][]string{}
	for rows.Next() {
		var idx, col string
		var seq int
		require.NoError(t, rows.Scan(&idx, &col, &seq))
		got[idx] = append(got[idx], col)
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"status", "next_retry_time"}, got["idx_status_next_retry"])
	assert.Equal(t, []string{"status", "claimed_at"}, got["idx_status_claimed_at"])
	assert.Equal(t, []string{"event_id"}, got["uk_event_id"])
	var nonUnique int
	require.NoError(t, b.db.QueryRow("SELECT MIN(non_unique) FROM information_schema.statistics "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND index_name = 'uk_event_id'", outbox.TableForTest(b.store)).Scan(&nonUnique))
	assert.Zero(t, nonUnique, "uk_event_id is unique")
	var position int
	require.NoError(t, b.db.QueryRow("SELECT ordinal_position FROM information_schema.columns "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'event_id'", outbox.TableForTest(b.store)).Scan(&position))
	assert.Equal(t, 2, position, "event_id comes right after id")

	var precision int
	require.NoError(t, b.db.QueryRow("SELECT datetime_precision FROM information_schema.columns "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND column_name = 'claimed_at'", outbox.TableForTest(b.store)).Scan(&precision))
	assert.Equal(t, 3, precision, "millisecond time columns")

	// The columns a claim writes are fixed-width and never NULL, so a claim rewrites its row
	// in place (schema.sql says why).
	columns := map[string]string{}
	rows, err = b.db.Query("SELECT column_name, column_type, is_nullable, COALESCE(collation_name, '') FROM information_schema.columns "+
		"WHERE table_schema = DATABASE() AND table_name = ? AND column_name IN ('status', 'claim_owner', 'claimed_at', 'event_id')", outbox.TableForTest(b.store))
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var name, typ, nullable, collation string
		require.NoError(t, rows.Scan(&name, &typ, &nullable, &collation))
		columns[name] = strings.ReplaceAll(typ, " ", "") + " null=" + nullable
		if name == "claim_owner" || name == "event_id" {
			columns[name] += " " + collation // status's collation is the server's default
		}
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, map[string]string{
		"status":      "enum('WAIT','SENDING','SUCCESS','FAIL','SKIPPED') null=NO",
		"claim_owner": "char(64) null=NO utf8mb4_bin",
		"claimed_at":  "datetime(3) null=NO",
		// written once; ASCII, exactly 36 bytes, compared byte for byte
		"event_id": "char(36) null=NO ascii_bin",
	}, columns)
}

// claimResult is what a ClaimDue running in the background returned.
type claimResult struct {
	evs []outbox.Event
	err error
}

func claimInBackground(ctx context.Context, s outbox.Store, owner string) <-chan claimResult {
	done := make(chan claimResult, 1)
	go func() {
		evs, _, err := claimDue(ctx, s, owner, 10, 1<<20)
		done <- claimResult{evs, err}
	}()
	return done
}

// holdClaimTurn takes store's claim lock on a connection of its own, as another instance's
// claim would, and returns the function that releases it.
func holdClaimTurn(t *testing.T, b *bundle) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := b.db.Conn(ctx)
	require.NoError(t, err)
	var got int
	require.NoError(t, conn.QueryRowContext(ctx, "SELECT GET_LOCK("+outbox.ClaimLockNameForTest(b.store)+", 0)").Scan(&got))
	require.Equal(t, 1, got, "the claim lock is free before the test takes it")
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := conn.ExecContext(ctx, "DO RELEASE_LOCK("+outbox.ClaimLockNameForTest(b.store)+")")
			assert.NoError(t, err)
			assert.NoError(t, conn.Close())
		})
	}
	t.Cleanup(release)
	return release
}

// claimTurnFree reports whether nobody holds store's claim lock.
func claimTurnFree(t *testing.T, db *sql.DB, store *outbox.MySQLStore) bool {
	t.Helper()
	var free int
	require.NoError(t, db.QueryRow("SELECT IS_FREE_LOCK("+outbox.ClaimLockNameForTest(store)+")").Scan(&free))
	return free == 1
}

// waitingForTurn reports whether a session is waiting in GET_LOCK for this table's claim lock.
func waitingForTurn(t *testing.T, b *bundle) bool {
	t.Helper()
	var n int
	require.NoError(t, b.db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
		"WHERE INFO LIKE 'SELECT GET_LOCK(%' AND INFO LIKE CONCAT('%', ?, '%')", outbox.TableForTest(b.store)).Scan(&n))
	return n > 0
}

// Batch claims take turns: while another instance holds the turn, a claim waits (here for up
// to a minute), and it claims as soon as the turn is released. It leaves the lock free.
func TestMySQLStoreBatchClaimsTakeTurns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	b.insert(t, 3)
	release := holdClaimTurn(t, b)

	done := claimInBackground(context.Background(), b.store, "owner-a")
	require.Eventually(t, func() bool { return waitingForTurn(t, b) }, 10*time.Second, 10*time.Millisecond,
		"the claim waits for its turn")
	select {
	case r := <-done:
		t.Fatalf("claimed while another instance held the turn: %d events, %v", len(r.evs), r.err)
	default:
	}
	release()
	r := <-done
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 3)
	assert.True(t, claimTurnFree(t, b.db, b.store), "the claim released its turn")
}

// A claim that does not get its turn in time goes ahead without it: the turn only orders
// claims, and SKIP LOCKED and the conditional UPDATE keep them correct. The store's next
// claims do not ask for the turn at all for a while, so a session that holds the lock and
// never lets go costs one wait, not one per claim.
func TestMySQLStoreBatchClaimGoesAheadAfterTheTurnWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, 3)
	holdClaimTurn(t, b) // held for the whole test

	r := <-claimInBackground(context.Background(), b.store, "owner-a")
	require.NoError(t, r.err)
	require.Len(t, r.evs, 3)
	for _, id := range ids {
		got := b.get(t, id)
		assert.Equal(t, outbox.StatusSending, got.Status)
		assert.Equal(t, "owner-a", got.ClaimOwner)
	}

	// A claim that asked for the turn now would wait a minute and hit this deadline first.
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	b.insert(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r = <-claimInBackground(ctx, b.store, "owner-a")
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 2)
}

// With ConcurrentClaims, a claim never asks for the turn.
func TestMySQLStoreConcurrentClaimsSkipTheTurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insert(t, 3)
	store, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: outbox.TableForTest(b.store), ConcurrentClaims: true})
	require.NoError(t, err)
	outbox.SetClaimTurnWaitForTest(store, time.Minute)
	holdClaimTurn(t, b) // held for the whole test

	// A store that asked for the turn would wait a minute and hit this deadline first.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := <-claimInBackground(ctx, store, "owner-a")
	require.NoError(t, r.err)
	assert.Len(t, r.evs, 3)
}

// The turn is released whatever happens after it was taken: here the SELECT fails because
// the table is missing, and the lock must not stay with the connection in the pool.
func TestMySQLStoreBatchClaimReleasesTheTurnOnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	missing, err := outbox.NewMySQLStore(b.db, outbox.MySQLConfig{Table: testsvc.UniqueTable("missing")})
	require.NoError(t, err)
	_, _, err = claimDue(context.Background(), missing, "owner-a", 10, 1<<20)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not exist")
	assert.True(t, claimTurnFree(t, b.db, missing), "the failed claim released its turn")
}

// A claim whose context ends while it waits for the turn returns the context's error and
// leaves nothing behind: once the holder releases it, the lock is free.
func TestMySQLStoreBatchClaimCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	b := setup(t)
	outbox.SetClaimTurnWaitForTest(b.store, time.Minute)
	ids := b.insert(t, 2)
	release := holdClaimTurn(t, b)

	ctx, cancel := context.WithCancel(context.Background())
	done := claimInBackground(ctx, b.store, "owner-a")
	require.Eventually(t, func() bool { return waitingForTurn(t, b) }, 10*time.Second, 10*time.Millisecond)
	cancel()
	r := <-done
	require.ErrorIs(t, r.err, context.Canceled)
	assert.Empty(t, r.evs)
	release()
	require.Eventually(t, func() bool { return claimTurnFree(t, b.db, b.store) }, 10*time.Second, 20*time.Millisecond,
		"no session kept the lock")
	for _, id := range ids {
		assert.Equal(t, outbox.StatusWait, b.get(t, id).Status, "the cancelled claim claimed nothing")
	}
}
