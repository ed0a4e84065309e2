package every_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/go-outbox/outbox/internal/every"
)

// Runs come one after the other, never two at once, and the loop ends with its context.
func TestLoopRunsOneAtATimeUntilItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var runs, running int
	done := make(chan struct{})
	go func() {
		defer close(done)
		every.Loop(ctx, func() time.Duration {
			running++
			assert.Equal(t, 1, running, "runs overlap")
			runs++
			if runs == 3 {
				cancel()
			}
			running--
			return time.Millisecond
		})
	}()
	<-done
	assert.Equal(t, 3, runs, "no run after the context ended")
}
