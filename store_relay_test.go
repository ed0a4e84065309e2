package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/testsvc"
)

// relayRowDDL is the columns of a binlog relay's checkpoint table that the store reads and
// writes (module relay's CreateSchema makes the whole table).
const relayRowDDL = `CREATE TABLE %s (
    outbox_table VARCHAR(64) NOT NULL PRIMARY KEY, epoch BIGINT NOT NULL,
    mode ENUM('relay', 'polling') NOT NULL, leader VARCHAR(64) NOT NULL, gtid VARCHAR(4096) NOT NULL DEFAULT '',
    fallback_after_ms BIGINT NOT NULL, heartbeat_at DATETIME(3) NOT NULL, updated_at DATETIME(3) NOT NULL)`

func TestRelayTableIsValidated(t *testing.T) {
	t.Parallel()
	db := testsvc.OpenDB(t)
	for _, name := range []string{"bad-name", "t_event_record", "x;DROP"} {
		_, err := outbox.NewMySQLStore(db, outbox.MySQLConfig{RelayTable: name})
		require.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
		assert.Contains(t, err.Error(), "RelayTable")
	}
	// A table that does not exist is reported when the publisher starts, with the fix.
	table := testsvc.UniqueTable("t_relayed")
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, RelayTable: table + "_missing"})
	_, err := store.Check(context.Background())
	require.ErrorIs(t, err, outbox.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "relay.CreateSchema")
}

// While the checkpoint row says a relay leads with a fresh heartbeat, a claim records the
// round's successes and claims nothing; once the heartbeat is older than the relay's
// fallback, the claim takes the table over (mode polling, one more epoch, which fences the
// relay's writes) and claims.
func TestClaimsStandByWhileARelayLeads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_relayed")
	cp := table + "_cp"
	_, err := db.Exec(fmt.Sprintf(relayRowDDL, cp))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + cp) })
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, RelayTable: cp})
	b := &bundle{db: db, store: store}
	_, err = store.Check(ctx)
	require.NoError(t, err)

	// No row: no relay ever took the table; the claims go on, and the first makes the row
	// (mode polling), for a relay's takeover to lock.
	first := b.insertPayload(t, "K-1", []byte(`{}`))
	res, err := store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "p1", Limit: 10, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	var epoch int64
	var mode, leader string
	require.NoError(t, db.QueryRow("SELECT epoch, mode, leader FROM "+cp+" WHERE outbox_table = ?", table).Scan(&epoch, &mode, &leader))
	assert.Equal(t, int64(0), epoch)
	assert.Equal(t, "polling", mode)

	// A relay takes the table over (as relay.Relay does: one more epoch, mode relay).
	_, err = db.Exec("UPDATE "+cp+" SET epoch = 7, mode = 'relay', leader = 'relay-1', fallback_after_ms = 60000, heartbeat_at = UTC_TIMESTAMP(3) WHERE outbox_table = ?", table)
	require.NoError(t, err)
	second := b.insertPayload(t, "K-2", []byte(`{}`))
	res, err = store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "p1", Limit: 10, MaxBytes: 1 << 20, Succeeded: []int64{first}})
	require.NoError(t, err)
	assert.Empty(t, res.Events, "a relay leads: nothing is claimed")
	assert.Equal(t, int64(1), res.Succeeded, "the round's success is recorded all the same")
	assert.Equal(t, outbox.StatusSuccess, b.get(t, first).Status)
	assert.Equal(t, outbox.StatusWait, b.get(t, second).Status)
	cands, err := store.Candidates(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, cands, "the per-row claims stand by too")

	// The relay falls silent: its heartbeat is older than its fallback (60 s).
	_, err = db.Exec("UPDATE "+cp+" SET heartbeat_at = UTC_TIMESTAMP(3) - INTERVAL 61 SECOND WHERE outbox_table = ?", table)
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond) // past the time a claim spares the read after finding a relay leading
	res, err = store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "p1", Limit: 10, MaxBytes: 1 << 20})
	require.NoError(t, err)
	require.Len(t, res.Events, 1)
	assert.Equal(t, second, res.Events[0].ID)
	require.NoError(t, db.QueryRow("SELECT epoch, mode, leader FROM "+cp+" WHERE outbox_table = ?", table).Scan(&epoch, &mode, &leader))
	assert.Equal(t, int64(8), epoch, "the takeover fences the silent relay")
	assert.Equal(t, "polling", mode)
	assert.Equal(t, "p1", leader)
}

