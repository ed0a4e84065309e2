package relay

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/go-outbox/outbox"
	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// checkpointDDL creates the checkpoint table; %s is its name.
//
// One row per relayed outbox table. epoch is the fencing token: every takeover (a relay's,
// or the polling publishers' when a relay's heartbeat is FallbackAfter old) adds one, and
// every write of a leader is conditional on the epoch it took, so a deposed leader's writes
// change nothing. mode says who publishes: 'relay' (the leader, while heartbeat_at is
// fresh) or 'polling'. gtid is the binlog position up to which everything is sent and
// marked (” when there is none to resume from). Times are the database's, in UTC.
const checkpointDDL = `CREATE TABLE IF NOT EXISTS %s (
    outbox_table      VARCHAR(64)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    epoch             BIGINT        NOT NULL,
    mode              ENUM('relay', 'polling') NOT NULL,
    leader            VARCHAR(64)   NOT NULL,
    gtid              VARCHAR(4096) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    fallback_after_ms BIGINT        NOT NULL,
    heartbeat_at      DATETIME(3)   NOT NULL,
    updated_at        DATETIME(3)   NOT NULL,
    PRIMARY KEY (outbox_table)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`

// CreateSchema creates the checkpoint table named by cfg.CheckpointTable (default
// t_outbox_relay) if it does not exist. The outbox table is the store's
// ([outbox.MySQLStore.CreateSchema]).
func CreateSchema(ctx context.Context, db *sql.DB, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf(checkpointDDL, mysqldialect.Quote(cfg.CheckpointTable))); err != nil {
		return fmt.Errorf("relay: create %s: %w", cfg.CheckpointTable, err)
	}
	return nil
}

// checkTables checks that both tables exist and have the columns the relay reads.
func (r *Relay) checkTables(ctx context.Context) error {
	for _, t := range []struct {
		name, fix string
		cols      []string
	}{
		{r.cfg.Table, "create it with outbox.MySQLStore.CreateSchema or schema.sql",
			mysqldialect.OutboxColumns()},
		{r.cfg.CheckpointTable, "create it with relay.CreateSchema",
			[]string{"outbox_table", "epoch", "mode", "leader", "gtid", "fallback_after_ms", "heartbeat_at"}},
	} {
		rows, err := r.db.QueryContext(ctx, "SELECT * FROM "+mysqldialect.Quote(t.name)+" LIMIT 0")
		if mysqldialect.Is(err, mysqldialect.ErrNoSuchTable) {
			return fmt.Errorf("%w: relay: table %s.%s does not exist: %s", outbox.ErrInvalidConfig, r.conn.DBName, t.name, t.fix)
		}
		if err != nil {
			return fmt.Errorf("relay: read %s: %w", t.name, err)
		}
		cols, err := rows.Columns()
		rows.Close()
		if err != nil {
			return fmt.Errorf("relay: read %s: %w", t.name, err)
		}
		have := map[string]bool{}
		for _, c := range cols {
			have[strings.ToLower(c)] = true
		}
		for _, c := range t.cols {
			if !have[c] && c == "topic" && t.name == r.cfg.Table {
				return fmt.Errorf("%w: relay: table %s has no column topic (it was created by an earlier version): run: %s; (an instant change; see docs/upgrading.md)",
					outbox.ErrInvalidConfig, t.name, mysqldialect.AddTopicColumn(t.name))
			}
			if !have[c] {
				fix := t.fix
				if c == mysqldialect.FailuresColumn {
					fix = "it was created by an earlier version; add it, an instant change (docs/upgrading.md): " +
						mysqldialect.AddFailuresColumn(t.name)
				}
				return fmt.Errorf("%w: relay: table %s has no column %s: %s", outbox.ErrInvalidConfig, t.name, c, fix)
			}
		}
	}
	return nil
}

// queries are the relay's statements for its tables.
type queries struct {
	// takeover
	lockRow, insertRow, takeRow string
	// the leader's fenced writes
	checkpoint, markSuccess, retry, fail, giveBack string
	// reads
	waitingIDs, eventsByID, keyWaiting, failedKeys, statusByID string
	// a dead letter's failure history, for OnDeadLetter
	failuresOf string
}

