package outbox_test

import (
	"context"
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
    mode ENUM('relay', 'polling') NOT NULL, leader VARCHAR(64) NOT NULL,
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
