package outbox

// TEMPORARY: a stand-in for the table statistics written on another branch, so that
// cmd/outboxctl compiles here. Delete this file when that branch is merged.

import (
	"context"
	"time"
)

// TableStats is a snapshot of an outbox table (placeholder).
type TableStats struct {
	Wait, Sending, Fail  int64
	Success              int64 // -1 unless CountSucceeded
	Due                  int64
	OldestDueAge         time.Duration
	OldestClaimAge       time.Duration
	SendingPastHalfLease int64
	FailByType           map[string]int64
}

// StatsOptions tunes [MySQLStore.Stats] (placeholder).
type StatsOptions struct {
	Lease          time.Duration
	CountSucceeded bool
}

// Stats reads a snapshot of the table (placeholder).
func (s *MySQLStore) Stats(ctx context.Context, opts StatsOptions) (TableStats, error) {
	st := TableStats{Success: -1, FailByType: map[string]int64{}}
	t := "`" + s.table + "`"
	for _, c := range []struct {
		status string
		n      *int64
	}{{"WAIT", &st.Wait}, {"SENDING", &st.Sending}, {"FAIL", &st.Fail}} {
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+t+" WHERE status = ?", c.status).Scan(c.n); err != nil {
			return st, s.wrap("stats", err)
		}
	}
	if opts.CountSucceeded {
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+t+" WHERE status = 'SUCCESS'").Scan(&st.Success); err != nil {
			return st, s.wrap("stats", err)
		}
	}
	var dueUS, claimUS int64
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*), COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, next_retry_time, UTC_TIMESTAMP(3))), 0) FROM "+t+
		" WHERE status = 'WAIT' AND next_retry_time <= UTC_TIMESTAMP(3)").Scan(&st.Due, &dueUS); err != nil {
		return st, s.wrap("stats", err)
	}
	st.OldestDueAge = time.Duration(dueUS) * time.Microsecond
	if err := s.db.QueryRowContext(ctx, "SELECT COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, claimed_at, UTC_TIMESTAMP(3))), 0), "+
		"COALESCE(SUM(claimed_at < DATE_SUB(UTC_TIMESTAMP(3), INTERVAL ? MICROSECOND)), 0) FROM "+t+" WHERE status = 'SENDING'",
		(opts.Lease/2).Microseconds()).Scan(&claimUS, &st.SendingPastHalfLease); err != nil {
		return st, s.wrap("stats", err)
	}
	st.OldestClaimAge = time.Duration(claimUS) * time.Microsecond
	rows, err := s.db.QueryContext(ctx, "SELECT event_type, COUNT(*) FROM "+t+" WHERE status = 'FAIL' GROUP BY event_type")
	if err != nil {
		return st, s.wrap("stats", err)
	}
	defer rows.Close()
	for rows.Next() {
		var typ string
		var n int64
		if err := rows.Scan(&typ, &n); err != nil {
			return st, s.wrap("stats", err)
		}
		st.FailByType[typ] = n
	}
	return st, s.wrap("stats", rows.Err())
}
