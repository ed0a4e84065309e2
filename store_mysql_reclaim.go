package outbox

import (
	"context"
	"fmt"
	"time"
)

// ReclaimExpired implements [Store]. It works in pages of reclaimPage rows, so that no
// statement locks many rows at once.
func (s *MySQLStore) ReclaimExpired(ctx context.Context, lease time.Duration, maxReclaims int) (int64, []Event, error) {
	var (
		requeued int64
		dead     []Event
	)
	for {
		rows, err := s.expired(ctx, lease)
		if err != nil || len(rows) == 0 {
			return requeued, dead, err
		}
		var again, poison []int64
		for _, r := range rows {
			if maxReclaims != RetryForever && r.reclaims+1 >= maxReclaims {
				poison = append(poison, r.id)
			} else {
				again = append(again, r.id)
			}
		}
		if len(again) > 0 {
			n, err := s.exec(ctx, "reclaim expired leases", fmt.Sprintf(s.q.reclaim, idList(again)), lease.Microseconds())
			requeued += n
			// A reclaimed row keeps its next_retry_time, behind the claims' scan floor.
			s.floor.reset()
			if err != nil {
				return requeued, dead, err
			}
		}
		if len(poison) > 0 {
			reason := fmt.Sprintf("reclaimed %d times: each instance that claimed it died or stalled before recording an outcome (a poison event?)", maxReclaims)
			if _, err := s.exec(ctx, "dead-letter a reclaimed event", fmt.Sprintf(s.q.reclaimFail, idList(poison)),
				reason, lease.Microseconds()); err != nil {
				return requeued, dead, err
			}
			for _, id := range poison {
				ev, err := s.get(ctx, id)
				if err != nil {
					return requeued, dead, err
				}
				if ev.Status == StatusFail && ev.LastError == reason {
					dead = append(dead, ev)
				}
			}
		}
		if len(rows) < reclaimPage {
			return requeued, dead, nil
		}
	}
}

type expiredRow struct {
	id       int64
	reclaims int
}

func (s *MySQLStore) expired(ctx context.Context, lease time.Duration) ([]expiredRow, error) {
	rows, err := s.db.QueryContext(ctx, s.q.expired, lease.Microseconds(), reclaimPage)
	if err != nil {
		return nil, s.wrap("select expired leases", err)
	}
	defer rows.Close()
	var out []expiredRow
	for rows.Next() {
		var r expiredRow
		if err := rows.Scan(&r.id, &r.reclaims); err != nil {
			return nil, s.wrap("select expired leases", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("select expired leases", err)
	}
	return out, nil
}

// ReleaseOwned implements [Store], in pages of reclaimPage rows.
func (s *MySQLStore) ReleaseOwned(ctx context.Context, owner, reason string) (int64, error) {
	var total int64
	for {
		ids, err := s.ownedIDs(ctx, owner)
		if err != nil || len(ids) == 0 {
			return total, err
		}
		n, err := s.exec(ctx, "release owned events", fmt.Sprintf(s.q.releaseOwned, idList(ids)), truncateReason(reason), owner)
		total += n
		if err != nil || len(ids) < reclaimPage {
			return total, err
		}
	}
}

func (s *MySQLStore) ownedIDs(ctx context.Context, owner string) ([]int64, error) {
	return s.selectIDs(ctx, "select owned events", s.q.owned, owner, reclaimPage)
}
