package outbox

import "time"

// Backoff returns how long to wait before retry n, where n is 1 for the first retry. A
// negative result is taken as zero. The delay is added to the database's clock, not the
// application's.
type Backoff func(n int) time.Duration

// DefaultBackoff waits n² × 5 s before retry n: 5 s, 20 s, 45 s. When a downstream is
// struggling, retrying every few seconds only adds to its load.
func DefaultBackoff(n int) time.Duration {
	return time.Duration(n*n) * 5 * time.Second
}

// ConstantBackoff returns a [Backoff] that always waits d.
func ConstantBackoff(d time.Duration) Backoff {
	return func(int) time.Duration { return d }
}
