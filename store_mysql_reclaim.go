package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
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
				reason, reason, lease.Microseconds()); err != nil {
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

// RenewLease implements [Store]: one UPDATE by primary key, of the rows still the owner's.
func (s *MySQLStore) RenewLease(ctx context.Context, ids []int64, owner string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.exec(ctx, "renew leases", fmt.Sprintf(s.q.renewLease, idList(ids)), owner)
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

// Purge deletes SUCCESS events whose last update (their acknowledgement) is older than
// olderThan by the database clock, then SKIPPED events (dead letters a person skipped)
// last updated as long ago, and reports how many it deleted. Both are final, and done for
// per-key ordering, so a key's later events never wait for a purged row. WAIT, SENDING and
// FAIL rows are never deleted, however old. It deletes at most opts.BatchRows rows per statement,
// by primary key, with opts.Pause between statements, so that the table's writers barely
// notice it; it stops when no old row is left, at opts.Limit, or when ctx ends.
//
// On a table partitioned by RANGE (id) with a last partition VALUES LESS THAN MAXVALUE
// (see [MySQLConfig.PartitionIDs] and docs/retention.md) it maintains the partitions
// instead: it adds partitions ahead of the ids, drops each old partition whose rows are all
// SUCCESS or SKIPPED and older than olderThan, and deletes in batches only the old rows of
// the old partitions that hold an unsent row; it holds the purge lock for this whatever
// opts.Exclusive says.
//
// With opts.Exclusive it runs only if no other session is purging the table (see
// [PurgeOptions]), and returns [ErrPurgeBusy] otherwise. With opts.DryRun it deletes nothing
// and reports how many rows it would delete now.
func (s *MySQLStore) Purge(ctx context.Context, olderThan time.Duration, opts PurgeOptions) (int64, error) {
	if olderThan <= 0 {
		return 0, fmt.Errorf("%w: purge age must be positive, got %s", ErrInvalidInput, olderThan)
	}
	if olderThan > maxBackoffLimit*100 {
		return 0, fmt.Errorf("%w: purge age %s is beyond any row", ErrInvalidInput, olderThan)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return 0, err
	}
	l, err := s.readPartitions(ctx)
	if err != nil {
		return 0, err
	}
	if l.partitioned && l.problem() == "" {
		return s.purgePartitioned(ctx, olderThan, opts, l)
	}
	if opts.DryRun {
		return s.countPurgeable(ctx, olderThan, opts.Limit)
	}
	if opts.Exclusive {
		release, err := s.takePurgeLock(ctx)
		if err != nil {
			return 0, err
		}
		defer release()
	}
	return s.purgeRange(ctx, olderThan.Microseconds(), opts, 0, 0, 0)
}

// purgeRange deletes old SUCCESS, then SKIPPED rows in batches, as Purge says, with ids in
// [lo, hi) unless both are 0 (the whole table). done is what the purge removed before, for
// opts.Limit; it returns what this call deleted.
func (s *MySQLStore) purgeRange(ctx context.Context, age int64, opts PurgeOptions, done, lo, hi int64) (int64, error) {
	var total int64
	// One status at a time: each is one range of idx_status_claimed_at, read in order.
	for _, status := range []Status{StatusSuccess, StatusSkipped} {
		for {
			n := opts.BatchRows
			if opts.Limit > 0 {
				n = int(min(int64(n), opts.Limit-done-total))
			}
			if n <= 0 {
				return total, nil
			}
			var ids []int64
			var err error
			if lo == 0 && hi == 0 {
				ids, err = s.selectIDs(ctx, "purge", s.q.purgeCandidates, string(status), age, age, n)
			} else {
				ids, err = s.selectIDs(ctx, "purge", s.q.purgeCandidatesIn, string(status), age, age, lo, hi, n)
			}
			if err != nil {
				return total, err
			}
			if len(ids) == 0 {
				break
			}
			deleted, err := s.exec(ctx, "purge", fmt.Sprintf(s.q.purge, idList(ids)), age)
			if err != nil {
				return total, err
			}
			total += deleted
			if opts.OnBatch != nil {
				opts.OnBatch(deleted)
			}
			if opts.Limit > 0 && done+total >= opts.Limit {
				return total, nil
			}
			if len(ids) < n {
				break
			}
			if opts.Pause > 0 {
				if err := sleep(ctx, opts.Pause); err != nil {
					return total, err
				}
			}
		}
	}
	return total, nil
}

// takePurgeLock takes the table's purge lock on a connection of its own, without waiting,
// and returns the function that lets it go.
func (s *MySQLStore) takePurgeLock(ctx context.Context) (func(), error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, s.wrap("purge lock", err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, s.q.takePurgeLock).Scan(&got); err != nil {
		_ = conn.Close()
		return nil, s.wrap("purge lock", err)
	}
	if !got.Valid || got.Int64 != 1 {
		_ = conn.Close()
		return nil, ErrPurgeBusy
	}
	if s.purgeHook != nil {
		s.purgeHook(true)
	}
	return func() {
		if s.purgeHook != nil {
			s.purgeHook(false)
		}
		// A fresh context: the caller's may have ended, and the lock must go either way. If
		// the statement fails, closing the connection ends the session, which frees the lock.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(rctx, s.q.endPurgeLock); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
		_ = conn.Close()
	}, nil
}

// countPurgeable reports how many SUCCESS and SKIPPED rows a purge with olderThan would
// delete now, at most limit when positive. It counts through the same index as the purge.
func (s *MySQLStore) countPurgeable(ctx context.Context, olderThan time.Duration, limit int64) (int64, error) {
	age := olderThan.Microseconds()
	var n int64
	if err := s.db.QueryRowContext(ctx, s.q.countPurgeable, age, age).Scan(&n); err != nil {
		return 0, s.wrap("count purgeable events", err)
	}
	if limit > 0 {
		n = min(n, limit)
	}
	return n, nil
}
