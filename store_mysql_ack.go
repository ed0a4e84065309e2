package outbox

import (
	"context"
	"fmt"
	"time"
)

// MarkSuccess implements [Store].
func (s *MySQLStore) MarkSuccess(ctx context.Context, ids []int64, owner string) (int64, error) {
	switch len(ids) {
	case 0:
		return 0, nil
	case 1:
		return s.exec(ctx, "mark success", s.q.markSuccess, ids[0], owner)
	}
	return s.exec(ctx, "mark success", fmt.Sprintf(s.q.markSuccessBatch, idList(ids)), owner)
}

// ReleaseForRetry implements [Store].
func (s *MySQLStore) ReleaseForRetry(ctx context.Context, id int64, owner string, retryCount int, delay time.Duration, reason string) (bool, error) {
	return s.execOne(ctx, "release for retry", s.q.release,
		retryCount, delay.Microseconds(), truncateReason(reason), id, owner)
}

// MarkFail implements [Store].
func (s *MySQLStore) MarkFail(ctx context.Context, id int64, owner string, retryCount int, reason string) (bool, error) {
	return s.execOne(ctx, "mark fail", s.q.markFail, retryCount, truncateReason(reason), id, owner)
}
