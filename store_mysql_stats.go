package outbox

import (
	"context"
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
	// Success, it is history: -1 unless [StatsOptions.CountSucceeded] is set.
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
	rows, err := s.db.QueryContext(ctx, s.statsQuery(opts.CountSucceeded), (opts.Lease / 2).Microseconds())
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
		}
	}
	if err := rows.Err(); err != nil {
		return TableStats{}, s.wrap("stats", err)
	}
	return st, nil
}

// statsQuery is the statement Stats runs: one SELECT per part, each a range of one status
// in an index whose first column is status, joined by UNION ALL so that they take one round
// trip and one consistent read. Its one parameter is half the lease, in microseconds.
func (s *MySQLStore) statsQuery(countSucceeded bool) string {
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
SELECT 'success', '', COUNT(*), 0, 0 FROM t_event_record WHERE status = 'SUCCESS'
UNION ALL
SELECT 'skipped', '', COUNT(*), 0, 0 FROM t_event_record WHERE status = 'SKIPPED'`
	}
	return strings.ReplaceAll(q, "t_event_record", mysqldialect.Quote(s.table))
}
