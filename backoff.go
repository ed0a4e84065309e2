package outbox

import (
	"cmp"
	"math"
	"time"
)

// DefaultBackoff waits n² × 5 s before retry n: 5 s, 20 s, 45 s. When a downstream is
// struggling, retrying every few seconds only adds to its load. For large n (with
// [RetryForever]) it grows no further than the longest Duration instead of overflowing.
func DefaultBackoff(n int) time.Duration {
	const most = math.MaxInt64 / int64(5*time.Second)
	if n <= 0 {
		return 0
	}
	if int64(n) > 3_000_000_000 || int64(n)*int64(n) > most { // n*n itself would overflow past 3e9
		return math.MaxInt64
	}
	return time.Duration(n*n) * 5 * time.Second
}

// backoffDelay is b's delay before retry n, kept between zero and limit.
func backoffDelay(b func(n int) time.Duration, n int, limit time.Duration) time.Duration {
	return min(max(b(n), 0), limit)
}

// RetryPolicy is the one rule of what a failed send leads to, which the [Publisher] and the
// binlog relay both follow: a retry after a backoff, or a dead letter. Its fields mean what
// the publisher's [Config.MaxAttempts], [Config.Backoff] and [Tuning.MaxBackoff] mean; zero
// ones take their defaults (4 attempts, [DefaultBackoff], 1 hour).
type RetryPolicy struct {
	MaxAttempts int
	Backoff     func(n int) time.Duration
	MaxBackoff  time.Duration
}

// Next returns what the attempt-th failed attempt (1 for the first) of an event leads to:
// a dead letter (dead) when the error is [Permanent] or attempt has reached MaxAttempts
// ([RetryForever] never does), else a retry after delay, Backoff(attempt) kept between
// zero and MaxBackoff, added to the database's clock.
func (r RetryPolicy) Next(attempt int, cause error) (delay time.Duration, dead bool) {
	maxAttempts := cmp.Or(r.MaxAttempts, maxAttemptsDefault)
	if IsPermanent(cause) || (maxAttempts != RetryForever && attempt >= maxAttempts) {
		return 0, true
	}
	b := r.Backoff
	if b == nil {
		b = DefaultBackoff
	}
	return backoffDelay(b, attempt, cmp.Or(r.MaxBackoff, maxBackoffDefault)), false
}