// routeTopic is the row's topic with the routes applied (mysqldialect.RouteTopic): the
// marks and the dead letter write it last in their SET lists, so that a row written
// without a topic has the one it was sent to; its values follow the SET list's others.
func newQueries(table, cp, routeTopic string) queries {
	table, cp = mysqldialect.Quote(table), mysqldialect.Quote(cp)
	// The event's columns, then how long until it is due by the database clock (µs).
	cols := "id, event_id, biz_no, event_type, payload, retry_count, next_retry_time, create_time, trace_parent, trace_state, topic, " +
		"TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), next_retry_time)"
	// fence joins the checkpoint row of the table at the leader's epoch: a statement with it
	// changes nothing once another relay or the pollers took the table over. The writes
	// find their rows by primary key (FORCE INDEX): by the status index, their locks would
	// cover the gaps where the writers insert new WAIT rows.
	fence := " JOIN " + cp + " f ON f.outbox_table = ? AND f.epoch = ? AND f.mode = 'relay'"
	return queries{
		lockRow: "SELECT epoch, mode, gtid FROM " + cp + " WHERE outbox_table = ? FOR UPDATE",
		insertRow: "INSERT IGNORE INTO " + cp + " (outbox_table, epoch, mode, leader, gtid, fallback_after_ms, heartbeat_at, updated_at) " +
			"VALUES (?, 0, 'polling', ?, '', ?, UTC_TIMESTAMP(3), UTC_TIMESTAMP(3))",
		takeRow: "UPDATE " + cp + " SET epoch = epoch + 1, mode = 'relay', leader = ?, gtid = ?, fallback_after_ms = ?, " +
			"heartbeat_at = UTC_TIMESTAMP(3), updated_at = UTC_TIMESTAMP(3) WHERE outbox_table = ?",
		checkpoint: "UPDATE " + cp + " SET gtid = ?, heartbeat_at = UTC_TIMESTAMP(3), updated_at = UTC_TIMESTAMP(3) " +
			"WHERE outbox_table = ? AND epoch = ? AND mode = 'relay'",
		giveBack: "UPDATE " + cp + " SET mode = 'polling', epoch = epoch + 1, updated_at = UTC_TIMESTAMP(3) " +
			"WHERE outbox_table = ? AND epoch = ? AND mode = 'relay'",
		markSuccess: "UPDATE " + table + " t FORCE INDEX (PRIMARY)" + fence + " SET t.status = 'SUCCESS', t.claim_owner = ?, " +
			"t.claimed_at = UTC_TIMESTAMP(3), t.update_time = UTC_TIMESTAMP(3), t.topic = " + routeTopic + " WHERE t.status = 'WAIT' AND t.id IN (%s)",
		// A failure goes to the row's history (the failures column) in the statement that
		// records it, first in the SET list: its placeholders (the instance, the class, the
		// message) come after the fence's.
		retry: "UPDATE " + table + " t FORCE INDEX (PRIMARY)" + fence + " SET " + failureEntry + ", t.retry_count = ?, t.last_error = LEFT(?, 1024), " +
			"t.next_retry_time = UTC_TIMESTAMP(3) + INTERVAL ? MICROSECOND, t.update_time = UTC_TIMESTAMP(3) " +
			"WHERE t.status = 'WAIT' AND t.id = ?",
		fail: "UPDATE " + table + " t FORCE INDEX (PRIMARY)" + fence + " SET " + failureEntry + ", t.status = 'FAIL', t.retry_count = ?, t.last_error = LEFT(?, 1024), " +
			"t.claim_owner = ?, t.claimed_at = UTC_TIMESTAMP(3), t.update_time = UTC_TIMESTAMP(3), t.topic = " + routeTopic + " WHERE t.status = 'WAIT' AND t.id = ?",
		waitingIDs: "SELECT id FROM " + table + " WHERE status = 'WAIT'",
		eventsByID: "SELECT " + cols + " FROM " + table + " WHERE status = 'WAIT' AND id IN (%s) ORDER BY id",
		keyWaiting: "SELECT " + cols + " FROM " + table + " WHERE status = 'WAIT' AND biz_no = ? ORDER BY id",
		failedKeys: "SELECT DISTINCT biz_no FROM " + table + " WHERE status = 'FAIL'",
		statusByID: "SELECT id FROM " + table + " WHERE status = 'WAIT' AND id IN (%s)",
		failuresOf: "SELECT " + mysqldialect.FailuresColumn + " FROM " + table + " WHERE id = ?",
	}
}

// failureEntry appends a failure to the row's history: the instance, the class and the
// message are placeholders.
var failureEntry = mysqldialect.AppendFailure("t."+mysqldialect.FailuresColumn, "?", "?", "?")

// placeholders returns "?, ?, ..." for n values.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
