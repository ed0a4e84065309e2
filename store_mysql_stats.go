package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-outbox/outbox/internal/mysqldialect"
)

// TableStats is a snapshot of an outbox table, read by [MySQLStore.Stats]: what an operator
// looks at to see whether the publishers keep up, and what the publisher's gauges report.
type TableStats struct {
	// Wait, Sending and Fail count the rows in each status.
	Wait, Sending, Fail int64
	// Success counts the SUCCESS rows. It is -1 unless [StatsOptions.CountSucceeded] is set:
	// counting it reads the whole history of the table, which only grows.
	Success int64
	// Skipped counts the SKIPPED rows (dead letters a person chose not to send). Like
	// Success, it is history: -1 unless [StatsOptions.CountSucceeded] or
	// [StatsOptions.CountSkipped] is set.
	Skipped int64
	// Due counts the WAIT rows whose next_retry_time has passed: the backlog.
	Due int64
	// OldestDueAge is how long the oldest due WAIT row has been due, by the database clock:
	// the publish lag. Zero when nothing is due.
	OldestDueAge time.Duration
	// OldestClaimAge is the age of the oldest SENDING claim, by the database clock. Zero when
	// nothing is SENDING. Near the lease, its holder has died or stalled.
	OldestClaimAge time.Duration
	// SendingPastHalfLease counts the SENDING rows claimed more than [StatsOptions.Lease]/2
	// ago: sends that take far longer than they should, or instances that died holding
	// them. Zero when Lease is zero.
	SendingPastHalfLease int64
	// FailByType counts the FAIL rows (dead letters) by event type. Never nil.
	FailByType map[string]int64
	// SentPerMinute counts the events sent in each of the last 60 minutes, oldest first: the
	// last entry is the minute up to now, the first the one that began an hour ago. An event
	// counts in the minute its send began (its claim, or the binlog relay's mark), by the
	// database clock, once it is SUCCESS. nil unless [StatsOptions.SentPerMinute] is set.
	SentPerMinute []int64

	// RelayMode says who publishes the table, as the binlog relay's checkpoint row says:
	// "relay" (a relay leads) or "polling" (the publishers poll). "" when the store has no
	// [MySQLConfig.RelayTable], or no relay and no publisher has written the row yet. The
	// other Relay fields are zero then.
	RelayMode string
	// RelayLeader is the instance that took the table last: the leading relay, or in mode
	// polling the publisher that took it over from one.
	RelayLeader string
	// RelayEpoch is the fencing epoch: each takeover adds one.
	RelayEpoch int64
	// RelayPosition is the binlog position (a GTID set) up to which the relay has sent and
	// marked everything ("" before its first checkpoint).
	RelayPosition string
	// RelayHeartbeatAge is how long ago the relay last wrote its heartbeat, by the database
	// clock; RelayLive says a relay leads and its heartbeat is within its FallbackAfter,
	// past which the publishers take the table over. A relay's lag behind the commits is OldestDueAge: its
	// events stay WAIT until it has sent them.
	RelayHeartbeatAge time.Duration
	RelayLive         bool
}

// StatsOptions says what [MySQLStore.Stats] reads.
type StatsOptions struct {
	// Lease is the publishers' [Tuning.Lease], against which SendingPastHalfLease is judged.
	// Zero leaves SendingPastHalfLease at zero.
	Lease time.Duration
	// CountSucceeded counts the SUCCESS (and SKIPPED) rows too. Without it Stats reads no SUCCESS row at
	// all, however large the history; with it, it reads every one of them (from an index,
	// but still one entry per event ever sent and not purged).
	CountSucceeded bool
	// CountSkipped counts the SKIPPED rows without the SUCCESS ones: a range of
	// idx_status_next_retry of one entry per dead letter ever skipped and not purged, few
	// where the history is large.
	CountSkipped bool
	// SentPerMinute fills [TableStats.SentPerMinute]: it reads the idx_status_claimed_at
	// entries of the events sent in the last hour (one per event, none of the older
	// history).
	SentPerMinute bool
}

