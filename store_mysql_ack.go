package outbox

import (
	"context"
	"fmt"
	"time"
)

// MarkSuccessBatch implements [Store].
func (s *MySQLStore) MarkSuccessBatch(ctx context.Context, ids []int64, owner string) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	return s.exec(ctx, "mark success", fmt.Sprintf(s.q.markSuccessBatch, idList(ids)), owner)
}

// MarkSuccess implements [Store].
func (s *MySQLStore) MarkSuccess(ctx context.Context, id int64, owner string) (bool, error) {
	return s.execOne(ctx, "mark success", s.q.markSuccess, id, owner)
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