// Stats reports who publishes a relayed table, from the checkpoint row: nothing before the
// row exists, then the publishers' mode, then the leading relay with its position and
// heartbeat, and a relay whose heartbeat is older than its fallback as not live.
func TestStatsReportsTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.OpenDB(t)
	table := testsvc.UniqueTable("t_relayed")
	cp := table + "_cp"
	_, err := db.Exec(fmt.Sprintf(relayRowDDL, cp))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + cp) })
	store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, RelayTable: cp})

	st, err := store.Stats(ctx, outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Empty(t, st.RelayMode, "no row yet")

	_, err = store.ClaimDue(ctx, outbox.ClaimRequest{Owner: "p1", Limit: 10, MaxBytes: 1 << 20}) // makes the row
	require.NoError(t, err)
	st, err = store.Stats(ctx, outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Equal(t, "polling", st.RelayMode)
	assert.False(t, st.RelayLive, "no relay leads")

	_, err = db.Exec("UPDATE "+cp+" SET epoch = 7, mode = 'relay', leader = 'relay-1', gtid = '0-1-42', fallback_after_ms = 60000, "+
		"heartbeat_at = UTC_TIMESTAMP(3) - INTERVAL 5 SECOND WHERE outbox_table = ?", table)
	require.NoError(t, err)
	st, err = store.Stats(ctx, outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Equal(t, "relay", st.RelayMode)
	assert.Equal(t, "relay-1", st.RelayLeader)
	assert.Equal(t, int64(7), st.RelayEpoch)
	assert.Equal(t, "0-1-42", st.RelayPosition)
	assert.True(t, st.RelayLive)
	assert.GreaterOrEqual(t, st.RelayHeartbeatAge, 5*time.Second)
	assert.Less(t, st.RelayHeartbeatAge, 60*time.Second)

	_, err = db.Exec("UPDATE "+cp+" SET heartbeat_at = UTC_TIMESTAMP(3) - INTERVAL 61 SECOND WHERE outbox_table = ?", table)
	require.NoError(t, err)
	st, err = store.Stats(ctx, outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Equal(t, "relay", st.RelayMode)
	assert.False(t, st.RelayLive, "its heartbeat is older than its fallback")
	assert.GreaterOrEqual(t, st.RelayHeartbeatAge, 61*time.Second)

	// A store without a RelayTable reports none.
	plain := testsvc.NewStoreOn(t, db, table)
	st, err = plain.Stats(ctx, outbox.StatsOptions{})
	require.NoError(t, err)
	assert.Empty(t, st.RelayMode)
}

// A per-row claim is fenced like a batch claim: one that starts after a relay took the table
// over claims nothing (its candidates were read while the publishers polled), and a takeover
// waits for a claim in flight, or the claim, once it goes on, claims nothing. In both
// orderings, so in key order too.
func TestRelayTakeoverFencesPerRowClaims(t *testing.T) {
	t.Parallel()
	for _, ordering := range []outbox.Ordering{outbox.Unordered, outbox.KeyOrder} {
		t.Run(ordering.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testsvc.OpenDB(t)
			table := testsvc.UniqueTable("t_relayed")
			cp := table + "_cp"
			_, err := db.Exec(fmt.Sprintf(relayRowDDL, cp))
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + cp) })
			store := testsvc.NewStore(t, db, outbox.MySQLConfig{Table: table, RelayTable: cp, Ordering: ordering})
			b := &bundle{db: db, store: store}
			takeOver := func(tx *sql.Tx) error {
				if _, err := tx.Exec("SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
					return err
				}
				var epoch int64
				if err := tx.QueryRow("SELECT epoch FROM "+cp+" WHERE outbox_table = ? FOR UPDATE", table).Scan(&epoch); err != nil {
					return err
				}
				_, err := tx.Exec("UPDATE "+cp+" SET epoch = epoch + 1, mode = 'relay', leader = 'relay-1', fallback_after_ms = 60000, "+
					"heartbeat_at = UTC_TIMESTAMP(3) WHERE outbox_table = ?", table)
				return err
			}

			// Candidates read while the publishers poll; the relay takes over before the claims.
			b.insertPayload(t, "K-1", []byte(`{}`))
			b.insertPayload(t, "K-2", []byte(`{}`))
			cands, err := store.Candidates(ctx, 10)
			require.NoError(t, err)
			require.Len(t, cands, 2)
			tx, err := db.Begin()
			require.NoError(t, err)
			require.NoError(t, takeOver(tx))
			require.NoError(t, tx.Commit())
			ok, err := store.Claim(ctx, cands[0], "p1")
			require.NoError(t, err)
			assert.False(t, ok, "a per-row claim after the takeover claims nothing")
			assert.Equal(t, outbox.StatusWait, b.get(t, cands[0].ID).Status)

			// Back to polling; a claim waits on its row (another session holds it) while a
			// relay tries to take over.
			_, err = db.Exec("UPDATE "+cp+" SET mode = 'polling', epoch = epoch + 1 WHERE outbox_table = ?", table)
			require.NoError(t, err)
			holder, err := db.Begin()
			require.NoError(t, err)
			t.Cleanup(func() { _ = holder.Rollback() })
			_, err = holder.Exec("SELECT id FROM `"+table+"` WHERE id = ? FOR UPDATE", cands[1].ID)
			require.NoError(t, err)
			claimed := make(chan bool, 1)
			claimCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			t.Cleanup(cancel)
			go func() {
				ok, err := store.Claim(claimCtx, cands[1], "p1")
				assert.NoError(t, err)
				claimed <- ok
			}()
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, db.QueryRow("SELECT COUNT(*) FROM information_schema.processlist WHERE info LIKE 'UPDATE `"+table+"`%' AND state <> ''").Scan(&n))
				return n > 0
			}, 10*time.Second, 10*time.Millisecond, "the claim waits on its row")
			tx, err = db.Begin()
			require.NoError(t, err)
			tookOver := takeOver(tx) == nil
			if tookOver {
				require.NoError(t, tx.Commit())
			} else {
				_ = tx.Rollback() // the takeover waited for the claim in flight
			}
			require.NoError(t, holder.Rollback())
			ok = <-claimed
			if tookOver {
				assert.False(t, ok, "the relay took the table over while the claim waited: the claim claims nothing")
			} else {
				assert.True(t, ok, "the takeover waited for the claim")
			}
		})
	}
}