// Stats reads a snapshot of the table in one statement, each part of which is served by
// idx_status_next_retry or idx_status_claimed_at: it reads the index entries of the WAIT,
// SENDING and FAIL rows (and the FAIL rows themselves, for their event type), and none of
// the SUCCESS rows unless opts.CountSucceeded. Its cost grows with the backlog and the dead
// letters, not with the history. Every age is by the database clock.
func (s *MySQLStore) Stats(ctx context.Context, opts StatsOptions) (TableStats, error) {
	if opts.Lease < 0 {
		return TableStats{}, fmt.Errorf("outbox: stats: Lease must not be negative, got %s", opts.Lease)
	}
	st := TableStats{Success: -1, Skipped: -1, FailByType: map[string]int64{}}
	if opts.SentPerMinute {
		st.SentPerMinute = make([]int64, sentMinutes)
	}
	rows, err := s.db.QueryContext(ctx, s.statsQuery(opts.CountSucceeded, opts.CountSucceeded || opts.CountSkipped, opts.SentPerMinute), (opts.Lease / 2).Microseconds())
	if err != nil {
		return TableStats{}, s.wrap("stats", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			kind, eventType string
			n, us, past     int64
		)
		if err := rows.Scan(&kind, &eventType, &n, &us, &past); err != nil {
			return TableStats{}, s.wrap("stats", err)
		}
		switch kind {
		case "wait":
			st.Wait = n
		case "due":
			st.Due, st.OldestDueAge = n, time.Duration(max(us, 0))*time.Microsecond
		case "sending":
			st.Sending, st.OldestClaimAge = n, time.Duration(max(us, 0))*time.Microsecond
			if opts.Lease > 0 {
				st.SendingPastHalfLease = past
			}
		case "fail":
			st.Fail += n
			st.FailByType[eventType] = n
		case "success":
			st.Success = n
		case "skipped":
			st.Skipped = n
		case "sent": // us: whole minutes ago, 0 to 59
			st.SentPerMinute[sentMinutes-1-min(max(us, 0), sentMinutes-1)] += n
		}
	}
	if err := rows.Err(); err != nil {
		return TableStats{}, s.wrap("stats", err)
	}
	if err := s.relayStats(ctx, &st); err != nil {
		return TableStats{}, err
	}
	return st, nil
}

// sentMinutes is how many minutes TableStats.SentPerMinute covers.
const sentMinutes = 60

// relayStats reads the relay's checkpoint row into st, when the store has a RelayTable.
func (s *MySQLStore) relayStats(ctx context.Context, st *TableStats) error {
	if s.relay == nil {
		return nil
	}
	var us int64
	err := s.db.QueryRowContext(ctx, s.relay.stats, s.table).Scan(&st.RelayMode, &st.RelayLeader, &st.RelayEpoch,
		&st.RelayPosition, &us, &st.RelayLive)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case mysqldialect.Is(err, mysqldialect.ErrNoSuchTable):
		return fmt.Errorf("%w: MySQLConfig.RelayTable: %w (create it with relay.CreateSchema)", ErrInvalidConfig, err)
	case err != nil:
		return s.wrap("stats: read the relay's checkpoint row", err)
	}
	st.RelayHeartbeatAge = time.Duration(max(us, 0)) * time.Microsecond
	return nil
}

// statsQuery is the statement Stats runs: one SELECT per part, each a range of one status
// in an index whose first column is status, joined by UNION ALL so that they take one round
// trip and one consistent read. Its one parameter is half the lease, in microseconds.
func (s *MySQLStore) statsQuery(countSucceeded, countSkipped, sentPerMinute bool) string {
	q := `SELECT 'wait', '', COUNT(*), 0, 0 FROM t_event_record WHERE status = 'WAIT'
UNION ALL
SELECT 'due', '', COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(next_retry_time), UTC_TIMESTAMP(3)), 0), 0
	FROM t_event_record WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)
UNION ALL
SELECT 'sending', '', COUNT(*), COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(claimed_at), UTC_TIMESTAMP(3)), 0),
	COUNT(CASE WHEN claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND) THEN 1 END)
	FROM t_event_record WHERE status = 'SENDING'
UNION ALL
SELECT 'fail', event_type, COUNT(*), 0, 0 FROM t_event_record WHERE status = 'FAIL' GROUP BY event_type`
	if countSucceeded {
		q += `
UNION ALL
SELECT 'success', '', COUNT(*), 0, 0 FROM t_event_record WHERE status = 'SUCCESS'`
	}
	if countSkipped {
		q += `
UNION ALL
SELECT 'skipped', '', COUNT(*), 0, 0 FROM t_event_record WHERE status = 'SKIPPED'`
	}
	if sentPerMinute {
		// A range of idx_status_claimed_at: the SUCCESS entries claimed in the last hour,
		// read from the index alone, grouped by how many whole minutes ago.
		q += `
UNION ALL
SELECT 'sent', '', COUNT(*), TIMESTAMPDIFF(MINUTE, claimed_at, UTC_TIMESTAMP(3)), 0 FROM t_event_record
	WHERE status = 'SUCCESS' AND claimed_at > UTC_TIMESTAMP(3) - INTERVAL 60 MINUTE
	GROUP BY TIMESTAMPDIFF(MINUTE, claimed_at, UTC_TIMESTAMP(3))`
	}
	return strings.ReplaceAll(q, "t_event_record", mysqldialect.Quote(s.table))
}
