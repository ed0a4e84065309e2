// Package every runs the library's background upkeep (the publisher's reclaim and retention,
// the inbox consumer's retention) as one kind of loop: a run, then a fixed delay, so that
// runs never overlap and a slow run pushes the next one back rather than piling up.
package every

import (
	"context"
	"time"
)

// Loop runs fn at once, then waits the delay fn returned, and again, until ctx is done.
func Loop(ctx context.Context, fn func() time.Duration) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		timer.Reset(fn())
	}
}
